"""hvd.SyncBatchNormalization under Keras 2 (``tf_keras``; ``TF_USE_LEGACY_KERAS=1``): the
layer is a Keras 2 layer, so it runs in a TensorFlow 1 graph and session (argv[1] =
"graph") as well as eagerly ("eager"). Each rank normalizes its own slice of a batch; the
outputs and moving statistics must equal Keras 2's BatchNormalization over the whole
batch, on every rank. Prints "rank R <mode> OK".
"""

from __future__ import annotations

import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import fastps.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

mode = sys.argv[1]
if mode == "graph":
    tf.compat.v1.disable_eager_execution()
    # Also where eager ops ran before in this process (tests/tensorflow/tfjobs.py's shared job)
    assert not tf.executing_eagerly(), "eager execution is still on"
hvd.init()
rank, size = hvd.rank(), hvd.size()
assert issubclass(hvd.SyncBatchNormalization, tf_keras.layers.BatchNormalization)

rng = np.random.default_rng(7)
cases = [(rng.normal(size=(size * 3, 4)) * 3 + 1, 1), (rng.normal(size=(size * 2, 3, 5)), -1)]
for batch, axis in cases:
    x = tf.constant(batch, tf.float32)
    mine = x[rank * (len(batch) // size) : (rank + 1) * (len(batch) // size)]
    bn = tf_keras.layers.BatchNormalization(axis=axis, fused=False)
    sync = hvd.SyncBatchNormalization(axis=axis)
    want, got = bn(x, training=True), sync(mine, training=True)
    want = want[rank * (len(batch) // size) : (rank + 1) * (len(batch) // size)]
    fetch = [want, got, bn.moving_mean, sync.moving_mean, bn.moving_variance, sync.moving_variance]
    if mode == "graph":
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            want_v, got_v = sess.run([want, got])
            stats = sess.run(fetch[2:])
    else:
        want_v, got_v = want.numpy(), got.numpy()
        stats = [v.numpy() for v in fetch[2:]]
    np.testing.assert_allclose(got_v, want_v, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(stats[1], stats[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(stats[3], stats[2], rtol=1e-4, atol=1e-5)
    if mode == "eager" and axis == 1:  # the updates ran (in a graph: only when fetched)
        assert not np.allclose(stats[1], 0.0), stats

print(f"rank {rank} {mode} OK", flush=True)
hvd.shutdown()
