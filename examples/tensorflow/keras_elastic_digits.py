"""Elastic Keras training on scikit-learn's 8x8 digits with model.fit: workers may die and
join, and with FASTPS_ELASTIC_SERVERS=1 summation servers too (docs/guide/elastic.md).

    fastpsrun -np 2 --min-np 1 --max-np 4 --host-discovery-script "echo localhost:4" \\
        python examples/tensorflow/keras_elastic_digits.py

Horovod's elastic Keras recipe: the model and its optimizer live in a ``KerasState``
committed every ``--commit-every`` batches (``CommitStateCallback``); ``state.epoch`` counts
finished epochs, so after a change of world ``fit`` runs the epochs left. Each worker trains
on its share of the training set, recomputed for every world (equal step counts on every
rank: each step is a collective), at a learning rate that follows the world's size (a
reset callback). Prints the test accuracy (exit status 1 if it is below --target).
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


class EpochLog(keras.callbacks.Callback):
    """Rank 0 says each finished epoch and the world it ran on."""

    def __init__(self, state: hvd.elastic.KerasState) -> None:
        super().__init__()
        self.state = state

    def on_epoch_end(self, epoch: int, logs: object = None) -> None:
        if hvd.rank() == 0:
            print(f"epoch {self.state.epoch:3d} done on {hvd.size()} workers", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--lr", type=float, default=1e-3, help="single-worker learning rate")
    parser.add_argument("--commit-every", type=int, default=4, help="batches per commit")
    parser.add_argument("--target", type=float, default=0.95)
    args = parser.parse_args()

    hvd.init()
    keras.utils.set_random_seed(0)
    x_train, x_test, y_train, y_test = digits()

    model = build_model()
    optimizer = hvd.DistributedOptimizer(keras.optimizers.Adam(args.lr * hvd.size()))
    model.compile(
        optimizer=optimizer,
        metrics=["accuracy"],
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    # The optimizer's slots must exist before the state copies them.
    model.optimizer.build(model.trainable_variables)
    state = hvd.elastic.KerasState(model, batch=0, epoch=0)

    def on_reset() -> None:
        model.optimizer.learning_rate.assign(args.lr * hvd.size())

    state.register_reset_callbacks([on_reset])
    callbacks = [
        hvd.callbacks.MetricAverageCallback(),
        hvd.elastic.UpdateEpochStateCallback(state),
        hvd.elastic.UpdateBatchStateCallback(state),
        hvd.elastic.CommitStateCallback(state, batches_per_commit=args.commit_every),
        EpochLog(state),
    ]

    @hvd.elastic.run
    def train(state: hvd.elastic.KerasState) -> float:
        rank, size = hvd.rank(), hvd.size()
        mine = len(x_train) // size  # the same number of samples, so of steps, per rank
        if state.epoch < args.epochs:
            model.fit(
                x_train[rank::size][:mine],
                y_train[rank::size][:mine],
                batch_size=args.batch_size,
                epochs=args.epochs - state.epoch,
                callbacks=callbacks,
                verbose=0,
            )
        # Inside the elastic function: a failure during the evaluation is recovered too.
        x_eval, y_eval = x_test[rank::size], y_test[rank::size]
        predicted = np.argmax(model.predict(x_eval, verbose=0), axis=1)
        counts = hvd.push_pull(
            np.array([np.sum(predicted == y_eval), len(y_eval)], np.int64),
            op=hvd.Sum,
            name="test.counts",
        ).numpy()
        return float(counts[0] / counts[1])

    accuracy = train(state)
    if hvd.rank() == 0:
        print(
            f"test accuracy: {accuracy:.4f} after {args.epochs} epochs, {hvd.size()} workers "
            f"at the end, target {args.target}",
            flush=True,
        )
    hvd.shutdown()
    return 0 if accuracy >= args.target else 1


if __name__ == "__main__":
    sys.exit(main())
