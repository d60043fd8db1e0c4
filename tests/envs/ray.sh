#!/usr/bin/env bash
# Creates or updates the Python environment the Ray tests (tests/ecosystem/ray) run in, and
# prints its python executable on the last line of stdout (progress goes to stderr):
#
#   py=$(bash tests/envs/ray.sh | tail -n 1) && "$py" -m pytest -q tests/ecosystem/ray
#
# The main interpreter ($PYTHON, default python3) gets Ray with Ray Train (TorchTrainer)
# pinned, while every package already installed there keeps its version (pip runs with the
# installed versions as constraints: torch stays the CPU build the suite uses). Safe to run
# repeatedly; quick once installed.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
RAY_VERSION=2.60.0
RAY_SPEC="ray[train]==$RAY_VERSION"
TEST_DEPS=(pytest pytest-timeout scikit-learn)

say() { echo "ray env: $*" >&2; }
pip_q() { "$PY" -m pip install -q --disable-pip-version-check "$@" >&2; }

# Does $PY have this Ray with Ray Train, fastps, torch and the test tools?
usable() {
  "$PY" - "$RAY_VERSION" >/dev/null 2>&1 <<'PYEOF'
import sys
import ray, ray.train.torch  # noqa: F401
assert ray.__version__ == sys.argv[1], ray.__version__
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
  say "adding $RAY_SPEC to $PY (keeping every installed package at its version)"
  constraints=$(mktemp)
  trap 'rm -f "$constraints"' EXIT
  "$PY" -m pip list --format=freeze --disable-pip-version-check 2>/dev/null \
    | grep -v -i -E '^(fastps|ray)==' > "$constraints" || true
  pip_q -c "$constraints" "$RAY_SPEC" "${TEST_DEPS[@]}"
fi
if ! usable; then
  say "Ray is not usable in $PY:"
  "$PY" -c "import ray, ray.train.torch, fastps.torch" >&2 || true
  exit 1
fi
"$PY" -c 'import sys; print(sys.executable)'
