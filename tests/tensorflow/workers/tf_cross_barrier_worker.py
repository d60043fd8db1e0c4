"""Keras cross-barrier updates must equal synchronous updates bit for bit (float64).

Usage: tf_cross_barrier_worker.py [steps]

Each case trains the same float64 model twice on every worker — with
``DistributedOptimizer(cross_barrier=True)`` and with ``cross_barrier=False`` — on the same
batches, and every worker checks that the weights, the optimizer's variables and
``iterations`` are identical. Rank 1 sleeps before some steps, so rank 0's sums cannot all
be in when its ``apply`` returns: its updates really are deferred (counted and printed), and
the next forward pass waits for them. Cases: a custom eager loop with SGD+momentum, Adam
with a learning-rate schedule, AdamW with weight decay and clipnorm (the learning rate is
changed between steps while updates pend), and ``model.fit(run_eagerly=True)``.
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import fastps.tensorflow as hvd  # noqa: E402
import fastps.tensorflow.keras as hvdk  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

keras.config.set_floatx("float64")
B, FEATURES, HIDDEN, CLASSES = 8, 12, 32, 3
LATE_S = 0.3  # how long rank 1 sleeps before a late step


def make_model() -> keras.Model:
    model = keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(HIDDEN, activation="tanh"),
            keras.layers.Dense(HIDDEN, activation="relu"),
            keras.layers.Dense(HIDDEN, activation="tanh"),
            keras.layers.Dense(CLASSES),
        ]
    )
    rng = np.random.RandomState(3)
    model.set_weights([rng.normal(0, 0.4, w.shape) for w in model.get_weights()])
    return model


def batches(steps: int) -> list:
    rng = np.random.RandomState(11 + hvd.rank())
    return [(rng.normal(size=(B, FEATURES)), rng.randint(0, CLASSES, size=B)) for _ in range(steps)]


def late(step: int) -> bool:
    return hvd.rank() == 1 and step % 2 == 1


def optimizer(case: str) -> keras.optimizers.Optimizer:
    if case == "sgd":
        return keras.optimizers.SGD(0.05, momentum=0.9)
    if case == "adam-schedule":
        return keras.optimizers.Adam(keras.optimizers.schedules.ExponentialDecay(0.01, 2, 0.7))
    if case == "adamw-clip":
        return keras.optimizers.AdamW(0.01, weight_decay=0.05, clipnorm=0.5)
    if case == "fit":
        return keras.optimizers.Adam(0.01)
    raise SystemExit(f"unknown case {case}")


def custom_loop(case: str, cross: bool, steps: int) -> tuple:
    model = make_model()
    opt = hvdk.DistributedOptimizer(optimizer(case), cross_barrier=cross)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    deferred = 0
    for s, (x, y) in enumerate(batches(steps)):
        if late(s):
            time.sleep(LATE_S)
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        cb = opt._fastps_cb
        if cb is not None:
            deferred += len(cb.pending)
            # Pending variables read as updated ones (the read applies the update).
            if s == 1 and cb.pending:
                first = model.trainable_variables[0]
                _ = first.numpy()
                assert not getattr(type(first), "_fastps_pending", False)
        if case == "adamw-clip" and s == 2:
            opt.learning_rate = 0.004  # while this step's updates may still pend
    return model, opt, deferred


def fit_loop(cross: bool, steps: int) -> tuple:
    model = make_model()
    opt = hvdk.DistributedOptimizer(optimizer("fit"), cross_barrier=cross)
    model.compile(
        optimizer=opt,
        run_eagerly=True,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    data = batches(steps)
    x = np.concatenate([b[0] for b in data])
    y = np.concatenate([b[1] for b in data])
    seen = []

    class Late(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch: int, logs: object = None) -> None:
            if late(batch):
                time.sleep(LATE_S)

        def on_train_batch_end(self, batch: int, logs: object = None) -> None:
            cb = opt._fastps_cb
            seen.append(len(cb.pending) if cb is not None else 0)

    model.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0, callbacks=[Late()])
    return model, opt, sum(seen)


def same(a: keras.Model, oa: object, b: keras.Model, ob: object, what: str) -> None:
    oa.wait_for_updates()
    ob.wait_for_updates()
    for va, vb in zip(a.trainable_variables, b.trainable_variables):
        assert np.array_equal(va.numpy(), vb.numpy()), (what, va.path)
    sa = [v.numpy() for v in oa.variables]
    sb = [v.numpy() for v in ob.variables]
    assert len(sa) == len(sb) and all(np.array_equal(x, y) for x, y in zip(sa, sb)), what
    assert int(oa.iterations.numpy()) == int(ob.iterations.numpy()), what


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    hvd.init()
    for case in ("sgd", "adam-schedule", "adamw-clip", "fit"):
        if case == "fit":
            cb_model, cb_opt, deferred = fit_loop(True, steps)
        else:
            cb_model, cb_opt, deferred = custom_loop(case, True, steps)
        # The last step's sums may still be in flight under the names the reference uses.
        cb_opt.wait_for_updates()
        if case == "fit":
            ref_model, ref_opt, _ = fit_loop(False, steps)
        else:
            ref_model, ref_opt, _ = custom_loop(case, False, steps)
        same(cb_model, cb_opt, ref_model, ref_opt, case)
        cb = cb_opt._fastps_cb
        assert cb is not None and cb.steps == steps, case
        if hvd.rank() == 0:
            assert deferred > 0, f"{case}: no update was deferred on rank 0"
        print(
            f"rank {hvd.rank()} CB EQUAL {case} deferred={deferred} applies={cb.applies} "
            f"steps={cb.steps}",
            flush=True,
        )
    # Configurations whose updates are coupled across variables fall back, with a warning.
    with tf.device("/cpu:0"):
        import warnings

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            opt = hvdk.DistributedOptimizer(
                keras.optimizers.SGD(0.1, global_clipnorm=1.0), cross_barrier=True
            )
        assert opt._fastps_cb is None
        assert any("global_clipnorm" in str(w.message) for w in caught), caught
    print(f"rank {hvd.rank()} OK", flush=True)


if __name__ == "__main__":
    main()
