#!/usr/bin/env bash
# The emulated-rack benchmark suite, end to end on a fresh machine (root, Linux, 2+ cores):
#   docs/results/comm.csv + comm.png   communication: fastps vs Gloo vs MXNet KVStore
#   docs/results/train.csv + train.png training: fastps k=0/2 vs DDP-Gloo vs linear
# About 20-25 minutes on the 2-core dev box. Every run has a hard time bound.
#
# Usage: sudo benchmarks/run_rack_suite.sh [--quick]
#   --quick   a few minutes: ResNet-50 at 1/4 size, one training rate, fewer steps
# Environment: PYTHON (default python3), RACK_PREFIX (default fpsr), OUT_DIR
# (default docs/results).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
PREFIX=${RACK_PREFIX:-fpsr}
OUT_DIR=${OUT_DIR:-docs/results}
QUICK=0
[ "${1:-}" = "--quick" ] && QUICK=1

if [ "$(id -u)" -ne 0 ]; then
  echo "run_rack_suite: needs root (network namespaces and tc); run with sudo" >&2
  exit 1
fi

echo "== dependencies"
sh benchmarks/rack/setup_deps.sh
$PY -c "import matplotlib" 2>/dev/null ||
  $PY -m pip install -q --disable-pip-version-check matplotlib
$PY -c "import torch" 2>/dev/null ||
  $PY -m pip install -q --disable-pip-version-check torch==2.13.0
if ! $PY -c "import fastps._core" 2>/dev/null; then
  echo "== building fastps (C++ core), editable"
  $PY -m pip install -q --disable-pip-version-check "scikit-build-core>=1.1" \
    "pybind11>=2.11" cmake ninja numpy click
  $PY -m pip install -q --disable-pip-version-check --no-build-isolation -e .
fi
# The MXNet peer runs in its own venv, built by tests/envs/mxnet.sh when it exists;
# comm_rack.py finds it (or prints why MXNet is skipped).

if ! $PY -c "import sys; from benchmarks.rack import find_stale; sys.exit(bool(find_stale('$PREFIX')))"; then
  echo "run_rack_suite: a rack with prefix $PREFIX is up; tear it down with:" >&2
  echo "  $PY -m benchmarks.rack.cli down --prefix $PREFIX" >&2
  exit 1
fi

mkdir -p "$OUT_DIR"
start=$(date +%s)
status=0

if [ "$QUICK" = 1 ]; then
  COMM_ARGS=(--models resnet50 --scale 0.25 --iters 2 --warmup 1)
  TRAIN_ARGS=(--rates 1000 --steps 4 --warmup 1)
else
  COMM_ARGS=(--models resnet50 vgg16 --iters 3 --warmup 1)
  TRAIN_ARGS=(--rates 1000 2500 5000 --steps 6 --warmup 2)
fi

echo "== communication benchmark (n=4, k=0,1,2,4, 1 Gbit/s)"
timeout 1200 $PY -m benchmarks.comm_rack "${COMM_ARGS[@]}" --prefix "$PREFIX" \
  --out "$OUT_DIR/comm.csv" || status=1

echo "== training benchmark (n=4, k=0,2)"
timeout 1200 $PY -m benchmarks.train_rack "${TRAIN_ARGS[@]}" --prefix "$PREFIX" \
  --out "$OUT_DIR/train.csv" || status=1

echo "== plots"
$PY -m benchmarks.plot_rack --comm "$OUT_DIR/comm.csv" --train "$OUT_DIR/train.csv" \
  --out-dir "$OUT_DIR" || status=1

echo "== done in $(( $(date +%s) - start )) s (status $status)"
exit $status
