"""Local SGD and DiLoCo for Keras (plugins/tensorflow/algorithms/local_sgd.py,
docs/guide/local-sgd.md).

On 2 real workers (one job): the inner optimizer is SGD at learning rate 1 on known
gradients, so each worker's delta is known, and every step's variables equal a float64
numpy reference of the servers' outer step: plain averaging (``LocalSGD(H=2)``, eagerly) and
SGD with Nesterov momentum (``DiLoCo(H=3)``, inside a ``tf.function``), over a float64 and a
float32 variable, starting from rank 0's values; ``model.fit`` with ``LocalSGD(H=4)`` and
fp16 deltas (``compression=hvd.Compression.fp16``) takes an outer step every 4 steps and
ends, after ``outer_step()``, with the same model on every worker; a bfloat16 variable is
refused naming it. In this process: bad settings and wrappers are refused naming the value
(the torch version's words).

This file is also the worker: ``python test_tf_local_sgd.py worker``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

SHAPES = {"float64": (5, 3), "float32": (7,)}


def _grad(rank: int, step: int, dtype: str) -> np.ndarray:
    rng = np.random.default_rng(1000 * rank + 10 * step + len(dtype))
    return rng.standard_normal(SHAPES[dtype]).astype(dtype)


def _start(rank: int, dtype: str) -> np.ndarray:
    return np.random.default_rng(50 + rank).standard_normal(SHAPES[dtype]).astype(dtype)


class _Reference:
    """The servers' outer rule in float64 (docs/guide/local-sgd.md) and each worker's SGD
    steps at learning rate 1, for one variable."""

    def __init__(self, dtype: str, size: int, lr: float, momentum: float, nesterov: bool):
        self.dtype, self.size = dtype, size
        self.lr, self.momentum, self.nesterov = lr, momentum, nesterov
        self.master = _start(0, dtype).astype(np.float64)  # rank 0's values win
        self.anchor = _start(0, dtype)
        self.local = [self.anchor.copy() for _ in range(size)]
        self.buf = np.zeros_like(self.master)

    def local_step(self, step: int) -> None:
        for r in range(self.size):
            self.local[r] = self.local[r] - _grad(r, step, self.dtype)

    def outer_step(self) -> None:
        mean = sum((x - self.anchor).astype(np.float64) for x in self.local) / self.size
        g = -mean
        self.buf = self.momentum * self.buf + g
        u = g + self.momentum * self.buf if self.nesterov else self.buf
        self.master = self.master - self.lr * u
        self.anchor = self.master.astype(self.dtype)
        self.local = [self.anchor.copy() for _ in range(self.size)]


def _known_deltas(hvd: Any, tf: Any, keras: Any, algo: Any, steps: int, graph: bool) -> None:
    rank, size = hvd.rank(), hvd.size()
    variables = [keras.Variable(_start(rank, d), dtype=d, name=f"w_{d}") for d in SHAPES]
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=1.0), algorithm=algo)
    c = algo.config
    refs = [_Reference(d, size, c.lr, c.momentum, c.nesterov) for d in SHAPES]

    def step(*grads: Any) -> None:
        opt.apply(list(grads), variables)

    run = tf.function(step) if graph else step
    for k in range(steps):
        run(*[tf.constant(_grad(rank, k, d)) for d in SHAPES])
        for ref in refs:
            ref.local_step(k)
        if (k + 1) % algo.H == 0:
            for ref in refs:
                ref.outer_step()
        assert algo.local_steps == (k + 1) % algo.H, (k, algo.local_steps)
        assert algo.outer_steps == (k + 1) // algo.H, (k, algo.outer_steps)
        for v, ref in zip(variables, refs):
            want = ref.local[rank]
            if ref.dtype == "float64":
                np.testing.assert_allclose(v.numpy(), want, rtol=1e-12, atol=1e-14, err_msg=str(k))
            else:
                np.testing.assert_allclose(v.numpy(), want, rtol=1e-6, atol=1e-6, err_msg=str(k))
    print(f"rank {rank} LOCALSGD OK {algo!r} graph={graph}", flush=True)


def _fit(hvd: Any, tf: Any, keras: Any) -> None:
    from fastps.tensorflow.algorithms import LocalSGD

    rank, size = hvd.rank(), hvd.size()
    rng = np.random.default_rng(3)
    x = rng.standard_normal((size * 16 * 9, 6)).astype(np.float32)
    y = x @ rng.standard_normal((6, 1)).astype(np.float32)
    keras.utils.set_random_seed(rank)  # different initial values: rank 0's win
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8), keras.layers.Dense(1)])
    algo = LocalSGD(H=4)
    # Horovod's fp16 spelling, handed to the algorithm: the deltas travel as the core's fp16
    opt = hvd.DistributedOptimizer(
        keras.optimizers.Adam(0.01), algorithm=algo, compression=hvd.Compression.fp16
    )
    assert "compression=Compression(fp16)" in repr(algo), repr(algo)
    model.compile(optimizer=opt, loss="mse")
    hist = model.fit(x[rank::size], y[rank::size], batch_size=16, epochs=2, verbose=0)
    # 18 steps: 4 outer steps, 2 local steps since the last
    assert (algo.local_steps, algo.outer_steps) == (2, 4), (algo.local_steps, algo.outer_steps)
    losses = hist.history["loss"]
    assert losses[-1] < losses[0], losses
    algo.outer_step()
    assert (algo.local_steps, algo.outer_steps) == (0, 5), (algo.local_steps, algo.outer_steps)
    flat = np.concatenate([v.numpy().ravel() for v in model.trainable_variables])
    both = hvd.allgather(tf.expand_dims(tf.constant(flat), 0)).numpy()
    assert np.array_equal(both[0], both[1]), "the replicas differ after outer_step()"
    print(f"rank {rank} LOCALSGD OK fit outer={algo.outer_steps} loss={losses}", flush=True)


def _refused(hvd: Any, tf: Any, keras: Any) -> None:
    from fastps.errors import FastPSError
    from fastps.tensorflow.algorithms import DiLoCo

    v = keras.Variable(np.zeros(3), dtype="bfloat16", name="bf")
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), algorithm=DiLoCo(H=2))
    try:
        opt.apply([tf.zeros(3, tf.bfloat16)], [v])
    except FastPSError as exc:
        assert "local SGD parameter '0.bf': dtype bfloat16 is not supported" in str(exc), exc
    else:
        raise AssertionError("a bfloat16 variable was not refused")
    print(f"rank {hvd.rank()} LOCALSGD OK refusals", flush=True)


def worker() -> int:
    import fastps.tensorflow as hvd
    import keras
    import tensorflow as tf
    from fastps.tensorflow.algorithms import DiLoCo, LocalSGD

    hvd.init()
    _known_deltas(hvd, tf, keras, LocalSGD(H=2), steps=4, graph=False)
    _known_deltas(hvd, tf, keras, DiLoCo(H=3), steps=6, graph=True)
    _fit(hvd, tf, keras)
    _refused(hvd, tf, keras)
    hvd.shutdown()
    return 0


if __name__ != "__main__":
    import pytest

    @pytest.mark.shared_check("keras3", "local-sgd")
    def test_two_workers_match_the_outer_step_reference(shared_check: Any) -> None:
        from tfjobs import tail

        p = shared_check  # this file's worker(), in a shared job (tests/tensorflow/tfjobs.py)
        assert p.returncode == 0, tail(p)
        for what in ("LocalSGD(H=2", "DiLoCo(H=3", "fit outer=5", "refusals"):
            assert p.stdout.count(f"LOCALSGD OK {what}") == 2, (what, tail(p))

    def test_bad_settings_name_the_culprit() -> None:
        from algorithm_refusals import assert_local_sgd_refusals
        from fastps.tensorflow.algorithms import DiLoCo, LocalSGD

        assert_local_sgd_refusals(LocalSGD, DiLoCo)

    def test_wrapper_refusals_name_the_reason() -> None:
        import fastps
        import fastps.tensorflow as hvd
        import keras
        from fastps.errors import FastPSError
        from fastps.tensorflow.algorithms import DiLoCo, LocalSGD

        with pytest.raises(ValueError, match=r"algorithm=DiLoCo\(H=2.*cannot run asynchron"):
            hvd.DistributedOptimizer(
                keras.optimizers.SGD(), algorithm=DiLoCo(H=2), **{"async": True}
            )
        with pytest.raises(FastPSError, match="algorithm LocalSGD runs with op=Average only"):
            hvd.DistributedOptimizer(keras.optimizers.SGD(), algorithm=LocalSGD(2), op=hvd.Sum)
        with pytest.raises(ValueError, match="LocalSGD: compression must be one of the core's"):
            LocalSGD(2, compression=hvd.Compression.none)
        with pytest.raises(ValueError, match="DiLoCo: compression=.*name two compressors"):
            hvd.DistributedOptimizer(
                keras.optimizers.SGD(),
                algorithm=DiLoCo(2, compression=fastps.Compression.onebit(error_feedback=True)),
                compression=hvd.Compression.fp16,
            )
        with pytest.warns(UserWarning, match="cross-barrier updates off: algorithm LocalSGD"):
            hvd.DistributedOptimizer(
                keras.optimizers.SGD(), algorithm=LocalSGD(2), cross_barrier=True
            )
        tf_keras = pytest.importorskip("tf_keras")
        with pytest.raises(ValueError, match="LocalSGD needs a Keras 3 optimizer"):
            hvd.DistributedOptimizer(tf_keras.optimizers.SGD(), algorithm=LocalSGD(2))


if __name__ == "__main__":
    if sys.argv[1:] == ["worker"]:
        sys.exit(worker())
    sys.exit(f"usage: {sys.argv[0]} worker")
