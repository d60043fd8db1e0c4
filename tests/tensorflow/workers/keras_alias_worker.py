"""``import fastps.keras as hvd`` (Horovod's ``horovod.keras``) trains a Keras model in a
real job: its init is the one ``fastps.tensorflow`` and ``fastps.tensorflow.keras`` see (one
module state), ``hvd.DistributedOptimizer`` averages the gradients and
``hvd.callbacks.BroadcastGlobalVariablesCallback`` starts every rank from rank 0's weights,
so the ranks, each on its own data, end with the same weights. Prints "rank R OK"."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import fastps.keras as hvd  # noqa: E402
import fastps.tensorflow as hvd_tf  # noqa: E402
import fastps.tensorflow.keras as hvd_tf_keras  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

hvd.init()
assert hvd is hvd_tf_keras
assert hvd_tf.is_initialized() and hvd_tf.size() == hvd.size() == 2, hvd_tf.size()
rank = hvd.rank()

keras.utils.set_random_seed(rank)  # different initial weights on every rank
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1)])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse")
rng = np.random.default_rng(100 + rank)
x = rng.normal(size=(32, 4)).astype("float32")
y = rng.normal(size=(32, 1)).astype("float32")
model.fit(
    x,
    y,
    batch_size=8,
    epochs=2,
    verbose=0,
    callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)],
)
weights = [w.tolist() for w in model.get_weights()]
first, second = hvd.allgather_object(weights)
for a, b in zip(first, second):
    np.testing.assert_allclose(np.array(a), np.array(b), rtol=0, atol=1e-6)
assert int(model.optimizer.iterations.numpy()) == 2 * 32 // 8
print(f"rank {rank} OK", flush=True)
hvd.shutdown()
