"""1-bit Adam for Keras (plugins/tensorflow/algorithms/onebit_adam.py, docs/guide/algorithms.md).

In this process: bad settings are refused naming the culprit (the torch version's words);
the warm-up is Adam's step (torch.optim.Adam's formula, float64, against numpy) and after it
the variance stays frozen and the step follows the algorithm's formula on the local
momentum (no DistributedOptimizer: nothing to exchange), eagerly and in a tf.function.

On 2 real workers (one job, shared memory off so every push crosses a socket): after every
compressed step each replica's averaged m / D has one magnitude (the onebit codec's output
for a one-part tensor) and every replica holds the same momentum and variables; a small
classifier trained with ``model.fit`` ends at a loss comparable to plain Adam's while
sending at least 4x fewer bytes after the warm-up (the core's socket byte counters).

This file is also the worker: ``python test_tf_onebit_adam.py worker``.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

LR = 2.0**-6  # exact in float32 (Keras keeps the learning rate in a float32 variable)
FREEZE = 12  # warm-up of the model.fit runs
BATCHES = 16  # per epoch and worker, of 32 samples
STEPS = 3 * BATCHES  # model.fit steps (3 epochs)


def _adam_reference(
    x0: np.ndarray, grads: List[np.ndarray], lr: float, wd: float, freeze: int
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """1-bit Adam on one worker in float64 numpy: torch.optim.Adam's step for ``freeze``
    steps, then the frozen-variance step on the local momentum. (x, m, v) after."""
    b1, b2, eps = 0.9, 0.999, 1e-8
    x, m, v = x0.copy(), np.zeros_like(x0), np.zeros_like(x0)
    denom = None
    for k, g in enumerate(grads):
        t = k + 1
        g = g + wd * x
        m = m + (1 - b1) * (g - m)
        if k < freeze:
            v = v * b2 + (1 - b2) * (g * g)
            x = x - lr / (1 - b1**t) * (m / (np.sqrt(v) / np.sqrt(1 - b2**t) + eps))
        else:
            if denom is None:
                denom = np.sqrt(v) / np.sqrt(1 - b2**freeze) + eps
            x = x - lr / (1 - b1**t) * (m / denom)
    return x, m, v


# ---------------------------------------------------------------- the worker


def _replicas(hvd: Any, tf: Any, keras: Any) -> None:
    """4 steps at freeze_step=2 on each rank's own data (2 eager, 2 in a tf.function):
    after each compressed step m / D is one magnitude, and the replicas agree."""
    from fastps.tensorflow.algorithms import OneBitAdam, OneBitAdamAlgorithm

    rank = hvd.rank()
    keras.utils.set_random_seed(5)
    model = keras.Sequential(
        [
            keras.Input((7,), dtype="float64"),
            keras.layers.Dense(6, activation="tanh", dtype="float64"),
            keras.layers.Dense(3, dtype="float64"),
        ]
    )
    opt = hvd.DistributedOptimizer(OneBitAdam(lr=0.01, freeze_step=2))
    assert isinstance(opt._fastps_runner.algorithm, OneBitAdamAlgorithm)
    hvd.broadcast_variables(model.variables, root_rank=0)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def step(x: Any, y: Any) -> None:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x))
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

    graph_step = tf.function(step)
    for k in range(4):
        rng = np.random.default_rng(100 * rank + k)
        x = rng.standard_normal((16, 7))
        y = rng.integers(0, 3, 16)
        (step if k < 2 else graph_step)(tf.constant(x), tf.constant(y))
        state = []
        for i, v in enumerate(model.trainable_variables):
            m, _vel, d = (s.numpy() for s in opt._slots(v))
            if k >= 2:  # compressed: the average of m / D is sign x one scale
                mags = np.abs(m / d)
                assert np.allclose(mags, mags.flat[0], rtol=1e-6), (i, k, mags)
            state += [v.numpy().ravel(), m.ravel()]
        flat = np.concatenate(state)
        both = hvd.allgather(tf.expand_dims(tf.constant(flat), 0)).numpy()
        assert np.array_equal(both[0], both[1]), f"the replicas differ after step {k}"
    print(f"rank {rank} ONEBIT OK replicas", flush=True)


def _task(rank: int, size: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A 4-class problem from a fixed random teacher: this rank's training shard and the
    common evaluation set."""
    rng = np.random.default_rng(7)
    teacher = rng.standard_normal((32, 4))
    n = 32 * BATCHES * size + 1024
    x = rng.standard_normal((n, 32)).astype(np.float32)
    y = np.argmax(np.tanh(x @ teacher) + 0.3 * rng.standard_normal((n, 4)), axis=1)
    train_x, train_y = x[: n - 1024][rank::size], y[: n - 1024][rank::size]
    return train_x, train_y, x[n - 1024 :], y[n - 1024 :]


def _fit(hvd: Any, tf: Any, keras: Any, which: str) -> Tuple[float, float, int, int]:
    """(evaluation loss, accuracy, bytes sent in the warm-up, after it) of one model.fit."""
    from fastps.tensorflow.algorithms import OneBitAdam
    from fastps.worker import api

    rank, size = hvd.rank(), hvd.size()
    x, y, ex, ey = _task(rank, size)
    keras.utils.set_random_seed(11)
    model = keras.Sequential(
        [keras.Input((32,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(4)]
    )
    lr = 4e-3 * size
    inner = OneBitAdam(lr=lr, freeze_step=FREEZE) if which == "onebit" else None
    if inner is None:
        inner = keras.optimizers.Adam(lr, epsilon=1e-8)
    model.compile(
        optimizer=hvd.DistributedOptimizer(inner),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    hvd.broadcast_variables(model.variables, root_rank=0)
    marks: Dict[str, int] = {}

    class Bytes(keras.callbacks.Callback):  # type: ignore[misc]
        def on_train_begin(self, logs: Any = None) -> None:
            marks["start"] = api.data_path_stats()["socket_bytes_sent"]

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if int(self.model.optimizer.iterations.numpy()) == FREEZE:
                marks["freeze"] = api.data_path_stats()["socket_bytes_sent"]

        def on_train_end(self, logs: Any = None) -> None:
            marks["end"] = api.data_path_stats()["socket_bytes_sent"]

    epochs = STEPS // BATCHES
    model.fit(x, y, batch_size=32, epochs=epochs, shuffle=False, verbose=0, callbacks=[Bytes()])
    assert int(model.optimizer.iterations.numpy()) == STEPS
    logits = model(ex).numpy()
    z = logits - logits.max(axis=1, keepdims=True)
    loss = float(np.mean(np.log(np.exp(z).sum(axis=1)) - z[np.arange(len(ey)), ey]))
    acc = float(np.mean(np.argmax(logits, axis=1) == ey))
    flat = np.concatenate([v.numpy().ravel() for v in model.trainable_variables])
    both = hvd.allgather(tf.expand_dims(tf.constant(flat), 0)).numpy()
    assert np.array_equal(both[0], both[1]), f"{which}: the replicas differ"
    return loss, acc, marks["freeze"] - marks["start"], marks["end"] - marks["freeze"]


def worker() -> int:
    import fastps.tensorflow as hvd
    import keras
    import tensorflow as tf

    hvd.init()
    _replicas(hvd, tf, keras)
    for which in ("adam", "onebit"):
        loss, acc, warm, after = _fit(hvd, tf, keras, which)
        print(
            f"rank {hvd.rank()} FIT {which} loss={loss:.4f} acc={acc:.4f} "
            f"warmup_bytes={warm} after_bytes={after}",
            flush=True,
        )
    hvd.shutdown()
    return 0


# ---------------------------------------------------------------- in this process

if __name__ != "__main__":
    import pytest

    def _variable(value: np.ndarray) -> Any:
        import keras

        return keras.Variable(value, dtype=str(value.dtype))

    @pytest.mark.parametrize(
        "kwargs, exc, needle",
        [
            ({"freeze_step": -1}, ValueError, "freeze_step (the warm-up) must be >= 1, got -1"),
            ({"freeze_step": 0}, ValueError, "freeze_step (the warm-up) must be >= 1, got 0"),
            ({"freeze_step": 2.5}, TypeError, "freeze_step must be an int"),
            ({"betas": (1.0, 0.999)}, ValueError, "betas[0] must be in [0, 1)"),
            ({"eps": 0.0}, ValueError, "eps must be > 0"),
            ({"lr": float("nan")}, ValueError, "lr must be finite"),
            ({"weight_decay": -0.1}, ValueError, "weight_decay must be >= 0"),
            ({"clipnorm": 1.0}, ValueError, "clipnorm=1.0 is not supported"),
            ({"lr": 0.1, "learning_rate": 0.2}, ValueError, "give lr or learning_rate"),
        ],
    )
    def test_bad_settings_refused(kwargs: Dict[str, Any], exc: type, needle: str) -> None:
        from fastps.tensorflow.algorithms import OneBitAdam

        with pytest.raises(exc) as info:
            OneBitAdam(**kwargs)
        assert needle in str(info.value)

    def test_bad_dtype_compression_and_wrappers_refused() -> None:
        import fastps.tensorflow as hvd
        import keras
        import tensorflow as tf
        from fastps.errors import FastPSError
        from fastps.tensorflow.algorithms import LocalSGD, OneBitAdam, OneBitAdamAlgorithm

        opt = OneBitAdam()
        half = keras.Variable(np.zeros((2, 3), np.float16), dtype="float16", name="half")
        with pytest.raises(FastPSError, match="parameter 'half' has dtype float16; supported"):
            opt.apply([tf.zeros((2, 3), tf.float16)], [half])
        with pytest.raises(ValueError, match="compression must be one of the core's compressors"):
            OneBitAdam(compression=hvd.Compression.fp16)
        with pytest.raises(TypeError, match="needs a fastps.tensorflow.algorithms.OneBitAdam"):
            hvd.DistributedOptimizer(keras.optimizers.Adam(), algorithm=OneBitAdamAlgorithm())
        with pytest.raises(ValueError, match="algorithm OneBitAdamAlgorithm decides what it"):
            hvd.DistributedOptimizer(OneBitAdam(), compression=hvd.Compression.fp16)
        with pytest.raises(FastPSError, match="runs with op=Average only"):
            hvd.DistributedOptimizer(OneBitAdam(), op=hvd.Sum)
        with pytest.raises(ValueError, match="takes no backward_passes_per_step .got 2"):
            hvd.DistributedOptimizer(
                keras.optimizers.SGD(), algorithm=LocalSGD(2), backward_passes_per_step=2
            )
        with pytest.raises(TypeError, match="algorithm must be a fastps.tensorflow.algorithms"):
            hvd.DistributedOptimizer(keras.optimizers.SGD(), algorithm="local")
        config = hvd.DistributedOptimizer(OneBitAdam(lr=0.5, freeze_step=7)).get_config()
        assert (config["learning_rate"], config["freeze_step"]) == (0.5, 7), config
        assert config["compression"] == "onebit:ef", config

    @pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
    def test_warmup_is_adam_then_the_frozen_variance_step(graph: bool) -> None:
        import tensorflow as tf
        from fastps.tensorflow.algorithms import OneBitAdam

        rng = np.random.default_rng(0)
        x0 = rng.standard_normal((3, 4))
        grads = [rng.standard_normal((3, 4)) for _ in range(12)]
        freeze = 5
        w = _variable(x0)
        opt = OneBitAdam(lr=LR, weight_decay=0.01, freeze_step=freeze)

        def step(g: Any) -> None:
            opt.apply([g], [w])

        run = tf.function(step) if graph else step
        for k, g in enumerate(grads):
            run(tf.constant(g))
            x, m, v = _adam_reference(x0, grads[: k + 1], LR, 0.01, freeze)
            mom, vel, _d = (s.numpy() for s in opt._slots(w))
            if graph:  # fused kernels may round differently
                np.testing.assert_allclose(w.numpy(), x, rtol=1e-12, atol=1e-15)
            else:  # the same operations in the same order: bit for bit
                assert np.array_equal(w.numpy(), x), (k, w.numpy() - x)
                assert np.array_equal(vel, v), k
            np.testing.assert_allclose(mom, m, rtol=1e-12, atol=1e-15)
            np.testing.assert_allclose(vel, v, rtol=1e-12, atol=1e-15)

    # ------------------------------------------------------------ on real workers

    def test_two_workers_replicas_agree_and_fewer_bytes_at_comparable_loss() -> None:
        from tfjobs import fastpsrun, tail

        p = fastpsrun(2, [str(Path(__file__)), "worker"], timeout=240, env={"FASTPS_SHM": "0"})
        assert p.returncode == 0, tail(p)
        assert p.stdout.count("ONEBIT OK replicas") == 2, tail(p)
        fits = re.findall(
            r"rank 0 FIT (\w+) loss=([0-9.]+) acc=([0-9.]+) warmup_bytes=(\d+) after_bytes=(\d+)",
            p.stdout,
        )
        got = {w: (float(loss), float(acc), int(b0), int(b1)) for w, loss, acc, b0, b1 in fits}
        assert set(got) == {"adam", "onebit"}, tail(p)
        adam, onebit = got["adam"], got["onebit"]
        print(f"adam {adam}\nonebit {onebit}\nratio after warm-up {adam[3] / onebit[3]:.1f}")
        assert onebit[0] <= adam[0] * 1.1 + 0.02, (adam, onebit)  # comparable loss
        assert onebit[1] >= adam[1] - 0.03, (adam, onebit)
        assert adam[3] / onebit[3] >= 4.0, (adam, onebit)


if __name__ == "__main__":
    if sys.argv[1:] == ["worker"]:
        sys.exit(worker())
    sys.exit(f"usage: {sys.argv[0]} worker")
