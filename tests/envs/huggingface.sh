#!/usr/bin/env bash
# Adds transformers and accelerate to the main interpreter ($PYTHON, default python3) for
# the Hugging Face tier (tests/ecosystem/huggingface) and prints that interpreter on the last
# line of stdout (progress goes to stderr):
#
#   py=$(bash tests/envs/huggingface.sh | tail -n 1) && "$py" -m pytest tests/ecosystem/huggingface
#
# transformers 5.24.0 and accelerate 1.15.0 (both support torch 2.13.0 and Python 3.11) are
# installed with every package already there pinned to its version (pip constraints), so
# torch stays the CPU build the rest of the suite uses. The tests build their model from a
# BertConfig and never reach the model hub (HF_HUB_OFFLINE=1). Quick when already installed.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
SPECS=("transformers==5.24.0" "accelerate==1.15.0")
TEST_DEPS=(pytest pytest-timeout psutil)

say() { echo "huggingface env: $*" >&2; }

usable() {
  HF_HUB_OFFLINE=1 "$PY" - >/dev/null 2>&1 <<'PYEOF'
import accelerate, transformers
assert transformers.__version__ == "5.24.0", transformers.__version__
assert accelerate.__version__ == "1.15.0", accelerate.__version__
from transformers import BertForSequenceClassification, Trainer  # noqa: F401
import fastps._core, fastps.torch  # noqa: F401
import pytest, psutil  # noqa: F401
PYEOF
}

if usable; then
  "$PY" -c 'import sys; print(sys.executable)'
  exit 0
fi
if ! "$PY" -c "import fastps._core, fastps.torch" >/dev/null 2>&1; then
  say "installing fastps (editable) into $PY"
  "$PY" -m pip install -q --disable-pip-version-check \
    "scikit-build-core>=1.1" "pybind11>=2.11" cmake ninja numpy click >&2
  "$PY" -m pip install -q --disable-pip-version-check --no-build-isolation -e . >&2
fi
if ! usable; then
  say "adding ${SPECS[*]} to $PY (keeping every installed package at its version)"
  constraints=$(mktemp)
  trap 'rm -f "$constraints"' EXIT
  "$PY" -m pip list --format=freeze --disable-pip-version-check 2>/dev/null \
    | grep -v -i -E '^(fastps|transformers|accelerate)==' > "$constraints" || true
  "$PY" -m pip install -q --disable-pip-version-check -c "$constraints" "${SPECS[@]}" \
    "${TEST_DEPS[@]}" >&2 || say "pip could not install them"
fi
if ! usable; then
  say "transformers/accelerate are not usable in $PY:"
  HF_HUB_OFFLINE=1 "$PY" -c "import transformers, accelerate" >&2 || true
  exit 1
fi
"$PY" -c 'import sys; print(sys.executable)'
