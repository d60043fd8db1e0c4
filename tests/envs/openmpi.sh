#!/usr/bin/env bash
# Makes Open MPI's mpirun available for the Open MPI tier (tests/ecosystem/openmpi) and prints
# the python to run those tests with on the last line of stdout (the main interpreter,
# $PYTHON, default python3; progress goes to stderr):
#
#   py=$(bash tests/envs/openmpi.sh | tail -n 1) && "$py" -m pytest -q tests/ecosystem/openmpi
#
# Debian's openmpi-bin (mpirun) is installed with apt-get (needs root) only when there is no
# mpirun on PATH. Nothing runs in the background: mpirun starts its ranks itself. Quick
# and does nothing when already installed.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}

say() { echo "openmpi env: $*" >&2; }

if ! command -v mpirun >/dev/null 2>&1; then
  say "no mpirun on PATH: installing Debian's openmpi-bin"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >&2
  apt-get install -y -q --no-install-recommends openmpi-bin >&2
fi
say "$(mpirun --version 2>/dev/null | head -n 1)"

if ! "$PY" -c "import fastps._core, fastps.torch, pytest, sklearn" >/dev/null 2>&1; then
  say "$PY lacks fastps (built), torch, pytest or scikit-learn: run tests/run.sh's setup first"
  exit 1
fi
"$PY" -c 'import sys; print(sys.executable)'
