"""DistributedGradientTape in a TensorFlow 1 graph, its gradients fetched one at a time by
separate ``Session.run`` calls (as Horovod's test_partial_distributed_gradient_tape does
through ``assertAllClose``): each fetch runs that gradient's reduction only, so the
gradients must not travel as one fused bucket that waits for the others. Each rank's
weights differ; every fetched gradient must be the average over ranks. Prints
"rank R OK".
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import fastps.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.compat.v1.disable_eager_execution()
hvd.init()
rank, size = hvd.rank(), hvd.size()

x = tf.constant([[1.0, 2.0, 3.0]])
weights = [
    tf.compat.v1.Variable(tf.fill([3, 2], float(rank + 1)), use_resource=True),
    tf.compat.v1.Variable(tf.fill([2], float(rank + 1)), use_resource=True),
    tf.compat.v1.Variable(tf.fill([2, 1], float(rank + 1)), use_resource=True),
]
with tf.GradientTape(persistent=True) as tape:
    hidden = tf.matmul(x, weights[0]) + weights[1]
    loss = tf.reduce_sum(tf.matmul(hidden, weights[2]))
local = tape.gradient(loss, weights)
tape = hvd.DistributedGradientTape(tape)
reduced = tape.gradient(loss, weights)
gather = [hvd.allgather(tf.expand_dims(g, 0)) for g in local]

with tf.compat.v1.Session() as sess:
    sess.run(tf.compat.v1.global_variables_initializer())
    for _ in range(2):
        for i in reversed(range(len(weights))):  # one gradient per run, in any order
            got = sess.run(reduced[i])
            every = sess.run(gather[i])
            np.testing.assert_allclose(got, every.mean(axis=0), rtol=1e-6)
print(f"rank {rank} OK", flush=True)
hvd.shutdown()
