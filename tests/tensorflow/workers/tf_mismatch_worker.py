"""Workers whose models differ must fail fast with an error naming the difference.

Usage: tf_mismatch_worker.py tape-shape|fit-layers|broadcast-count
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import fastps.tensorflow as hvd  # noqa: E402
import fastps.tensorflow.keras as hvdk  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def model_for(rank: int, mode: str) -> keras.Model:
    width = 16 + (rank if mode == "tape-shape" else 0)
    layers = [keras.Input((8,)), keras.layers.Dense(width, activation="relu")]
    if mode != "tape-shape" and rank == 1:
        layers.append(keras.layers.Dense(16, activation="relu"))  # one layer more on rank 1
    layers.append(keras.layers.Dense(3))
    return keras.Sequential(layers)


def main() -> None:
    mode = sys.argv[1]
    hvd.init()
    r = hvd.rank()
    model = model_for(r, mode)
    x = np.random.RandomState(r).normal(size=(32, 8)).astype(np.float32)
    y = np.zeros(32, np.int64)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    if mode == "tape-shape":
        opt = keras.optimizers.SGD(0.1)

        @tf.function
        def step(xb: tf.Tensor, yb: tf.Tensor) -> tf.Tensor:
            with tf.GradientTape() as tape:
                loss = loss_fn(yb, model(xb))
            tape = hvd.DistributedGradientTape(tape)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        for _ in range(3):
            step(tf.constant(x), tf.constant(y))
    elif mode == "fit-layers":
        model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss=loss_fn)
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    elif mode == "broadcast-count":
        model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss=loss_fn)
        model.fit(
            x,
            y,
            batch_size=8,
            epochs=1,
            verbose=0,
            callbacks=[hvdk.callbacks.BroadcastGlobalVariablesCallback(0)],
        )
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(f"rank {r} finished without an error", flush=True)


if __name__ == "__main__":
    main()
