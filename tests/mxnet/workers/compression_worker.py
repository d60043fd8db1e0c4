"""The MXNet plugin with the core's compressors (docs/guide/compression.md), run as 2 workers by
tests/mxnet/test_compression.py.

    compression_worker.py checks     the checks below, in order
    compression_worker.py mismatch   DistributedTrainers that compress differently per rank

checks:
* ``hvd.allreduce`` with onebit equals the reference decompress(compress(Σ decompress(
  compress(x_r)))) computed with the core's codec (Sum and Average);
* error feedback through ``allreduce``: over a fixed sequence of rounds, top-k 10% with
  error feedback delivers the accumulated average (what it drops arrives later), without
  it most of it is lost;
* a DistributedTrainer with top-k 10% and error feedback trains a small regression to
  identical parameters on every rank, its loss within 5% of uncompressed training's;
* a compression mismatch in ``allreduce`` fails that op on both ranks naming both
  settings, and the next op works; a cast compressor is refused by ``allreduce``.

Prints ``COMPRESSION OK <what>`` per check; ``mismatch`` prints ``CAUGHT <message>``.
"""

from __future__ import annotations

import sys

import fastps
import fastps.mxnet as hvd
import mxnet as mx
import numpy as np
from fastps import _core
from mxnet import autograd, gluon


def codec(spec: str, x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    data = _core.compress(spec, x.ctypes.data, x.size, 0)
    out = np.empty_like(x)
    _core.decompress(data, x.size, out.ctypes.data)
    return out


def inputs(rank: int, n: int = 3000) -> np.ndarray:
    return np.random.default_rng(rank).standard_normal(n).astype(np.float32)


def check_allreduce(rank: int, size: int) -> None:
    comp = hvd.Compression.onebit
    total = sum(codec("onebit", inputs(r)) for r in range(size))
    want = codec("onebit", total)
    got = hvd.allreduce(mx.nd.array(inputs(rank)), op=hvd.Sum, name="ar.onebit", compression=comp)
    np.testing.assert_allclose(got.asnumpy(), want, rtol=1e-6)
    x = mx.nd.array(inputs(rank))
    hvd.allreduce_(x, name="ar.onebit.avg", compression=comp)
    np.testing.assert_allclose(x.asnumpy(), want / size, rtol=1e-6)
    print(f"rank {rank} COMPRESSION OK allreduce", flush=True)


def accumulated_error(rank: int, size: int, comp, label: str, rounds: int = 40) -> float:
    """|Σ_t allreduce(x_t) - Σ_t mean_r(x_t)| / |Σ_t mean_r(x_t)| over a fixed sequence."""
    got = np.zeros(2000, dtype=np.float64)
    want = np.zeros(2000, dtype=np.float64)
    for t in range(rounds):
        xs = [inputs(1000 * t + r, 2000) + 0.5 for r in range(size)]
        want += np.mean(xs, axis=0)
        out = hvd.allreduce(mx.nd.array(xs[rank]), name=f"ef.{label}", compression=comp)
        got += out.asnumpy()
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def check_error_feedback(rank: int, size: int) -> None:
    with_ef = accumulated_error(rank, size, hvd.Compression.topk(0.1, error_feedback=True), "ef")
    without = accumulated_error(rank, size, hvd.Compression.topk(0.1), "plain")
    print(f"rank {rank} accumulated error: ef {with_ef:.3f}, none {without:.3f}", flush=True)
    assert with_ef < 0.3, with_ef
    assert without > 0.5, without
    print(f"rank {rank} COMPRESSION OK error feedback", flush=True)


def train(rank: int, compression, label: str, steps: int = 60):
    mx.random.seed(0)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(64, activation="tanh", in_units=32), gluon.nn.Dense(1, in_units=64))
    net.initialize(mx.init.Xavier())
    hvd.broadcast_parameters(net.collect_params(), root_rank=0)
    trainer = hvd.DistributedTrainer(
        net.collect_params(), "sgd", {"learning_rate": 0.05}, compression=compression
    )
    gen = np.random.default_rng(100 + rank)
    w = np.random.default_rng(7).standard_normal((32, 1)).astype(np.float32)
    loss_fn = gluon.loss.L2Loss()
    loss = mx.nd.zeros((1,))
    for _ in range(steps):
        x = gen.standard_normal((64, 32)).astype(np.float32)
        data, target = mx.nd.array(x), mx.nd.array(x @ w)
        with autograd.record():
            loss = loss_fn(net(data), target).mean()
        loss.backward()
        trainer.step(1)
    final = hvd.allreduce(loss, name=f"loss.{label}")
    return net, float(final.asscalar())


def check_trainer(rank: int, size: int) -> None:
    _, plain = train(rank, hvd.Compression.none, "plain")
    print(f"rank {rank} trained uncompressed", flush=True)
    net, compressed = train(rank, hvd.Compression.topk(0.1, error_feedback=True), "topk")
    flat = mx.nd.concat(*[p.data().reshape((-1,)) for p in net.collect_params().values()], dim=0)
    everyone = hvd.allgather(flat.reshape((1, -1)), name="params")
    assert (everyone[0] == everyone[1]).asnumpy().all(), "ranks hold different parameters"
    print(f"rank {rank} losses: uncompressed {plain:.4f}, topk 10% ef {compressed:.4f}", flush=True)
    assert compressed <= plain * 1.05 + 1e-3, (plain, compressed)
    print(f"rank {rank} COMPRESSION OK trainer", flush=True)


def check_mismatch(rank: int, size: int) -> None:
    comp = hvd.Compression.onebit(error_feedback=True) if rank == 0 else None
    try:
        hvd.allreduce(mx.nd.ones((100,)), name="mm", compression=comp)
    except fastps.FastPSError as exc:
        msg = str(exc)
        assert "compression" in msg and "onebit:ef" in msg and "none" in msg, msg
    else:
        raise AssertionError("a compression mismatch went through")
    out = hvd.allreduce(mx.nd.ones((10,)), op=hvd.Sum, name="after")
    assert (out.asnumpy() == size).all()
    try:
        hvd.allreduce(mx.nd.ones((10,)), name="cast", compression=hvd.Compression.fp16)
    except fastps.FastPSError as exc:
        assert "FP16Compressor" in str(exc), exc
    else:
        raise AssertionError("allreduce took a cast compressor")
    print(f"rank {rank} COMPRESSION OK mismatch", flush=True)


def trainer_mismatch(rank: int) -> int:
    comp = hvd.Compression.topk(0.1, error_feedback=True) if rank == 0 else hvd.Compression.onebit
    try:
        train(rank, comp, "mismatch", steps=2)
    except fastps.FastPSError as exc:
        print(f"rank {rank} CAUGHT {type(exc).__name__}: {exc}", flush=True)
        return 3
    print(f"rank {rank} NO ERROR", flush=True)
    return 0


def main() -> int:
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    if sys.argv[1] == "mismatch":
        return trainer_mismatch(rank)
    check_allreduce(rank, size)
    check_error_feedback(rank, size)
    check_trainer(rank, size)
    check_mismatch(rank, size)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
