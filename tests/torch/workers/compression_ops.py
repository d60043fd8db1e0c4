"""The torch plugin with the core's compressors (docs/guide/compression.md), run as 2 workers by
tests/torch/test_torch_compression.py:

* ``hvd.allreduce`` with onebit equals the reference decompress(compress(Σ decompress(
  compress(x_r)))) computed with the core's codec (one part: the tensor is small), on the
  direct path and through the collective layer (Sum);
* a DistributedOptimizer with top-k 10% and error feedback trains a small regression on
  every rank to identical parameters, its loss falls to within 5% of uncompressed training's
  after the same steps, and its gradients take the fast path (no Python compressor);
* a compression mismatch in ``allreduce`` fails that op on both ranks naming both settings,
  and the next op works.

Prints ``COMPRESSION OK <what>`` per check."""

from __future__ import annotations

import fastps
import fastps.torch as hvd
import numpy as np
import torch
from fastps import _core


def codec(spec: str, x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    data = _core.compress(spec, x.ctypes.data, x.size, 0)
    out = np.empty_like(x)
    _core.decompress(data, x.size, out.ctypes.data)
    return out


def inputs(rank: int) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(rank).standard_normal(3000).astype(np.float32))


def check_allreduce(rank: int, size: int) -> None:
    comp = hvd.Compression.onebit
    total = sum(codec("onebit", inputs(r).numpy()) for r in range(size))
    want = codec("onebit", total)
    got = hvd.allreduce(inputs(rank), op=hvd.Sum, name="ar.onebit", compression=comp)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
    avg = hvd.allreduce(inputs(rank), name="ar.onebit.avg", compression=comp)
    np.testing.assert_allclose(avg.numpy(), want / size, rtol=1e-6)
    print(f"rank {rank} COMPRESSION OK allreduce", flush=True)


def train(rank: int, label: str, compression, steps: int = 60):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    opt = hvd.DistributedOptimizer(
        opt, named_parameters=model.named_parameters(), compression=compression
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    gen = torch.Generator().manual_seed(100 + rank)
    w = torch.randn(32, 1, generator=torch.Generator().manual_seed(7))
    loss = torch.tensor(0.0)
    for _ in range(steps):
        x = torch.randn(64, 32, generator=gen)
        y = x @ w
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    final = hvd.allreduce(loss.detach(), name=f"loss.{label}")
    return model, opt, float(final)


def check_optimizer(rank: int, size: int) -> None:
    _, _, plain = train(rank, "plain", hvd.Compression.none)
    model, opt, compressed = train(rank, "topk", hvd.Compression.topk(0.1, error_feedback=True))
    assert opt._fastps.fast, "compressed gradients should take the fast path"
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = hvd.allgather(flat.unsqueeze(0), name="params")
    assert torch.equal(everyone[0], everyone[1]), "ranks hold different parameters"
    print(f"rank {rank} losses: uncompressed {plain:.4f}, topk 10% ef {compressed:.4f}", flush=True)
    assert compressed <= plain * 1.05 + 1e-3, (plain, compressed)
    print(f"rank {rank} COMPRESSION OK optimizer", flush=True)


def check_mismatch(rank: int, size: int) -> None:
    comp = hvd.Compression.onebit(error_feedback=True) if rank == 0 else None
    try:
        hvd.allreduce(torch.ones(100), name="mm", compression=comp)
    except fastps.FastPSError as exc:
        msg = str(exc)
        assert "compression" in msg and "onebit:ef" in msg and "none" in msg, msg
    else:
        raise AssertionError("a compression mismatch went through")
    out = hvd.allreduce(torch.ones(10), op=hvd.Sum, name="after")
    assert torch.equal(out, torch.full((10,), float(size)))
    print(f"rank {rank} COMPRESSION OK mismatch", flush=True)


def main() -> None:
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    check_allreduce(rank, size)
    check_optimizer(rank, size)
    check_mismatch(rank, size)
    hvd.shutdown()


if __name__ == "__main__":
    main()
