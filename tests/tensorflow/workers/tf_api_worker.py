"""Every fastps.tensorflow function on every dtype, eagerly and inside tf.function.

Run under fastpsrun with any number of workers; each worker prints "rank R OK" at the end.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

from typing import Any, Callable  # noqa: E402

import fastps.tensorflow as hvd  # noqa: E402
import fastps.tensorflow.keras as hvdk  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.get_logger().setLevel("ERROR")

DTYPES = [
    tf.float16,
    tf.bfloat16,
    tf.float32,
    tf.float64,
    tf.int8,
    tf.uint8,
    tf.int16,
    tf.int32,
    tf.int64,
    tf.bool,
]


def value(r: int, dtype: tf.DType, rows: int = 2) -> np.ndarray:
    base = (np.arange(rows * 3).reshape(rows, 3) % 5) + r
    if dtype == tf.bool:
        return base % 2 == 0
    return base.astype(dtype.as_numpy_dtype)


def close(got: Any, want: np.ndarray, what: str) -> None:
    got = np.asarray(got.numpy() if hasattr(got, "numpy") else got)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    ok = (
        np.array_equal(got, want)
        if want.dtype.kind in "biu"
        else np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-2)
    )
    assert ok, (what, got, want)


def both_modes(fn: Callable[..., Any], *args: Any) -> list:
    """fn(*args) eagerly, then twice through one tf.function (the second run reuses the
    graph, its names and the checked consistency)."""
    graph = tf.function(fn)
    return [fn(*args), graph(*args), graph(*args)]


def check_collectives(r: int, n: int) -> None:
    root = n - 1
    for dtype in DTYPES:
        x = tf.constant(value(r, dtype))
        parts = [value(q, dtype) for q in range(n)]
        if dtype == tf.bool:
            total = np.logical_or.reduce(parts)
        else:
            total = sum(p.astype(np.float64) for p in parts)
        tag = dtype.name

        def summed(t: tf.Tensor, tag: str = tag) -> tf.Tensor:
            return hvd.push_pull(t, op=hvd.Sum, name=f"sum.{tag}")

        for out in both_modes(summed, x):
            close(out, np.asarray(total).astype(dtype.as_numpy_dtype), f"sum {tag}")
            assert out.dtype == dtype
        if dtype != tf.bool:
            # Even sum so the (truncating) integer average is exact.
            even = tf.constant(value(0, dtype) * 2 if dtype.is_integer else value(r, dtype))
            want = (
                value(0, dtype) * 2
                if dtype.is_integer
                else (total / n).astype(dtype.as_numpy_dtype)
            )
            for out in both_modes(lambda t, tag=tag: hvd.allreduce(t, name=f"avg.{tag}"), even):
                close(out, np.asarray(want), f"average {tag}")

        def asynchronous(t: tf.Tensor, tag: str = tag) -> tf.Tensor:
            h = hvd.push_pull_async(t, op=hvd.Sum, name=f"async.{tag}")
            hvd.poll(h)
            return hvd.synchronize(h)

        for out in both_modes(asynchronous, x):
            close(out, np.asarray(total).astype(dtype.as_numpy_dtype), f"async {tag}")

        mine = tf.constant(value(r, dtype, rows=r + 1))
        gathered = np.concatenate([value(q, dtype, rows=q + 1) for q in range(n)])
        for out in both_modes(lambda t, tag=tag: hvd.allgather(t, name=f"gather.{tag}"), mine):
            close(out, gathered, f"allgather {tag}")

        for out in both_modes(lambda t, tag=tag: hvd.broadcast(t, root, name=f"bcast.{tag}"), x):
            close(out, value(root, dtype), f"broadcast {tag}")

        scalar = tf.constant(value(r, dtype)[0, 0])
        out = hvd.push_pull(scalar, op=hvd.Sum, name=f"scalar.{tag}")
        assert out.shape == (), out.shape
        empty = tf.zeros([0, 3], dtype)
        # (Averaging a bool is refused, as Horovod does; Sum is logical OR.)
        op = hvd.Sum if dtype == tf.bool else hvd.Average
        assert hvd.push_pull(empty, op=op, name=f"empty.{tag}").shape == (0, 3)
    # Unsigned dtypes without arithmetic in the core travel bit for bit through the ops
    # that only move data, and are refused by reductions.
    for dtype in (tf.uint16, tf.uint32, tf.uint64):
        big = np.iinfo(dtype.as_numpy_dtype).max
        mine = tf.constant(np.full([r + 1, 2], big - r, dtype.as_numpy_dtype))
        gathered = np.concatenate(
            [np.full([q + 1, 2], big - q, dtype.as_numpy_dtype) for q in range(n)]
        )
        for out in both_modes(lambda t, d=dtype.name: hvd.allgather(t, name=f"gather.{d}"), mine):
            assert out.dtype == dtype, out.dtype
            close(out, gathered, f"allgather {dtype.name}")
        x = tf.constant(np.full([2], big - r, dtype.as_numpy_dtype))
        for out in both_modes(lambda t, d=dtype.name: hvd.broadcast(t, root, name=f"bcast.{d}"), x):
            close(out, np.full([2], big - root, dtype.as_numpy_dtype), f"broadcast {dtype.name}")
        rows = tf.constant(np.full([n, 1], big - r, dtype.as_numpy_dtype))
        for out in both_modes(lambda t, d=dtype.name: hvd.alltoall(t, name=f"a2a.{d}"), rows):
            want = np.array([[big - q] for q in range(n)], dtype.as_numpy_dtype)
            close(out, want, f"alltoall {dtype.name}")
        try:
            hvd.allreduce(x, name=f"sum.{dtype.name}")
        except hvd.FastPSError as exc:
            assert dtype.name in str(exc), exc
        else:
            raise AssertionError(f"allreduce of {dtype.name} was accepted")

    # Ranks that disagree raise FailedPreconditionError eagerly and inside tf.function
    # (Horovod's type), naming both values; the next op works.
    for mode, fn in (("eager", hvd.allreduce), ("graph", tf.function(hvd.allreduce))):
        if n == 1:
            break
        try:
            fn(tf.ones([3 + r]), name=f"mismatch.{mode}")
        except tf.errors.FailedPreconditionError as exc:
            assert "[3]" in str(exc) and "[4]" in str(exc), exc
        else:
            raise AssertionError(f"mismatched shapes were accepted ({mode})")
        close(hvd.allreduce(tf.ones([2]), op=hvd.Sum, name=f"after.{mode}"), np.full([2], n), mode)
    print("collectives on", [d.name for d in DTYPES], "eager and graph: ok", flush=True)


def check_options(r: int, n: int) -> None:
    x = tf.constant(value(r, tf.float32))
    total = sum(value(q, tf.float32) for q in range(n))
    for dtype in (tf.float32, tf.float64):
        xc = tf.cast(x, dtype)
        for out in both_modes(
            lambda t: hvd.allreduce(
                t, op=hvd.Sum, name=f"fp16.{t.dtype.name}", compression=hvd.Compression.fp16
            ),
            xc,
        ):
            assert out.dtype == dtype
            close(out, total.astype(dtype.as_numpy_dtype), "fp16 compression")
    out = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0, name="scaled")
    close(out, total * 1.5, "pre/postscale")
    out = hvd.allreduce(x, average=False, name="average-false")
    close(out, total, "average=False")

    # Gradients flow through the collectives.
    v = tf.Variable(tf.ones([4]) * (r + 1))
    with tf.GradientTape() as tape:
        y = hvd.allreduce(v * 2.0, name="grad.allreduce")  # average of 2v over workers
        loss = tf.reduce_sum(y * (r + 1))
    g = tape.gradient(loss, v)  # d/dv_r sum_q (q+1) * avg(2v) = 2/n * sum_q (q+1)
    close(g, np.full([4], 2.0 / n * sum(q + 1 for q in range(n)), np.float32), "allreduce grad")
    with tf.GradientTape() as tape:
        tape.watch(v)
        y = hvd.allgather(tf.reshape(v, [2, 2]), name="grad.allgather")
        loss = tf.reduce_sum(y * tf.cast(tf.range(2 * n)[:, None] + 1, tf.float32))
    # Horovod's allgather gradient: this rank's rows of the gradient averaged over the
    # workers (all identical here): the weights of rows 2r and 2r+1.
    g = tape.gradient(loss, v)
    want = np.repeat(np.array([2 * r + 1, 2 * r + 2], np.float32), 2)
    close(g, want, "allgather grad")

    # IndexedSlices are gathered: every worker's rows appear, values averaged.
    slices = tf.IndexedSlices(
        tf.constant([[float(r + 1)] * 2]), tf.constant([r]), dense_shape=tf.constant([n, 2])
    )
    out = hvd.allreduce(slices, name="sparse")
    assert isinstance(out, tf.IndexedSlices)
    close(
        tf.convert_to_tensor(out),
        np.array([[(q + 1) / n] * 2 for q in range(n)], np.float32),
        "indexed slices",
    )

    try:
        hvd.allreduce(tf.constant([1, 2], tf.uint32), name="bad-dtype")
    except hvd.FastPSError as exc:
        assert "uint32" in str(exc), exc
    else:
        raise AssertionError("uint32 was accepted")
    check_adasum(r, n)
    print("compression, scaling, gradients, sparse, errors: ok", flush=True)


def adasum_reference(rows: list) -> np.ndarray:
    """Adasum over ranks in rank order: pairs (0, 1), (2, 3)... then their results, a
    rank without a partner moving up unchanged."""

    def pair(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        dot, aa, bb = float(a @ b), float(a @ a), float(b @ b)
        return (1 - dot / (2 * aa)) * a + (1 - dot / (2 * bb)) * b

    while len(rows) > 1:
        rows = [
            pair(*rows[i : i + 2]) if i + 1 < len(rows) else rows[i] for i in range(0, len(rows), 2)
        ]
    return rows[0]


def check_adasum(r: int, n: int) -> None:
    def grad(q: int) -> np.ndarray:
        return np.array([1.0 + q, 2.0 - q, 0.5 * q, 3.0], np.float64)

    want = adasum_reference([grad(q) for q in range(n)])
    for dtype in (tf.float32, tf.float64):
        x = tf.constant(grad(r), dtype)
        for got in both_modes(lambda t: hvd.allreduce(t, op=hvd.Adasum, name="adasum"), x):
            close(got, want.astype(dtype.as_numpy_dtype), f"adasum {dtype.name}")
    grouped = hvd.grouped_allreduce([tf.constant(grad(r), tf.float32)] * 2, op=hvd.Adasum)
    for got in grouped:
        close(got, want.astype(np.float32), "grouped adasum")
    try:
        hvd.allreduce(tf.constant([1, 2]), op=hvd.Adasum, name="adasum-int")
    except hvd.FastPSError as exc:
        assert "Adasum" in str(exc) and "int32" in str(exc), exc
    else:
        raise AssertionError("Adasum of int32 was accepted")


def check_broadcasts(r: int, n: int) -> None:
    root = n - 1
    # Plain tf.Variables of several dtypes, eagerly.
    vs = [
        tf.Variable(tf.constant(value(r, d))) for d in (tf.float32, tf.int64, tf.bool, tf.bfloat16)
    ]
    hvd.broadcast_variables(vs, root_rank=root)
    for v, d in zip(vs, (tf.float32, tf.int64, tf.bool, tf.bfloat16)):
        close(v, value(root, d), f"broadcast_variables {d.name}")
    # A Keras model's variables, inside a tf.function.
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(2)])
    model.set_weights([np.full(w.shape, r, np.float32) for w in model.get_weights()])

    @tf.function
    def sync() -> None:
        hvd.broadcast_variables(model.variables, root_rank=root, name="in-graph")

    sync()
    for w in model.get_weights():
        close(w, np.full(w.shape, root, np.float32), "broadcast_variables in graph")
    model.set_weights([np.full(w.shape, r + 5, np.float32) for w in model.get_weights()])
    sync()
    for w in model.get_weights():
        close(w, np.full(w.shape, root + 5, np.float32), "broadcast_variables in graph, again")

    obj = hvd.broadcast_object({"rank": r, "list": list(range(r + 3))}, root_rank=root)
    assert obj == {"rank": root, "list": list(range(root + 3))}, obj
    assert hvd.allgather_object(("r", r)) == [("r", q) for q in range(n)]
    print("broadcast_variables (eager, graph), broadcast_object, allgather_object: ok", flush=True)


def check_callbacks(r: int, n: int) -> None:
    cb = hvdk.callbacks.MetricAverageCallback()
    logs = {"loss": float(r), "accuracy": np.float32(2 * r), "name": "text"}
    cb.on_epoch_end(0, logs)
    mean = (n - 1) / 2
    assert logs["loss"] == mean and logs["accuracy"] == 2 * mean and logs["name"] == "text", logs

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.4, momentum=0.5), loss="mse")
    warm = hvdk.callbacks.LearningRateWarmupCallback(warmup_epochs=2, steps_per_epoch=4)
    warm.set_model(model)
    warm.on_train_begin()
    assert abs(warm.initial_lr - 0.4) < 1e-6
    seen = []
    for epoch in range(3):
        warm.on_epoch_begin(epoch)
        for batch in range(4):
            warm.on_train_batch_begin(batch)
            seen.append(float(model.optimizer.learning_rate))
        warm.on_epoch_end(epoch, {})
    want = [0.4 / n * (1 + (e + b / 4) / 2 * (n - 1)) for e in range(2) for b in range(4)]
    assert np.allclose(seen[:8], want, rtol=1e-5), (seen, want)
    assert np.allclose(seen[8:], 0.4), seen
    # And in model.fit: the rate ends at initial_lr.
    x = np.ones((16, 2), np.float32)
    model.fit(
        x,
        x[:, :1],
        batch_size=4,
        epochs=2,
        verbose=0,
        callbacks=[hvdk.callbacks.LearningRateWarmupCallback(0.2, warmup_epochs=1)],
    )
    assert abs(float(model.optimizer.learning_rate) - 0.2) < 1e-6
    check_schedule_callback()
    check_broadcast_callback_local_variables(r, n)
    print(
        "MetricAverageCallback, LearningRateWarmupCallback, LearningRateScheduleCallback, "
        "BroadcastGlobalVariablesCallback(local_variables): ok",
        flush=True,
    )


def check_broadcast_callback_local_variables(r: int, n: int) -> None:
    """BroadcastGlobalVariablesCallback(local_variables=...): those keep this rank's values,
    every other weight becomes the root's."""
    init = keras.initializers.Constant(float(r))
    model = keras.Sequential(
        [
            keras.Input((3,)),
            keras.layers.Dense(3, kernel_initializer=init, bias_initializer=init),
            keras.layers.Dense(2, kernel_initializer=init, bias_initializer=init),
        ]
    )
    local = list(model.layers[0].weights)
    root = n - 1
    cb = hvdk.callbacks.BroadcastGlobalVariablesCallback(root_rank=root, local_variables=local)
    cb.set_model(model)
    cb.on_train_begin()
    for w in model.layers[0].weights:
        assert np.all(np.asarray(w) == r), (w.path, np.asarray(w))
    for w in model.layers[1].weights:
        assert np.all(np.asarray(w) == root), (w.path, np.asarray(w))


def check_schedule_callback() -> None:
    """Two chained staircase ranges, then a per-batch (fractional epoch) one; the rate is
    left alone outside every range."""
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.5, momentum=0.5), loss="mse")
    sched = hvdk.callbacks.LearningRateScheduleCallback
    cbs = [
        sched(initial_lr=1.0, multiplier=0.1, start_epoch=1, end_epoch=2),
        sched(initial_lr=1.0, multiplier=lambda e: e, start_epoch=3, staircase=False),
    ]
    for cb in cbs:
        cb.set_model(model)
        cb.set_params({"steps": 4})
        cb.on_train_begin()
    seen = []
    for epoch in range(5):
        for cb in cbs:
            cb.on_epoch_begin(epoch)
        for batch in range(4):
            for cb in cbs:
                cb.on_train_batch_begin(batch)
            seen.append(round(float(model.optimizer.learning_rate), 6))
    want = [0.5] * 4 + [0.1] * 4 + [0.1] * 4 + [3 + b / 4 for b in range(4)]
    want += [4 + b / 4 for b in range(4)]
    assert np.allclose(seen, want), (seen, want)
    try:
        bad = sched(initial_lr=1.0, multiplier=lambda e: e, staircase=False)
        bad.set_model(model)
        bad.set_params({})
        bad.on_train_begin()
    except ValueError as exc:
        assert "steps_per_epoch" in str(exc), exc
    else:
        raise AssertionError("staircase=False without steps_per_epoch must raise")
    # In model.fit: epochs 0-1 keep the compiled rate, epoch 2 on use 0.5 * 0.2.
    x = np.ones((8, 2), np.float32)
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
    hist = model.fit(
        x, x[:, :1], batch_size=4, epochs=3, verbose=0, callbacks=[sched(0.5, 0.2, start_epoch=2)]
    )
    assert np.allclose(hist.history["learning_rate"], [0.5, 0.5, 0.1]), hist.history


def main() -> None:
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    assert hvdk.size() == n and 0 <= hvd.local_rank() < hvd.local_size()
    check_collectives(r, n)
    check_options(r, n)
    check_broadcasts(r, n)
    check_callbacks(r, n)
    print(f"rank {r} OK", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
