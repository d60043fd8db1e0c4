"""DistributedGradientTape in a TensorFlow 1 graph, its gradients fetched one at a time by
separate ``Session.run`` calls (as Horovod's test_partial_distributed_gradient_tape does
through ``assertAllClose``): each fetch runs that gradient's reduction only, so the
gradients must not travel as one fused bucket that waits for the others. Each rank's
weights differ; every fetched gradient must be the average over ranks. With argv[1] =
"keras2-partial": a Keras 2 (tf_keras) model through PartialDistributedGradientTape with
its first layer local (that gradient: this rank's own / size), as Horovod's test builds
it under TF_USE_LEGACY_KERAS=1. Prints "rank R OK".
"""

from __future__ import annotations

import os
import sys

KERAS2 = sys.argv[1:] == ["keras2-partial"]
if KERAS2:
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import fastps.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.compat.v1.disable_eager_execution()
hvd.init()
rank, size = hvd.rank(), hvd.size()

x = tf.constant([[1.0, 2.0, 3.0]])
if KERAS2:
    import tf_keras

    init = tf_keras.initializers.Constant(float(rank + 1))
    model = tf_keras.Sequential(
        [
            tf_keras.layers.Dense(2, input_shape=(3,), kernel_initializer=init),
            tf_keras.layers.Dense(1, kernel_initializer=init),
        ]
    )
    weights = model.trainable_weights
    with tf.GradientTape(persistent=True) as tape:
        loss = tf.reduce_sum(model(x))
    local = tape.gradient(loss, weights)
    tape = hvd.PartialDistributedGradientTape(tape, local_layers=[model.layers[0]])
    n_local = len(model.layers[0].trainable_weights)
    # A tf_keras variable's ``value`` is a method, a new object per access: registering
    # by its id let later objects (another variable's) take that id and pass as local.
    for w in weights[n_local:]:
        tape.register_local_source(weights[0])
        assert not tape._is_local(w), w.name
else:
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
    n_local = 0
reduced = tape.gradient(loss, weights)
gather = [hvd.allgather(tf.expand_dims(g, 0)) for g in local]

with tf.compat.v1.Session() as sess:
    sess.run(tf.compat.v1.global_variables_initializer())
    for _ in range(2):
        for i in reversed(range(len(weights))):  # one gradient per run, in any order
            got = sess.run(reduced[i])
            every = sess.run(gather[i])
            want = every[rank] / size if i < n_local else every.mean(axis=0)
            np.testing.assert_allclose(got, want, rtol=1e-6)
print(f"rank {rank} OK", flush=True)
hvd.shutdown()
