#!/usr/bin/env bash
# Sets up everything the test suite needs on a fresh machine and runs all of it: the unit
# tier first (tests/unit: no process, under a minute; a failure there is reported and the rest
# still runs), the C++ unit tests, lint and mypy, the other core tiers (tests/integration,
# tests/rack, tests/tools) and PyTorch's tests in this interpreter, then TensorFlow and MXNet in
# the environments their own scripts build (tests/envs/<framework>.sh prints its python).
# tests/README.md says which tier a test belongs to.
# Usage: tests/run.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# Each section's start time, so a slow CI run shows where its minutes went.
section() { echo "== $* ($(date -u +%H:%M:%S))"; }

section "installing build and test dependencies"
$PY -m pip install -q --disable-pip-version-check \
  "scikit-build-core>=1.1" "pybind11>=2.11" cmake ninja numpy click \
  pytest pytest-timeout pytest-xdist scikit-learn matplotlib "ruff==0.17.6" pyyaml mypy rich torch==2.13.0 \
  mock psutil cloudpickle  # the last three: Horovod's elastic scenarios (tests/integration/elastic/test_horovod_elastic.py)
# Editable, so the test workers import this checkout; scikit-build-core configures CMake in a
# fresh temporary directory each time, so nothing an earlier build left is trusted.
section "building fastps (C++ core), editable"
$PY -m pip install -q --disable-pip-version-check --no-build-isolation -e .

status=0
unit=0
section "unit tests (tests/unit)"
$PY -m pytest -q tests/unit "$@" || { unit=1; status=1; }
if [ $unit = 1 ]; then
  echo "unit tests failed (above); running the rest of the suite anyway" >&2
fi

# The MXNet environment is a virtual environment of its own (.venv-mxnet, which git and the
# linters ignore): building it changes nothing the next sections use, and it is mostly
# downloads and installs, so it is built in the background (at a lower priority) while the
# C++ tests, lint and mypy run, and waited for before the core tests, whose timings it must
# not disturb. Its output is shown at its tier.
bg=$(mktemp -d "${TMPDIR:-/tmp}/fastps-run-envs.XXXXXX")
mxnet_env_pid=""
mxnet_env_rc=0
stop_bg() {
  if [ -n "$mxnet_env_pid" ]; then kill "$mxnet_env_pid" 2>/dev/null || true; fi
  rm -rf "$bg"
}
trap stop_bg EXIT
if [ -f tests/envs/mxnet.sh ] && [ -d tests/mxnet ]; then
  section "mxnet environment: building in the background"
  nice -n 10 bash tests/envs/mxnet.sh >"$bg/mxnet.out" 2>"$bg/mxnet.err" &
  mxnet_env_pid=$!
fi

section "C++ unit tests (GoogleTest through ctest)"
tests/cpp/run.sh || status=1

section "style: ruff (lint, format) and clang-format"
tests/lint.sh || status=1

section "mypy (core/ and plugins/)"
$PY tests/typecheck.py || status=1
# Horovod's elastic PyTorch example needs torchvision, which loads only in its own 5.5 GB
# environment (tests/envs/vision.sh; over CI's budget to build): used when asked for
# (FASTPS_VISION=1) or when it was built already; otherwise that test skips.
if [ -z "${FASTPS_VISION_PYTHON:-}" ] && { [ "${FASTPS_VISION:-0}" = 1 ] || [ -d .venv-vision ]; }; then
  section "torchvision environment"
  if visionpy=$(bash tests/envs/vision.sh | tail -n 1) && [ -x "$visionpy" ]; then
    export FASTPS_VISION_PYTHON=$visionpy
  else
    echo "could not set up the torchvision environment" >&2
    status=1
  fi
fi

if [ -n "$mxnet_env_pid" ]; then
  section "waiting for the mxnet environment"
  wait "$mxnet_env_pid" || mxnet_env_rc=$?
  mxnet_env_pid=""
fi

# The integration, rack and tools tiers keep the 2 cores only half busy (their jobs wait on
# sockets, shaped links and fault timeouts): two pytest workers, each taking whole files (a
# file's module-scoped racks and jobs stay in one process; every rack file has its own
# prefix), finish them in about 0.7x the time. The PyTorch tier keeps both cores busy by
# itself and runs alone.
section "core tests (integration, rack, tools), two at a time"
$PY -m pytest -q tests/integration tests/rack tests/tools -n 2 --dist loadfile \
  --durations=30 -rs "$@" || status=1
section "PyTorch tests"
$PY -m pytest -q tests/torch --durations=20 -rs "$@" || status=1

# Each of these tiers runs in the environment its tests/envs/<name>.sh builds (that script
# prints the environment's python last): the other frameworks, then the libraries and cluster
# engines fastps plugs into (tests/ecosystem/<name>: Lightning, Hugging Face, Ray, Spark,
# SLURM, Open MPI; SLURM's and Open MPI's scripts install the Debian packages and start the
# daemons).
for tier in tensorflow mxnet ecosystem/lightning ecosystem/huggingface ecosystem/ray \
  ecosystem/spark ecosystem/slurm ecosystem/openmpi; do
  name=$(basename "$tier")
  if [ -f "tests/envs/$name.sh" ] && [ -d "tests/$tier" ]; then
    if [ -f "$bg/$name.out" ]; then
      section "$name environment (built in the background, above; exit $mxnet_env_rc)"
      cat "$bg/$name.err" >&2
      tierpy=""
      [ "$mxnet_env_rc" = 0 ] && tierpy=$(tail -n 1 "$bg/$name.out")
    else
      section "$name environment"
      tierpy=$(bash "tests/envs/$name.sh" | tail -n 1) || tierpy=""
    fi
    if [ -n "$tierpy" ] && [ -x "$tierpy" ]; then
      section "$name tests ($tierpy)"
      "$tierpy" -m pytest -q "tests/$tier" -p no:cacheprovider --durations=10 "$@" || status=1
    else
      echo "could not set up the $name environment" >&2
      status=1
    fi
  fi
done
if [ $unit = 1 ]; then
  echo "== the unit tests failed: see the first section above" >&2
fi
section "done (exit $status)"
exit $status
