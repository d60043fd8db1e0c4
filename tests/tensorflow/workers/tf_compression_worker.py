"""fastps.tensorflow's gradient path with the core's compressors (docs/guide/compression.md),
run as 2 workers by tests/tensorflow/test_tf_compression.py: DistributedGradientTape with
``fastps.Compression.onebit`` gives every rank the reference decompress(compress(Σ
decompress(compress(g_r)))) / n for a gradient of one part, eagerly and in a tf.function;
training with top-k 10% and error feedback keeps every rank's weights identical.
Prints ``rank R OK``."""

from __future__ import annotations

import fastps
import fastps.tensorflow as hvd
import numpy as np
import tensorflow as tf
from fastps import _core


def codec(spec: str, x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    data = _core.compress(spec, x.ctypes.data, x.size, 0)
    out = np.empty_like(x)
    _core.decompress(data, x.size, out.ctypes.data)
    return out


def grad_of(rank: int) -> np.ndarray:
    return np.random.default_rng(rank).standard_normal(500).astype(np.float32)


def main() -> None:
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    v = tf.Variable(tf.zeros(500))
    total = sum(codec("onebit", grad_of(r)) for r in range(size))
    want = codec("onebit", total) / size

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(v * tf.constant(grad_of(rank)))
        tape = hvd.DistributedGradientTape(tape, compression=fastps.Compression.onebit)
        return tape.gradient(loss, [v])[0]

    np.testing.assert_allclose(step().numpy(), want, rtol=1e-6)
    np.testing.assert_allclose(tf.function(step)().numpy(), want, rtol=1e-6)

    model = tf.keras.Sequential(
        [tf.keras.Input((8,)), tf.keras.layers.Dense(16), tf.keras.layers.Dense(1)]
    )
    opt = tf.keras.optimizers.SGD(0.05)
    hvd.broadcast_variables(model.variables, root_rank=0)
    rng = np.random.default_rng(10 + rank)
    comp = fastps.Compression.topk(0.1, error_feedback=True)
    for _ in range(10):
        x = rng.standard_normal((32, 8)).astype(np.float32)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - x.sum(1, keepdims=True)) ** 2)
        tape = hvd.DistributedGradientTape(tape, compression=comp)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
    flat = tf.concat([tf.reshape(w, [-1]) for w in model.trainable_variables], 0)
    everyone = hvd.allgather(tf.expand_dims(flat, 0))
    assert np.array_equal(everyone[0].numpy(), everyone[1].numpy()), "weights differ"
    print(f"rank {rank} OK", flush=True)


if __name__ == "__main__":
    main()
