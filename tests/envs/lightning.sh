#!/usr/bin/env bash
# Adds Lightning to the main interpreter ($PYTHON, default python3) for the Lightning tier
# (tests/ecosystem/lightning) and prints that interpreter on the last line of stdout
# (progress goes to stderr):
#
#   py=$(bash tests/envs/lightning.sh | tail -n 1) && "$py" -m pytest tests/ecosystem/lightning
#
# lightning 2.6.6 (pure Python; supports torch >= 2.1, tested here with 2.13.0) is installed
# with every package already there pinned to its version (pip constraints), so torch stays
# the CPU build the rest of the suite uses. Quick and does nothing when already installed.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
SPECS=("lightning==2.6.6")
TEST_DEPS=(pytest pytest-timeout scikit-learn psutil)

say() { echo "lightning env: $*" >&2; }

usable() {
  "$PY" - >/dev/null 2>&1 <<'PYEOF'
import lightning
assert lightning.__version__ == "2.6.6", lightning.__version__
import fastps._core, fastps.torch.lightning  # noqa: F401
import pytest, sklearn, psutil  # noqa: F401
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
    | grep -v -i -E '^(fastps|lightning|pytorch-lightning)==' > "$constraints" || true
  "$PY" -m pip install -q --disable-pip-version-check -c "$constraints" "${SPECS[@]}" \
    "${TEST_DEPS[@]}" >&2 || say "pip could not install them"
fi
if ! usable; then
  say "Lightning is not usable in $PY:"
  "$PY" -c "import lightning, fastps.torch.lightning" >&2 || true
  exit 1
fi
"$PY" -c 'import sys; print(sys.executable)'
