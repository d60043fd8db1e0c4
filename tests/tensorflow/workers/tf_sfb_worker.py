"""Sufficient-factor broadcasting of Keras 3 Dense kernels against the dense path, float64.

Every case trains two copies of one model from the same initial weights on this rank's own
data: one under FASTPS_SFB=off (every gradient through the servers), one under
FASTPS_SFB=on or auto (the chosen kernels' factors allgathered and rebuilt), and compares
the weights after several steps. Also: the choices of ``auto``, the fallback of a graph
traced without a batch size, and the error for a loss term on a factored kernel. Prints
"rank R OK" at the end.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

from typing import Any, Callable, List, Optional  # noqa: E402

import fastps.tensorflow.keras as hvd  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from fastps.tensorflow import DistributedGradientTape, FastPSError, add_process_set  # noqa: E402

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
F64 = "float64"


def say(msg: str) -> None:
    print(f"rank {RANK} {msg}", flush=True)


class Net(keras.Model):
    """A Dense with a fused activation, one applied twice, one only rank 0 runs (when
    ``extra``), and a head; 3-D inputs (batch, positions, features)."""

    def __init__(self, width: int = 8) -> None:
        super().__init__(dtype=F64)
        self.a = keras.layers.Dense(width, activation="tanh", dtype=F64)
        self.b = keras.layers.Dense(width, activation="relu", dtype=F64)
        self.only0 = keras.layers.Dense(width, dtype=F64)
        self.head = keras.layers.Dense(2, dtype=F64)
        self.extra = False

    def call(self, x: Any) -> Any:
        h = self.b(self.b(self.a(x)))
        if self.extra:
            h = h + self.only0(h)
        return self.head(h)


def make_net() -> Net:
    keras.utils.set_random_seed(7)  # the same weights on every rank and in both copies
    net = Net()
    net.extra = True
    net(np.zeros((1, 3, 5)))  # builds every layer
    net.extra = False
    return net


def data(step: int, rows: int = 4, shape: tuple = (3, 5)) -> tuple:
    rng = np.random.RandomState(100 * RANK + step)  # every rank its own data
    return rng.randn(rows, *shape), rng.randn(rows, *shape[:-1], 2)


def weights(model: Any) -> List[np.ndarray]:
    return [np.array(v.numpy()) for v in model.trainable_variables]


def with_mode(mode: str, fn: Callable[[], Any]) -> Any:
    os.environ["FASTPS_SFB"] = mode
    try:
        return fn()
    finally:
        os.environ["FASTPS_SFB"] = "off"


def compare(label: str, got: List[np.ndarray], want: List[np.ndarray], exact: bool) -> None:
    assert len(got) == len(want), label
    for i, (a, b) in enumerate(zip(got, want)):
        if exact:
            assert np.array_equal(a, b), f"{label}: variable {i} differs: {np.abs(a - b).max()}"
        else:
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12, err_msg=f"{label}: var {i}")
    # and the same on every rank
    for i, a in enumerate(got):
        every = hvd.allgather(tf.constant(a[None])).numpy()
        assert all(np.array_equal(every[0], e) for e in every[1:]), f"{label}: var {i} ranks"


def exchanges(sfb: Any) -> int:
    return 0 if sfb is None else sfb.exchanges


# ------------------------------------------------------------------ integer, bit for bit


def integer_case() -> None:
    """Integer weights and data, ReLU and a sum loss: every gradient is an exact sum, so
    the factors' rebuild equals the servers' sum bit for bit."""

    def make() -> Any:
        rng = np.random.RandomState(3)
        model = keras.Sequential(
            [keras.layers.Dense(6, activation="relu", dtype=F64), keras.layers.Dense(3, dtype=F64)]
        )
        model.build((None, 5))
        model.set_weights([rng.randint(-3, 4, w.shape).astype(F64) for w in model.get_weights()])
        return model

    def run(mode: str) -> tuple:
        model = make()
        opt = keras.optimizers.SGD(0.25)  # the tape reduces
        sfb = None
        for step in range(4):
            x = np.random.RandomState(10 * RANK + step).randint(-2, 3, (4, 5)).astype(F64)
            with tf.GradientTape() as raw:
                loss = tf.reduce_sum(model(x, training=True))
            tape = with_mode(mode, lambda: DistributedGradientTape(raw, model=model))
            sfb = tape._reducer.sfb
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply(grads, model.trainable_variables)
        return weights(model), exchanges(sfb)

    dense, n_dense = run("off")
    factored, n = run("on")
    # Two kernels; the tape is made after the forward pass (Horovod style), so the first
    # step captured nothing and used the servers, the three others the factors.
    assert n_dense == 0 and n == 2 * 3, (n_dense, n)
    compare("integer tape", factored, dense, exact=True)
    say("integer tape: ok")


# ------------------------------------------------------------------ custom loops


def tape_case(graph: bool, process_set: Any = None) -> None:
    """Five momentum steps with DistributedGradientTape, eagerly or in tf.function (in a
    process set: its broadcast and allgather, and the dense path's through the layer)."""

    def run(mode: str) -> tuple:
        net = make_net()
        net.extra = RANK == 0  # rank 1 never runs only0: zero rows, zero dense gradient
        opt = keras.optimizers.SGD(0.05, momentum=0.9)
        holder: List[Any] = []

        def step(x: Any, y: Any) -> None:
            # the tf.Variables: ZERO fills need a tf.DType (a Keras variable's is a str)
            sources = [v.value for v in net.trainable_variables]
            # Recording with the distributed tape: the layers are patched before the
            # forward pass, so even the first step (and the first trace) has factors.
            tape = with_mode(
                mode, lambda: DistributedGradientTape(model=net, process_set=process_set)
            )
            holder[:] = [tape._reducer.sfb]
            with tape:
                tape.watch(sources)  # the same watch order (priorities) on both ranks
                loss = tf.reduce_mean(tf.square(net(x, training=True) - y))
            grads = tape.gradient(loss, sources, unconnected_gradients=tf.UnconnectedGradients.ZERO)
            opt.apply(grads, net.trainable_variables)

        fn = tf.function(step) if graph else step
        for k in range(5):
            x, y = data(k)
            fn(tf.constant(x), tf.constant(y))
        return weights(net), exchanges(holder[0])

    dense, _ = run("off")
    factored, n = run("on")
    assert n == 4 * 5, n  # a, b, only0, head: every kernel by factors, five steps
    label = f"tape {'graph' if graph else 'eager'}{'' if process_set is None else ' set'}"
    compare(label, factored, dense, exact=False)
    say(f"{label}: ok")


def fit_case() -> None:
    """model.fit with DistributedOptimizer(model=...): Keras traces one train step."""

    def run(mode: str) -> tuple:
        net = make_net()
        opt = with_mode(
            mode,
            lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9), model=net),
        )
        net.compile(optimizer=opt, loss="mse", jit_compile=False)
        # 18 rows: the last batch of each epoch has 2 rows, which Keras runs in a second
        # trace without a static batch size (the choice is made by then)
        x, y = data(50, rows=18)
        net.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
        return weights(net), exchanges(opt._fastps_reducer.sfb)

    dense, _ = run("off")
    factored, n = run("on")
    assert n == 3 * 10, n  # a, b, head (only0 never runs: its gradient is None), 10 steps
    compare("fit", factored, dense, exact=False)
    say("fit: ok")


# ------------------------------------------------------------------ choices, fallbacks


def auto_case() -> None:
    """auto: a 256x256 kernel at 4 rows by factors, a 256x2 head by the servers; a graph
    traced without a batch size keeps the servers."""
    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [
            keras.layers.Dense(256, dtype=F64, name="wide"),
            keras.layers.Dense(2, dtype=F64, name="head"),
        ]
    )
    model.build((None, 256))
    x = np.random.RandomState(RANK).randn(4, 256)
    opt = with_mode(
        "auto", lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(0.01), model=model)
    )
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(x, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply(grads, model.trainable_variables)
    sfb = opt._fastps_reducer.sfb
    assert [e.chosen for e in sfb.layers] == [True, False], [e.label for e in sfb.layers]
    assert sfb.exchanges == 1, sfb.exchanges

    # Traced with an unknown batch dimension: the rows are not known, auto keeps servers.
    keras.utils.set_random_seed(1)
    other = keras.Sequential([keras.layers.Dense(256, dtype=F64, name="traced")])
    other.build((None, 256))
    opt2 = with_mode(
        "auto", lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(0.01), model=other)
    )

    @tf.function(input_signature=[tf.TensorSpec([None, 256], tf.float64)])
    def step(x: Any) -> None:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(other(x, training=True))
        opt2.apply(tape.gradient(loss, other.trainable_variables), other.trainable_variables)

    step(tf.constant(x))
    sfb2 = opt2._fastps_reducer.sfb
    assert [e.chosen for e in sfb2.layers] == [False] and sfb2.exchanges == 0
    say("auto: ok")


def error_case() -> None:
    """A loss term on a factored kernel: the local factors do not rebuild the local
    gradient; an error naming the layer, not a different gradient."""
    keras.utils.set_random_seed(2)
    model = keras.Sequential([keras.layers.Dense(4, dtype=F64, name="penalised")])
    model.build((None, 3))
    layer = model.layers[0]
    x = np.random.RandomState(RANK).randn(4, 3)
    tape = with_mode("on", lambda: DistributedGradientTape(model=model))
    with tape:
        loss = tf.reduce_sum(model(x, training=True)) + tf.reduce_sum(tf.square(layer.kernel))
    err: Optional[BaseException] = None
    try:
        tape.gradient(loss, model.trainable_variables)
    except FastPSError as exc:
        err = exc
    assert err is not None and "penalised/kernel" in str(err), err

    # The same inside tf.function: the check runs in the start op, which fails the step.
    keras.utils.set_random_seed(2)
    model = keras.Sequential([keras.layers.Dense(4, dtype=F64, name="penalised_graph")])
    model.build((None, 3))
    layer = model.layers[0]

    @tf.function
    def step(x: Any) -> Any:
        tape = with_mode("on", lambda: DistributedGradientTape(model=model))
        with tape:
            out = tf.reduce_sum(model(x, training=True))
            loss = out + tf.reduce_sum(tf.square(layer.kernel))
        return tape.gradient(loss, model.trainable_variables)

    err = None
    try:
        step(tf.constant(x))
    except tf.errors.OpError as exc:
        err = exc
    assert err is not None and "penalised_graph/kernel" in str(err), err
    say("error: ok")


integer_case()
tape_case(graph=False)
tape_case(graph=True)
tape_case(graph=False, process_set=add_process_set([0, 1]))
fit_case()
auto_case()
error_case()
hvd.barrier()
say("OK")
