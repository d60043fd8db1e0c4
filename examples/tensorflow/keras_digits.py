"""Data-parallel Keras training with fastps: scikit-learn's 8x8 digits, model.fit.

    fastpsrun -np 2 python examples/tensorflow/keras_digits.py

Compared with single-process Keras, only the import, the optimizer wrapper and the
callbacks change. Each worker trains on its own shard of the training set; gradients are
averaged over the workers every step. ``--async`` (or FASTPS_MODE=async) trains
asynchronously (docs/guide/async.md): the servers keep the parameters, each worker applies its
own steps with the single-worker learning rate and exchanges the deltas. Prints the test
accuracy (exit status 1 if it is below --target, 0.95 by default).
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import fastps.tensorflow.keras as hvd  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402


def digits() -> tuple:
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    return train_test_split(x, y.astype(np.int64), test_size=0.25, random_state=0, stratify=y)


def build_model() -> keras.Model:
    return keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--lr", type=float, default=1e-3, help="single-worker learning rate")
    parser.add_argument("--target", type=float, default=0.95)
    parser.add_argument("--async", dest="asynchronous", action="store_true")
    args = parser.parse_args()

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    keras.utils.set_random_seed(rank)  # different initial weights: the broadcast fixes that
    x_train, x_test, y_train, y_test = digits()
    x_mine, y_mine = x_train[rank::size], y_train[rank::size]

    model = build_model()
    # The only changes for fastps: scale the rate with the number of workers (the global
    # batch is size times larger) and wrap the optimizer. Async: every worker makes its own
    # steps on its own batches, at the single-worker rate.
    lr = args.lr if args.asynchronous else args.lr * size
    optimizer = hvd.DistributedOptimizer(
        keras.optimizers.Adam(lr), asynchronous=args.asynchronous or None
    )
    model.compile(
        optimizer=optimizer,
        metrics=["accuracy"],
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),  # everyone starts from rank 0
        hvd.callbacks.MetricAverageCallback(),  # logs hold averages over the workers
    ]
    if not args.asynchronous:  # warm-up is for the size-times larger synchronous rate
        callbacks.append(hvd.callbacks.LearningRateWarmupCallback(warmup_epochs=3, verbose=1))
    history = model.fit(
        x_mine,
        y_mine,
        batch_size=args.batch_size,
        epochs=args.epochs,
        callbacks=callbacks,
        verbose=2 if rank == 0 else 0,
    )

    if args.asynchronous:
        hvd.barrier()  # every worker's last delta is on the servers: score those parameters
        optimizer.pull_parameters()
    # Every worker scores its share of the test set; the counts are summed.
    x_eval, y_eval = x_test[rank::size], y_test[rank::size]
    predicted = np.argmax(model.predict(x_eval, verbose=0), axis=1)
    counts = hvd.push_pull(
        np.array([np.sum(predicted == y_eval), len(y_eval)], np.int64),
        op=hvd.Sum,
        name="test.counts",
    ).numpy()
    accuracy = counts[0] / counts[1]
    if rank == 0:
        print(f"workers: {size}, final training loss (averaged): {history.history['loss'][-1]:.4f}")
        print(f"test accuracy: {accuracy:.4f} ({counts[0]}/{counts[1]}), target {args.target}")
    hvd.shutdown()
    return 0 if accuracy >= args.target else 1


if __name__ == "__main__":
    sys.exit(main())
