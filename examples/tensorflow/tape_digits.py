"""Data-parallel custom training loop with fastps: DistributedGradientTape in tf.function.

    fastpsrun -np 2 python examples/tensorflow/tape_digits.py

Each worker trains on its own shard of scikit-learn's digits; DistributedGradientTape
averages the gradients over the workers. Inside the compiled step every gradient's
push_pull starts as soon as backpropagation produces it, highest priority to the first
layer. Prints the test accuracy (exit status 1 if it is below --target, 0.95 by default).
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import fastps.tensorflow as hvd  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--lr", type=float, default=1e-3, help="single-worker learning rate")
    parser.add_argument("--target", type=float, default=0.95)
    args = parser.parse_args()

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    keras.utils.set_random_seed(rank)

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y.astype(np.int64), test_size=0.25, random_state=0, stratify=y
    )
    shard = tf.data.Dataset.from_tensor_slices((x_train[rank::size], y_train[rank::size]))

    model = keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    optimizer = keras.optimizers.Adam(args.lr * size)
    optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    # Start every worker from rank 0's weights and optimizer state.
    hvd.broadcast_variables(model.variables + optimizer.variables, root_rank=0)

    @tf.function
    def train_step(xb: tf.Tensor, yb: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        tape = hvd.DistributedGradientTape(tape)  # the one change to the loop
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    for epoch in range(args.epochs):
        losses = [
            train_step(xb, yb)
            for xb, yb in shard.shuffle(2048, seed=epoch * 1000 + rank).batch(args.batch_size)
        ]
        mean_loss = hvd.allreduce(tf.reduce_mean(tf.stack(losses)), name="epoch.loss")
        if rank == 0 and (epoch + 1) % 5 == 0:
            print(f"epoch {epoch + 1}: loss {float(mean_loss):.4f}", flush=True)

    x_eval, y_eval = x_test[rank::size], y_test[rank::size]
    predicted = np.argmax(model(x_eval, training=False).numpy(), axis=1)
    counts = hvd.allreduce(
        np.array([np.sum(predicted == y_eval), len(y_eval)], np.int64),
        op=hvd.Sum,
        name="test.counts",
    ).numpy()
    accuracy = counts[0] / counts[1]
    if rank == 0:
        print(
            f"test accuracy: {accuracy:.4f} ({counts[0]}/{counts[1]}) on {size} workers, "
            f"target {args.target}"
        )
    hvd.shutdown()
    return 0 if accuracy >= args.target else 1


if __name__ == "__main__":
    sys.exit(main())
