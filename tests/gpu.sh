#!/usr/bin/env bash
# The tests that need an NVIDIA GPU (they skip on CPU-only machines, CI's included): the
# Horovod API's CUDA staging (tests/torch/test_torch_training.py::test_cuda_tensors), the
# torch.distributed backend's collectives on CUDA tensors over every data path, DDP with
# the model on the GPU against gloo on CUDA (the comm hook too), and FSDP2 on a CUDA mesh
# against gloo on the CPU. Run it on a machine with PyTorch built for
# CUDA; it builds this checkout into the current interpreter unless fastps imports already.
# Usage: tests/gpu.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device')"
if ! "$PY" -c "import fastps._core" 2>/dev/null; then
  echo "== building fastps (editable) into $PY ($(date -u +%H:%M:%S))"
  "$PY" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps -e .
fi
echo "== GPU tests ($(date -u +%H:%M:%S))"
"$PY" -m pytest -q -p no:cacheprovider -rs --durations=10 \
  tests/torch/test_torch_training.py::test_cuda_tensors \
  tests/torch/backend/test_backend_ops.py::test_cuda_tensors \
  tests/torch/backend/test_ddp.py::test_ddp_on_cuda_matches_gloo_on_cuda \
  tests/torch/backend/test_fsdp.py::test_fsdp2_on_cuda "$@"
