#!/usr/bin/env bash
# Builds (or brings up to date) the environment the MXNet plugin is tested in, and prints
# its python on the last line of stdout:
#
#   py=$(bash tests/envs/mxnet.sh | tail -n 1) && "$py" -m pytest tests/mxnet
#
# MXNet 1.9.1 needs numpy < 1.24, which the main environment does not have, so it lives in
# its own virtual environment, .venv-mxnet at the repository root (git ignores .venv*/).
# numpy 1.23 has wheels up to CPython 3.11, so the venv uses python3.11 (or $MXNET_PYTHON).
#
# Idempotent and quick when nothing changed: the packages are installed again only when
# the pinned list below changes, fastps only when its sources changed (hash stamp files in
# the venv). Everything but the last line goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
VENV=${FASTPS_MXNET_VENV:-$ROOT/.venv-mxnet}

REQUIREMENTS=(
  "mxnet==1.9.1"
  "numpy==1.23.5"           # MXNet 1.9.1 breaks with numpy >= 1.24 (np.bool etc.)
  "scikit-learn==1.7.2"     # newest scikit-learn that still accepts numpy 1.23
  "pytest>=7" "pytest-timeout>=2.1"
  "click>=8.0"
  "scikit-build-core>=1.1" "pybind11>=2.11" "cmake>=3.18" "ninja"   # to build fastps
)

log() { echo "mxnet env: $*" >&2; }

pick_python() {
  if [ -n "${MXNET_PYTHON:-}" ]; then echo "$MXNET_PYTHON"; return; fi
  for cand in python3.11 python3.10 python3.9 python3; do
    if command -v "$cand" >/dev/null 2>&1 &&
       "$cand" -c 'import sys; sys.exit(not ((3, 8) <= sys.version_info[:2] <= (3, 11)))'; then
      echo "$cand"; return
    fi
  done
  log "no Python 3.8-3.11 found (numpy<1.24, needed by MXNet 1.9.1, has no wheels for newer)"
  exit 1
}

if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import sys' 2>/dev/null; then
  PY=$(pick_python)
  log "creating $VENV with $PY ($("$PY" --version 2>&1))"
  rm -rf "$VENV"
  "$PY" -m venv "$VENV" >&2
fi
VPY="$VENV/bin/python"

req_hash=$(printf '%s\n' "${REQUIREMENTS[@]}" | sha256sum | cut -d' ' -f1)
if [ "$(cat "$VENV/.fastps-requirements" 2>/dev/null || true)" != "$req_hash" ]; then
  log "installing ${REQUIREMENTS[*]}"
  "$VPY" -m pip install -q --disable-pip-version-check --upgrade pip >&2
  "$VPY" -m pip install -q --disable-pip-version-check "${REQUIREMENTS[@]}" >&2
  echo "$req_hash" > "$VENV/.fastps-requirements"
fi

# fastps itself, rebuilt when its sources change.
src_hash=$(
  find core csrc plugins/mxnet setup.py pyproject.toml CMakeLists.txt -type f \
    \( -name '*.py' -o -name '*.cc' -o -name '*.h' -o -name '*.toml' -o -name '*.txt' \) \
    -not -path '*/__pycache__/*' -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1
)
if [ "$(cat "$VENV/.fastps-source" 2>/dev/null || true)" != "$src_hash" ] ||
   ! "$VPY" -c 'import fastps._core, fastps.mxnet' >/dev/null 2>&1; then
  log "installing fastps from $ROOT"
  "$VPY" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps \
    --force-reinstall "$ROOT" >&2
  echo "$src_hash" > "$VENV/.fastps-source"
fi

# MXNet must import and run an operator on this interpreter.
"$VPY" - >&2 <<'EOF'
import warnings
warnings.simplefilter("ignore")
import mxnet as mx
import numpy as np
import sklearn
import fastps.mxnet  # noqa: F401
assert (mx.nd.ones((2, 2)) * 3).asnumpy().sum() == 12
print(f"mxnet env: mxnet {mx.__version__}, numpy {np.__version__}, "
      f"scikit-learn {sklearn.__version__}: ok")
EOF
echo "$VPY"
