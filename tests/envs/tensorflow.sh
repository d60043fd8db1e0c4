#!/usr/bin/env bash
# Creates or updates the Python environment the TensorFlow plugin tests run in, and prints
# that environment's python executable on the last line of stdout (progress goes to stderr):
#
#   py=$(bash tests/envs/tensorflow.sh | tail -n 1) && "$py" -m pytest tests/tensorflow
#
# Preferred: the main interpreter ($PYTHON, default python3), which also runs the core and
# PyTorch tests. TensorFlow CPU 2.21 is added to it only if that changes no package already
# installed there (pip runs with the installed versions as constraints) and TensorFlow then
# imports next to torch. Otherwise: a virtual environment .venv-tf in the repository that
# sees the main interpreter's packages (fastps, installed editable) and holds its own
# TensorFlow. FASTPS_TF_VENV=1 forces the virtual environment. Safe to run repeatedly.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
TF_SPEC="tensorflow-cpu==2.21.*"
TEST_DEPS=(pytest pytest-timeout scikit-learn)
# Keras 2 (tf.keras under TF_USE_LEGACY_KERAS=1), for the Keras 2 tests. Without its
# dependencies: it asks for the `tensorflow` distribution, and tensorflow-cpu is that here.
KERAS2_SPEC="tf-keras==2.21.*"
VENV=.venv-tf
export TF_CPP_MIN_LOG_LEVEL=2 TF_ENABLE_ONEDNN_OPTS=0

say() { echo "tensorflow env: $*" >&2; }
pip_q() { local py=$1; shift; "$py" -m pip install -q --disable-pip-version-check "$@" >&2; }

# Does $1 have TensorFlow 2.21 with Keras 3, fastps and its plugin, and the test tools?
usable() {
  "$1" - >/dev/null 2>&1 <<'PYEOF'
import importlib.util, sys
import tensorflow as tf, keras
assert tf.__version__.startswith("2.21."), tf.__version__
assert keras.__version__.startswith("3."), keras.__version__
import fastps._core, fastps.tensorflow.keras  # noqa: F401
import pytest, sklearn  # noqa: F401
if importlib.util.find_spec("torch") is not None:
    import torch  # noqa: F401  (TensorFlow and torch must load into one process)
PYEOF
}

# Adds Keras 2 to the interpreter $1 if it lacks it.
ensure_keras2() {
  if ! "$1" -c "import tf_keras" >/dev/null 2>&1; then
    say "installing $KERAS2_SPEC (no dependencies) into $1"
    pip_q "$1" --no-deps "$KERAS2_SPEC" || say "could not install $KERAS2_SPEC: the Keras 2 test will fail"
  fi
}

# fastps itself must be importable (editable install) in the main interpreter.
if ! "$PY" -c "import importlib.util as u, fastps._core
assert u.find_spec('fastps.tensorflow')" >/dev/null 2>&1; then
  say "installing fastps (editable) into $PY"
  pip_q "$PY" "scikit-build-core>=1.1" "pybind11>=2.11" cmake ninja numpy click
  pip_q "$PY" --no-build-isolation -e .
fi

if [ "${FASTPS_TF_VENV:-0}" != "1" ]; then
  if ! usable "$PY"; then
    say "adding $TF_SPEC to $PY (keeping every installed package at its version)"
    constraints=$(mktemp)
    trap 'rm -f "$constraints"' EXIT
    "$PY" -m pip list --format=freeze --disable-pip-version-check 2>/dev/null \
      | grep -v -i -E '^(fastps|tensorflow|tensorflow-cpu|keras)==' > "$constraints" || true
    pip_q "$PY" -c "$constraints" "$TF_SPEC" "${TEST_DEPS[@]}" || say "that did not work"
  fi
  if usable "$PY"; then
    ensure_keras2 "$PY"
    "$PY" -c 'import sys; print(sys.executable)'
    exit 0
  fi
  say "TensorFlow is not usable in $PY; using the virtual environment $VENV"
fi

if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV"
  "$PY" -m venv --system-site-packages "$VENV"
fi
if ! usable "$VENV/bin/python"; then
  say "installing $TF_SPEC into $VENV"
  pip_q "$VENV/bin/python" "$TF_SPEC" "${TEST_DEPS[@]}"
fi
if ! usable "$VENV/bin/python"; then
  say "TensorFlow is not usable in $VENV either:"
  "$VENV/bin/python" -c "import tensorflow, fastps.tensorflow" >&2 || true
  exit 1
fi
ensure_keras2 "$VENV/bin/python"
"$VENV/bin/python" -c 'import sys; print(sys.executable)'
