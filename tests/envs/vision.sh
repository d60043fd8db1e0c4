#!/usr/bin/env bash
# Builds (or brings up to date) an environment with torch and a torchvision that loads beside
# it, for the tests that run torchvision models (Horovod's elastic synthetic benchmark,
# tests/integration/elastic/test_horovod_elastic.py), and prints its python on the last line of stdout:
#
#   export FASTPS_VISION_PYTHON=$(bash tests/envs/vision.sh | tail -n 1)
#   HOROVOD_CHECKOUT=/path/to/horovod python -m pytest tests/integration/elastic/test_horovod_elastic.py
#
# The main environment has torch 2.13.0, the CPU build; PyPI's torchvision wheels link
# CUDA's libraries and fail to import beside it ("operator torchvision::nms does not
# exist"). torch 2.14.1 with torchvision 0.29.1 (the CUDA builds, which run on the CPU) lie
# on this machine's disk for Python 3.11, so they live in their own virtual environment,
# .venv-vision at the repository root (git ignores .venv*/; no system site packages, so its
# torch is 2.14.1). It is 5.5 GB; installing it took 6.5 min on a loaded 2-core machine
# (2026-11-24), which is why tests/run.sh does not build it.
#
# Idempotent and quick when nothing changed: the packages are installed again only when the
# pinned list below changes, fastps only when its sources changed (hash stamp files in the
# venv). Everything but the last line goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
VENV=${FASTPS_VISION_VENV:-$ROOT/.venv-vision}

REQUIREMENTS=(
  "torch==2.14.1" "torchvision==0.29.1"
  "numpy>=1.21" "click>=8.0"
  "pytest>=7" "pytest-timeout>=2.1"
  "scikit-build-core>=1.1" "pybind11>=2.11" "cmake>=3.18" "ninja"   # to build fastps
)

log() { echo "vision env: $*" >&2; }

pick_python() {
  if [ -n "${VISION_PYTHON:-}" ]; then echo "$VISION_PYTHON"; return; fi
  for cand in python3.11 python3; do
    if command -v "$cand" >/dev/null 2>&1 &&
       "$cand" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      echo "$cand"; return
    fi
  done
  log "no Python 3.11 found (the torch 2.14.1 and torchvision 0.29.1 files on disk are for 3.11;"
  log "set VISION_PYTHON to another interpreter to download them instead)"
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
  log "installing ${REQUIREMENTS[*]} (torch and torchvision: 5.5 GB, minutes)"
  "$VPY" -m pip install -q --disable-pip-version-check "${REQUIREMENTS[@]}" >&2
  echo "$req_hash" > "$VENV/.fastps-requirements"
fi

# fastps itself (core and the torch plugin), rebuilt when its sources change.
src_hash=$(
  find core csrc plugins/torch setup.py pyproject.toml CMakeLists.txt -type f \
    \( -name '*.py' -o -name '*.cc' -o -name '*.h' -o -name '*.toml' -o -name '*.txt' \) \
    -not -path '*/__pycache__/*' -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1
)
if [ "$(cat "$VENV/.fastps-source" 2>/dev/null || true)" != "$src_hash" ] ||
   ! "$VPY" -c 'import fastps._core, fastps.torch' >/dev/null 2>&1; then
  log "installing fastps from $ROOT"
  "$VPY" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps \
    --force-reinstall "$ROOT" >&2
  echo "$src_hash" > "$VENV/.fastps-source"
fi

# torchvision must load beside this torch and run a model's step with fastps imported.
"$VPY" - >&2 <<'EOF'
import torch
import torchvision
from torchvision import models

import fastps.torch  # noqa: F401

net = models.squeezenet1_1()
net(torch.randn(1, 3, 64, 64)).sum().backward()
print(f"vision env: torch {torch.__version__}, torchvision {torchvision.__version__}: ok")
EOF
echo "$VPY"
