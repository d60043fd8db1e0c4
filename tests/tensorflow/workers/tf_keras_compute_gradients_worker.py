"""Horovod's split optimizer step on the Keras DistributedOptimizer:
``grads_and_vars = opt._compute_gradients(loss, var_list, tape=...)`` returns the reduced
gradients and the ``apply_gradients`` that follows must not reduce them again. Usage:
tf_keras_compute_gradients_worker.py keras3|keras2 (keras2: ``TF_USE_LEGACY_KERAS=1``,
a current and a legacy ``tf_keras`` SGD).

Rank r's loss is ``sum(w * x_r) + s * c_r`` with ``x_r = [r + 1, 2 (r + 1), 3]`` and
``c_r = r + 1``, so every gradient is known in closed form: with ``op=Sum`` the reduced
gradients are the sums over ranks (a second reduction would multiply them by the number of
ranks), and plain SGD must then move ``w`` by ``-lr`` times them. ``s`` is a scalar, whose
reduced gradient must stay a scalar. With ``backward_passes_per_step=2`` the first call
returns this rank's own gradients and leaves the variables alone, the second returns the
reduced sums of both passes (``s`` registered local: this rank's own sum / size). Eagerly
and in ``tf.function``, with a callable loss and with a tensor loss on a tape. Prints
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

from typing import Any, Callable, Dict, List  # noqa: E402

import fastps.tensorflow.keras as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

if KERAS2:
    keras: Any = tf.keras
    assert keras.__name__.startswith("tf_keras"), keras.__name__
else:
    import keras  # type: ignore[no-redef]  # noqa: E402

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
LR = 0.1
W0 = np.array([1.0, 2.0, 3.0], np.float32)
S0 = np.float32(0.5)


def x_of(r: int) -> np.ndarray:
    return np.array([r + 1, 2 * (r + 1), 3], np.float32)


def c_of(r: int) -> np.float32:
    return np.float32(r + 1)


SUM_X = sum(x_of(r) for r in range(SIZE))
SUM_C = sum(c_of(r) for r in range(SIZE))


def variables() -> List[Any]:
    if KERAS2:
        return [tf.Variable(W0, name="w"), tf.Variable(S0, name="s")]
    return [keras.Variable(W0, name="w"), keras.Variable(S0, name="s")]


def loss_of(vs: List[Any]) -> Callable[[], Any]:
    x, c = tf.constant(x_of(RANK)), tf.constant(c_of(RANK))
    return lambda: tf.reduce_sum(vs[0] * x) + vs[1] * c


def check(label: str, got: Any, want: Any) -> None:
    got = np.asarray(got)
    assert got.shape == np.shape(want), f"{label}: shape {got.shape}, expected {np.shape(want)}"
    np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=label)


def split_step(opt: Any, vs: List[Any], tape_loss: bool) -> List[Any]:
    """One ``_compute_gradients`` + ``apply_gradients``; returns the computed gradients."""
    loss = loss_of(vs)
    if tape_loss:
        with tf.GradientTape() as tape:
            value = loss()
        pairs = opt._compute_gradients(value, vs, tape=tape)
    else:
        pairs = opt._compute_gradients(loss, var_list=vs)
    assert [id(v) for _, v in pairs] == [id(v) for v in vs], "variables out of order"
    opt.apply_gradients(pairs)
    return [g for g, _ in pairs]


def reduced_once(label: str, make_opt: Callable[[], Any], graph: bool, tape_loss: bool) -> None:
    vs = variables()
    opt = hvd.DistributedOptimizer(make_opt(), op=hvd.Sum)

    def step() -> List[Any]:
        return split_step(opt, vs, tape_loss)

    run = tf.function(step) if graph else step
    for k in range(2):
        grads = run()
        check(f"{label} step {k}: reduced gradient of w", grads[0], SUM_X)
        check(f"{label} step {k}: reduced gradient of s", grads[1], SUM_C)
        check(f"{label} step {k}: w", vs[0].numpy(), W0 - (k + 1) * LR * SUM_X)
        check(f"{label} step {k}: s", vs[1].numpy(), S0 - (k + 1) * LR * SUM_C)
    print(f"rank {RANK} {label}: ok", flush=True)


def aggregated(label: str, make_opt: Callable[[], Any], graph: bool) -> None:
    vs = variables()
    opt = hvd.DistributedOptimizer(make_opt(), backward_passes_per_step=2, op=hvd.Average)
    opt.register_local_var(vs[1])

    def step() -> List[Any]:
        return split_step(opt, vs, tape_loss=False)

    run = tf.function(step) if graph else step
    w, s = W0, S0
    for cycle in range(2):
        first = run()  # this rank's own gradients, not reduced; nothing applied
        check(f"{label} cycle {cycle} pass 1: gradient of w", first[0], x_of(RANK))
        check(f"{label} cycle {cycle} pass 1: gradient of s", first[1], c_of(RANK))
        check(f"{label} cycle {cycle} pass 1: w unchanged", vs[0].numpy(), w)
        second = run()  # both passes summed, then averaged over ranks (s: local / size)
        gw, gs = 2 * SUM_X / SIZE, 2 * c_of(RANK) / SIZE
        check(f"{label} cycle {cycle} pass 2: gradient of w", second[0], gw)
        check(f"{label} cycle {cycle} pass 2: gradient of s", second[1], gs)
        w, s = w - LR * gw, s - LR * gs
        check(f"{label} cycle {cycle} pass 2: w", vs[0].numpy(), w)
        check(f"{label} cycle {cycle} pass 2: s", vs[1].numpy(), s)
    assert int(opt.iterations.numpy()) == 4, (label, opt.iterations)
    assert int(opt._agg_helper.counter.numpy()) == 0, label
    print(f"rank {RANK} {label}: ok", flush=True)


def apply_only(label: str, make_opt: Callable[[], Any], graph: bool) -> None:
    """fastps's own form (gradients from a plain tape, reduced in ``apply_gradients``)
    with a scalar variable."""
    vs = variables()
    opt = hvd.DistributedOptimizer(make_opt(), op=hvd.Sum)

    def step() -> None:
        with tf.GradientTape() as tape:
            value = loss_of(vs)()
        opt.apply_gradients(zip(tape.gradient(value, vs), vs))

    (tf.function(step) if graph else step)()
    check(f"{label}: w", vs[0].numpy(), W0 - LR * SUM_X)
    check(f"{label}: s", vs[1].numpy(), S0 - LR * SUM_C)
    print(f"rank {RANK} {label}: ok", flush=True)


def main() -> None:
    optimizers: Dict[str, Callable[[], Any]]
    if KERAS2:
        optimizers = {
            "current": lambda: keras.optimizers.SGD(LR),
            "legacy": lambda: keras.optimizers.legacy.SGD(LR),
        }
    else:
        optimizers = {"keras3": lambda: keras.optimizers.SGD(LR)}
    for kind, make_opt in optimizers.items():
        for graph in (False, True):
            mode = "graph" if graph else "eager"
            reduced_once(f"{kind} {mode} callable loss", make_opt, graph, tape_loss=False)
            reduced_once(f"{kind} {mode} tape loss", make_opt, graph, tape_loss=True)
            aggregated(f"{kind} {mode} N=2", make_opt, graph)
            apply_only(f"{kind} {mode} apply only", make_opt, graph)
    print(f"rank {RANK} OK", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
