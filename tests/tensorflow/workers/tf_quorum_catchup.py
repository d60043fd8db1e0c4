"""Worker: quorum rounds with a Keras worker that is slower for good (docs/guide/async.md,
"Catch-up"), through ``fastps.tensorflow.keras.DistributedOptimizer``.

Every rank trains a small Keras model (one 256x256 kernel that travels alone, the small
tensors fused) and the float64 ledger of tests/workers/catchup_ledger.py with SGD with
momentum, on data of its own; rank ``slow`` spends ``slow_s`` per step, the others
``fast_s``. The loop counts the rounds applied (``optimizer.iterations``), not its own
steps: the slow rank catches up on the rounds that closed without it, several per step.
``mode``: ``graph`` (the update inside a ``tf.function``, as ``model.fit`` runs it) or
``eager``. Prints one ``CATCHUP`` line.

Usage: tf_quorum_catchup.py ROUNDS SLOW_RANK FAST_S SLOW_S MODE
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workers"))

import fastps.tensorflow.keras as hvd  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from catchup_ledger import LR, MOMENTUM, digest, ledger_gradient, report  # noqa: E402


def main() -> None:
    rounds, slow = int(sys.argv[1]), int(sys.argv[2])
    fast_s, slow_s = float(sys.argv[3]), float(sys.argv[4])
    mode = sys.argv[5]
    hvd.init()
    rank = hvd.rank()
    keras.utils.set_random_seed(1234)  # the same initial model everywhere
    model = keras.Sequential(
        [
            keras.Input((32,)),
            keras.layers.Dense(256, activation="tanh"),
            keras.layers.Dense(256, activation="tanh"),
            keras.layers.Dense(4),
        ]
    )
    ledger = keras.Variable(np.zeros(rounds, np.float64), dtype="float64", name="ledger")
    variables = model.trainable_variables + [ledger]
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=LR, momentum=MOMENTUM))

    def step(x: tf.Tensor, y: tf.Tensor, hot: tf.Tensor) -> None:
        with tf.GradientTape() as tape:
            fit = tf.reduce_mean(tf.square(model(x) - y))
            loss = 0.01 * tf.cast(fit, tf.float64) + tf.reduce_sum(ledger * hot)
        grads = tape.gradient(loss, variables)
        opt.apply(grads, variables)

    run = tf.function(step) if mode == "graph" else step
    data = np.random.RandomState(100 + rank)
    pause = slow_s if rank == slow else fast_s
    took = []
    while int(opt.iterations) < rounds:
        start = time.perf_counter()
        x = tf.constant(data.normal(size=(16, 32)).astype(np.float32))
        y = tf.constant(data.normal(size=(16, 4)).astype(np.float32))
        # this step's push is of the round after those applied so far
        hot = tf.constant(ledger_gradient(rank, int(opt.iterations), rounds))
        time.sleep(pause)  # this worker's compute
        run(x, y, hot)
        took.append(time.perf_counter() - start)
    state = [v.numpy() for v in variables] + [v.numpy() for v in opt.variables]
    print(report(rank, int(opt.iterations), took, ledger.numpy(), digest(state)), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
