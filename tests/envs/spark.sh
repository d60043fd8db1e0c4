#!/usr/bin/env bash
# Creates or updates the Python environment the Spark tests (tests/ecosystem/spark) run in,
# and prints its python executable on the last line of stdout (progress goes to stderr):
#
#   py=$(bash tests/envs/spark.sh | tail -n 1) && "$py" -m pytest -q tests/ecosystem/spark
#
# Spark runs on a JVM: Java 17 from Debian (openjdk-17-jre-headless) is installed with
# apt-get only when no `java` is on PATH. The main interpreter ($PYTHON, default python3)
# gets PySpark pinned, while every package already installed there keeps its version (pip
# runs with the installed versions as constraints: torch stays the CPU build the suite uses).
# Safe to run repeatedly; quick once installed.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
SPARK_VERSION=4.1.4
# pandas and pyarrow: pyspark.sql's pandas conversions, which TorchDistributor imports.
SPARK_SPEC=("pyspark==$SPARK_VERSION" pandas pyarrow)
TEST_DEPS=(pytest pytest-timeout scikit-learn)

say() { echo "spark env: $*" >&2; }
pip_q() { "$PY" -m pip install -q --disable-pip-version-check "$@" >&2; }

if ! command -v java >/dev/null 2>&1; then
  say "no java on PATH: installing Debian's openjdk-17-jre-headless"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >&2
  apt-get install -y -q --no-install-recommends openjdk-17-jre-headless >&2
fi

# Does $PY have this PySpark with TorchDistributor, fastps, torch and the test tools?
usable() {
  "$PY" - "$SPARK_VERSION" >/dev/null 2>&1 <<'PYEOF'
import sys
import pyspark
from pyspark.ml.torch.distributor import TorchDistributor  # noqa: F401
assert pyspark.__version__ == sys.argv[1], pyspark.__version__
import torch, fastps._core, fastps.torch  # noqa: F401
import pytest, sklearn  # noqa: F401
PYEOF
}

if ! "$PY" -c "import fastps._core" >/dev/null 2>&1; then
  say "installing fastps (editable) into $PY"
  pip_q "scikit-build-core>=1.1" "pybind11>=2.11" cmake ninja numpy click
  pip_q --no-build-isolation -e .
fi

if ! usable; then
  say "adding ${SPARK_SPEC[*]} to $PY (keeping every installed package at its version)"
  constraints=$(mktemp)
  trap 'rm -f "$constraints"' EXIT
  "$PY" -m pip list --format=freeze --disable-pip-version-check 2>/dev/null \
    | grep -v -i -E '^(fastps|pyspark|py4j)==' > "$constraints" || true
  pip_q -c "$constraints" "${SPARK_SPEC[@]}" "${TEST_DEPS[@]}"
fi
if ! usable; then
  say "PySpark is not usable in $PY:"
  "$PY" -c "from pyspark.ml.torch.distributor import TorchDistributor; import fastps.torch" >&2 || true
  exit 1
fi
"$PY" -c 'import sys; print(sys.executable)'
