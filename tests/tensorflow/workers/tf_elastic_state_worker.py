"""Horovod's TensorFlow elastic states across ranks (its test_elastic_state in
test_tensorflow.py and test_tensorflow2_keras.py, with checks of our own). Usage:
tf_elastic_state_worker.py keras3|keras2 (keras2: ``TF_USE_LEGACY_KERAS=1``: the model
and optimizer are ``tf_keras`` ones).

Every rank starts from its own values (rank + 1). After ``sync()`` every rank holds rank
0's, and that is also what a ``restore()`` goes back to (Horovod's TensorFlow states
commit what they synced); after ``commit()`` a restore goes back to the committed values.
Checked for a ``TensorFlowState`` of plain variables and for a ``KerasState`` of a model
and its optimizer. Prints "rank R OK" at the end.
"""

from __future__ import annotations

import os
import sys

KERAS2 = sys.argv[1] == "keras2"
if KERAS2:
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

from typing import Any, List  # noqa: E402

import fastps.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

if KERAS2:
    keras: Any = tf.keras
    assert keras.__name__.startswith("tf_keras"), keras.__name__
else:
    import keras  # type: ignore[no-redef]  # noqa: E402

hvd.init()
RANK = hvd.rank()
MINE = float(RANK + 1)
ROOT = 1.0  # rank 0's value


def check(label: str, arrays: List[np.ndarray], value: float) -> None:
    for i, a in enumerate(arrays):
        np.testing.assert_array_equal(a, np.full_like(a, value), err_msg=f"{label}: #{i}")


def variables_state() -> None:
    vs = [tf.Variable(np.full((2, 2), MINE)), tf.Variable(np.full(2, MINE))]
    state = hvd.elastic.TensorFlowState(vs, batch=20 + RANK)
    state.sync()
    check("TensorFlowState after sync", [v.numpy() for v in vs], ROOT)
    assert state.batch == 20, state.batch
    for v in vs:
        v.assign(tf.fill(v.shape, tf.constant(7.0, v.dtype)))
    state.batch = 21
    state.restore()
    check("TensorFlowState restored after sync", [v.numpy() for v in vs], ROOT)
    assert state.batch == 20, state.batch
    for v in vs:
        v.assign(tf.fill(v.shape, tf.constant(7.0, v.dtype)))
    state.commit()
    for v in vs:
        v.assign(tf.fill(v.shape, tf.constant(9.0, v.dtype)))
    state.restore()
    check("TensorFlowState restored after commit", [v.numpy() for v in vs], 7.0)
    print(f"rank {RANK} TensorFlowState: ok", flush=True)


def keras_state() -> None:
    model = keras.Sequential([keras.layers.Dense(2)])
    model.build((None, 2))
    model.set_weights([np.full(w.shape, MINE, np.float32) for w in model.get_weights()])
    opt = keras.optimizers.SGD(0.1)
    state = hvd.elastic.KerasState(model, opt, epoch=10 + RANK)
    assert "model" in state._handlers and "optimizer" in state._handlers, state._handlers
    state.sync()
    check("KerasState model after sync", model.get_weights(), ROOT)
    assert state.epoch == 10, state.epoch
    model.set_weights([np.full(w.shape, 5.0, np.float32) for w in model.get_weights()])
    state.epoch = 11
    state.restore()
    check("KerasState model restored after sync", model.get_weights(), ROOT)
    assert state.epoch == 10, state.epoch
    print(f"rank {RANK} KerasState: ok", flush=True)


def main() -> None:
    variables_state()
    keras_state()
    print(f"rank {RANK} OK", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
