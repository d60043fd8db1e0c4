"""Keras DistributedOptimizer(backward_passes_per_step=N) and PartialDistributedOptimizer
against references computed on the side. Usage: tf_keras_aggregation_worker.py keras3|keras2
(keras2: ``TF_USE_LEGACY_KERAS=1``, ``tf_keras``, a current and a legacy SGD).

Every rank trains the same model (same initial weights) on its own data with plain SGD.
With N passes per step, the weights must not move during the first N - 1 passes of a
cycle, and after the N-th they must be ``w - lr * g`` where g is, for every variable, the
average over ranks (gathered with allgather, not through the reduction under test) of each
rank's sum of its N gradients, divided by N with ``average_aggregated_gradients``; the
variables of local layers use this rank's own sum divided by the number of ranks (Horovod's
``scale_local_gradients``) instead, so they differ between ranks while the others stay
identical. ``iterations`` counts every pass. Checked in custom loops (eagerly and in
``tf.function``) and in ``model.fit``, then the errors for bad arguments. Prints
"rank R OK" at the end.
"""

from __future__ import annotations

import os
import sys

KERAS2 = sys.argv[1] == "keras2"
if KERAS2:
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

from typing import Any, Callable, List  # noqa: E402

import fastps.tensorflow.keras as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from fastps.tensorflow import MismatchError  # noqa: E402

if KERAS2:
    keras: Any = tf.keras
    assert keras.__name__.startswith("tf_keras"), keras.__name__
else:
    import keras  # type: ignore[no-redef]  # noqa: E402

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
LR = 0.1
ROWS = 4  # per batch


def make_model(width: int = 4) -> Any:
    keras.utils.set_random_seed(5)  # the same initial weights on every rank
    model = keras.Sequential([keras.layers.Dense(width, activation="tanh"), keras.layers.Dense(2)])
    model.build((None, 3))
    return model


def batch(step: int) -> tuple:
    rng = np.random.RandomState(1000 * RANK + step)  # every rank its own data
    return rng.rand(ROWS, 3).astype(np.float32), rng.rand(ROWS, 2).astype(np.float32)


def gradients(model: Any, x: Any, y: Any) -> List[Any]:
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
    return tape.gradient(loss, model.trainable_variables)


def weights(model: Any) -> List[np.ndarray]:
    return [np.array(v.numpy()) for v in model.trainable_variables]


def rank_mean(value: np.ndarray) -> np.ndarray:
    return hvd.allgather(tf.constant(value[None])).numpy().mean(axis=0)


def expected_update(
    before: List[np.ndarray], sums: List[np.ndarray], passes: int, average: bool, local: List[bool]
) -> List[np.ndarray]:
    out = []
    for w, s, loc in zip(before, sums, local):
        total = s / passes if average else s
        g = total / SIZE if loc else rank_mean(total)
        out.append(w - LR * g)
    return out


def check_close(label: str, got: List[np.ndarray], want: List[np.ndarray]) -> None:
    for i, (a, b) in enumerate(zip(got, want)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=f"{label}: variable {i}")


def check_across_ranks(label: str, model: Any, local: List[bool]) -> None:
    """Shared variables are identical on every rank; local ones differ."""
    for i, (w, loc) in enumerate(zip(weights(model), local)):
        every = hvd.allgather(tf.constant(w[None])).numpy()
        same = all(np.array_equal(every[0], e) for e in every[1:])
        if loc:
            assert not same, f"{label}: local variable {i} is the same on every rank"
        else:
            assert same, f"{label}: shared variable {i} differs between ranks"


def apply(opt: Any, grads: List[Any], variables: List[Any]) -> None:
    if KERAS2:
        opt.apply_gradients(zip(grads, variables))
    else:
        opt.apply(grads, variables)


def wrap(make_opt: Callable[[], Any], model: Any, passes: int, average: bool, partial: bool) -> Any:
    if partial:
        return hvd.PartialDistributedOptimizer(
            make_opt(),
            backward_passes_per_step=passes,
            average_aggregated_gradients=average,
            local_layers=[model.layers[0]],
        )
    return hvd.DistributedOptimizer(
        make_opt(), backward_passes_per_step=passes, average_aggregated_gradients=average
    )


def loop_case(
    label: str, make_opt: Callable[[], Any], passes: int, average: bool, partial: bool, graph: bool
) -> None:
    model = make_model()
    opt = wrap(make_opt, model, passes, average, partial)
    variables = model.trainable_variables
    local = [partial and i < 2 for i in range(len(variables))]  # first layer: kernel, bias

    def train(x: Any, y: Any) -> List[Any]:
        grads = gradients(model, x, y)
        apply(opt, grads, variables)
        return grads

    step = tf.function(train) if graph else train
    before = weights(model)
    cycles = 2
    for cycle in range(cycles):
        sums = [np.zeros_like(w) for w in before]
        for k in range(passes):
            x, y = batch(cycle * passes + k)
            for s, g in zip(sums, step(tf.constant(x), tf.constant(y))):
                s += g.numpy()
            if k < passes - 1:
                for i, (a, b) in enumerate(zip(weights(model), before)):
                    assert np.array_equal(a, b), f"{label}: variable {i} moved at pass {k + 1}"
        want = expected_update(before, sums, passes, average, local)
        check_close(f"{label} cycle {cycle}", weights(model), want)
        before = weights(model)
    assert int(opt.iterations.numpy()) == cycles * passes, (label, opt.iterations)
    check_across_ranks(label, model, local)
    print(f"rank {RANK} {label}: ok", flush=True)


class Recorder(keras.callbacks.Callback):  # type: ignore[misc,name-defined]
    """The weights after every batch of model.fit."""

    def __init__(self) -> None:
        super().__init__()
        self.after: List[List[np.ndarray]] = []

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.after.append(weights(self.model))


def fit_case(label: str, make_opt: Callable[[], Any], passes: int, partial: bool) -> None:
    model = make_model()
    ref = make_model()  # computes the gradients at the recorded weights
    opt = wrap(make_opt, model, passes, True, partial)
    local = [partial and i < 2 for i in range(len(model.trainable_variables))]
    model.compile(optimizer=opt, loss="mse")
    cycles = 2
    data = [batch(s) for s in range(cycles * passes)]
    x = np.concatenate([b[0] for b in data])
    y = np.concatenate([b[1] for b in data])
    before = weights(model)
    rec = Recorder()
    model.fit(x, y, batch_size=ROWS, epochs=1, shuffle=False, verbose=0, callbacks=[rec])
    assert len(rec.after) == cycles * passes, len(rec.after)
    for cycle in range(cycles):
        ref.set_weights(before)
        sums = [np.zeros_like(w) for w in before]
        for k in range(passes):
            bx, by = data[cycle * passes + k]
            for s, g in zip(sums, gradients(ref, tf.constant(bx), tf.constant(by))):
                s += g.numpy()
            if k < passes - 1:
                after = rec.after[cycle * passes + k]
                for i, (a, b) in enumerate(zip(after, before)):
                    assert np.array_equal(a, b), f"{label}: variable {i} moved at batch {k + 1}"
        want = expected_update(before, sums, passes, True, local)
        check_close(f"{label} cycle {cycle}", rec.after[(cycle + 1) * passes - 1], want)
        before = rec.after[(cycle + 1) * passes - 1]
    assert int(opt.iterations.numpy()) == cycles * passes, (label, opt.iterations)
    check_across_ranks(label, model, local)
    print(f"rank {RANK} {label}: ok", flush=True)


def expect_error(label: str, kind: type, words: List[str], fn: Callable[[], Any]) -> None:
    try:
        fn()
    except kind as exc:
        for w in words:
            assert w in str(exc), (label, w, str(exc))
    else:
        raise AssertionError(f"{label}: no {kind.__name__}")


def error_cases(make_opt: Callable[[], Any]) -> None:
    for bad in (0, -2, 2.5, True):
        expect_error(
            f"backward_passes_per_step={bad!r}",
            ValueError,
            ["backward_passes_per_step", repr(bad)],
            lambda bad=bad: hvd.DistributedOptimizer(make_opt(), backward_passes_per_step=bad),
        )
    layer = keras.layers.Dense(2)
    expect_error(
        "a local layer that is not a layer",
        ValueError,
        ["local_layers[1]", "str"],
        lambda: hvd.PartialDistributedOptimizer(make_opt(), local_layers=[layer, "dense"]),
    )
    expect_error(
        "local_layers of the wrong type",
        ValueError,
        ["local_layers", "int"],
        lambda: hvd.PartialDistributedOptimizer(make_opt(), local_layers=3),
    )
    # Ranks that disagree about N fail at the first reduction, naming the setting. (A model
    # of its own: a gradient group this process checked before is not checked again.)
    model = make_model(width=5)
    opt = hvd.DistributedOptimizer(make_opt(), backward_passes_per_step=2 + RANK)

    def disagree() -> None:
        for s in range(2 + RANK):
            apply(opt, gradients(model, *batch(s)), model.trainable_variables)

    expect_error(
        "ranks with different N",
        MismatchError,
        ["backward_passes_per_step=2", "backward_passes_per_step=3"],
        disagree,
    )
    if KERAS2:
        return
    expect_error(
        "async with local aggregation",
        ValueError,
        ["backward_passes_per_step", "async"],
        lambda: hvd.DistributedOptimizer(make_opt(), backward_passes_per_step=2, **{"async": True}),
    )
    # A sparse gradient (an embedding's) cannot be summed locally unless made dense.
    emb = keras.layers.Embedding(10, 3)
    emb.build((None,))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(emb(tf.constant([1, 4])))
    grads = tape.gradient(loss, emb.trainable_variables)
    assert isinstance(grads[0], tf.IndexedSlices), type(grads[0])
    opt = hvd.DistributedOptimizer(make_opt(), backward_passes_per_step=2)
    expect_error(
        "a sparse gradient",
        ValueError,
        ["sparse_as_dense=True", "embeddings"],
        lambda: opt.apply(grads, emb.trainable_variables),
    )
    dense_opt = hvd.DistributedOptimizer(
        make_opt(), backward_passes_per_step=2, sparse_as_dense=True
    )
    before = emb.embeddings.numpy().copy()
    for _ in range(2):
        dense_opt.apply(grads, emb.trainable_variables)
    moved = np.abs(emb.embeddings.numpy() - before).sum(axis=1) > 0
    assert moved.tolist() == [i in (1, 4) for i in range(10)], moved


def main() -> None:
    if KERAS2:
        optimizers = {
            "current": lambda: keras.optimizers.SGD(LR),
            "legacy": lambda: keras.optimizers.legacy.SGD(LR),
        }
    else:
        optimizers = {"keras3": lambda: keras.optimizers.SGD(LR)}
    for kind, make_opt in optimizers.items():
        loop_case(f"{kind} eager N=3 sum", make_opt, 3, False, False, graph=False)
        loop_case(f"{kind} graph N=3 average partial", make_opt, 3, True, True, graph=True)
        loop_case(f"{kind} eager N=1 partial", make_opt, 1, False, True, graph=False)
        fit_case(f"{kind} fit N=2 average partial", make_opt, 2, partial=True)
        fit_case(f"{kind} fit N=3 average", make_opt, 3, partial=False)
    error_cases(next(iter(optimizers.values())))
    print(f"rank {RANK} OK", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
