"""An elastic Keras ``model.fit`` run the tests drive while workers join: least squares with
a Keras model compiled with fastps's ``DistributedOptimizer``, trained by ``fit`` under
``hvd.elastic.run`` with ``KerasState`` and the three elastic callbacks (a commit after
every batch).

Each worker's batch has ``ROWS`` rows in every world, so nothing makes Keras trace the
step ``fit`` compiled in the first generation again: the survivors run it in the next one
(where what a compiled step decided from the world it was traced in would be stale); the
global batch of step ``s`` in a world of ``n`` workers is ``batch(s, n)``. Rank 0 writes
the final parameters and the world size of every step (``sizes``), so the test compares
with one process running the same global batches (``reference(sizes)``).

Environment: STEPS (default 30), STEP_SLEEP (seconds each step waits first, default 0:
leaves the test time to add a host while ``fit`` runs), RESULT (rank 0's output file).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, List, Optional, Tuple

import numpy as np

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "-1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

ROWS = 4  # per worker and step, in every world
FEATURES = 8


def make_model() -> keras.Model:
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [keras.Input((FEATURES,), dtype="float64"), keras.layers.Dense(1, dtype="float64")]
    )


def make_optimizer() -> keras.optimizers.Optimizer:
    return keras.optimizers.SGD(learning_rate=0.05, momentum=0.9)


def batch(step: int, world: int) -> Tuple[np.ndarray, np.ndarray]:
    """Step ``step``'s global batch in a world of ``world`` workers (``ROWS`` each)."""
    g = np.random.default_rng(1000 + 97 * step + world)
    x = g.standard_normal((world * ROWS, FEATURES))
    w = np.arange(1, FEATURES + 1, dtype=np.float64).reshape(-1, 1) / FEATURES
    y = x @ w + 0.5 + 0.01 * g.standard_normal((world * ROWS, 1))
    # fit() hands numpy input to the model as float32 (Keras's floatx): use values that
    # float32 holds exactly, so the reference sees the same batches.
    return x.astype(np.float32).astype(np.float64), y.astype(np.float32).astype(np.float64)


def reference(sizes: List[int]) -> List[List[float]]:
    """One process running step ``s`` on ``batch(s, sizes[s])``."""
    model, opt = make_model(), make_optimizer()
    for step, world in enumerate(sizes):
        x, y = batch(step, world)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
    return [v.numpy().flatten().tolist() for v in model.trainable_variables]


def main() -> int:
    import fastps.tensorflow.keras as hvd

    steps = int(os.environ.get("STEPS", "30"))
    pause = float(os.environ.get("STEP_SLEEP", "0"))

    hvd.init()
    model = make_model()
    # The loss in float64 (Keras computes losses in float32 by default): the reference's.
    loss = keras.losses.MeanSquaredError(dtype="float64")
    model.compile(optimizer=hvd.DistributedOptimizer(make_optimizer()), loss=loss)
    model.optimizer.build(model.trainable_variables)  # its slots are in the commit
    state = hvd.elastic.KerasState(model, batch=0, epoch=0, step=0, sizes=[])

    class CountSteps(keras.callbacks.Callback):
        """Counts the steps done (before the commit, so the commit holds the count)."""

        def on_train_batch_begin(self, batch: int, logs: Optional[Any] = None) -> None:
            if pause:
                time.sleep(pause)

        def on_train_batch_end(self, batch: int, logs: Optional[Any] = None) -> None:
            state.step += 1
            state.sizes.append(hvd.size())
            if hvd.rank() == 0:
                print(f"STEP {state.step} size={hvd.size()} t={time.time():.3f}", flush=True)

    callbacks = [
        CountSteps(),
        hvd.elastic.UpdateBatchStateCallback(state),
        hvd.elastic.UpdateEpochStateCallback(state),
        hvd.elastic.CommitStateCallback(state, batches_per_commit=1),
    ]

    @hvd.elastic.run
    def train(state: Any) -> None:
        n, r = hvd.size(), hvd.rank()
        if state.step >= steps:
            return
        # This rank's rows of every step left, one fit() batch per step.
        shares = [batch(s, n) for s in range(state.step, steps)]
        xs = np.concatenate([x[r * ROWS : (r + 1) * ROWS] for x, _ in shares])
        ys = np.concatenate([y[r * ROWS : (r + 1) * ROWS] for _, y in shares])
        model.fit(xs, ys, batch_size=ROWS, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)

    train(state)
    if hvd.rank() == 0 and os.environ.get("RESULT"):
        with open(os.environ["RESULT"], "w") as f:
            params = [v.numpy().flatten().tolist() for v in model.trainable_variables]
            json.dump({"params": params, "sizes": list(state.sizes), "size": hvd.size()}, f)
    print(f"DONE rank={hvd.rank()} size={hvd.size()}", flush=True)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
