"""``hvd.allreduce(t, op=hvd.Adasum)`` against a numpy reference of Horovod's formula,
written here independently of core/collectives/adasum.py (recursive halves instead of levels)."""

from __future__ import annotations

import sys

import fastps.torch as hvd
import numpy as np
import torch


def pair(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    dot = float((a * b).sum())
    na, nb = float((a * a).sum()), float((b * b).sum())
    ca = 1.0 - 0.5 * dot / na if na > 0 else 1.0
    cb = 1.0 - 0.5 * dot / nb if nb > 0 else 1.0
    return ca * a + cb * b


def reference(rows: list, dtype: np.dtype) -> np.ndarray:
    """Power-of-two sizes: the left half's Adasum combined with the right half's."""
    if len(rows) == 1:
        return rows[0]
    half = len(rows) // 2
    left = reference(rows[:half], dtype)
    right = reference(rows[half:], dtype)
    return pair(left.astype(np.float64), right.astype(np.float64)).astype(dtype)


def grad(rank: int, shape: tuple, dtype: np.dtype, salt: int) -> np.ndarray:
    rng = np.random.default_rng([rank, salt])
    base = rng.standard_normal(shape)
    shared = np.random.default_rng([salt]).standard_normal(shape)
    return (0.7 * shared + base).astype(dtype)  # correlated across ranks, not equal


def main() -> None:
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    assert size & (size - 1) == 0, "this check is for power-of-two sizes"
    cases = [
        ((17,), np.float64),
        ((5, 33), np.float32),
        ((2, 3, 4), np.float64),
        ((1000,), np.float32),
    ]
    for salt, (shape, dt) in enumerate(cases):
        mine = torch.from_numpy(grad(rank, shape, dt, salt))
        got = hvd.allreduce(mine, op=hvd.Adasum, name=f"ada.{salt}").numpy()
        want = reference([grad(r, shape, dt, salt) for r in range(size)], np.dtype(dt))
        tol = 1e-12 if dt == np.float64 else 1e-5
        assert got.shape == shape and got.dtype == dt, (got.shape, got.dtype)
        assert np.allclose(got, want, rtol=tol, atol=tol), (salt, got.ravel()[:4], want.ravel()[:4])
        # It is not the sum nor the average (the gradients are correlated).
        total = sum(grad(r, shape, dt, salt).astype(np.float64) for r in range(size))
        assert not np.allclose(got, total, rtol=1e-3) and not np.allclose(
            got, total / size, rtol=1e-3
        )
    # Equal gradients everywhere: Adasum returns that gradient.
    same = torch.arange(6, dtype=torch.float64)
    assert torch.allclose(hvd.allreduce(same, op=hvd.Adasum), same)
    # Orthogonal gradients (one-hot by rank): Adasum is their sum.
    onehot = torch.zeros(size, dtype=torch.float64)
    onehot[rank] = 1.0 + rank
    assert torch.allclose(hvd.allreduce(onehot, op=hvd.Adasum), torch.arange(1, size + 1).double())
    # Scale factors: before and after, as Horovod applies them.
    x = torch.from_numpy(grad(rank, (9,), np.float64, 50))
    got = hvd.allreduce(x, op=hvd.Adasum, prescale_factor=2.0, postscale_factor=0.25).numpy()
    want = reference(
        [2.0 * grad(r, (9,), np.float64, 50) for r in range(size)], np.dtype(np.float64)
    )
    assert np.allclose(got, 0.25 * want, rtol=1e-12), (got, want)
    # In place and asynchronous.
    y = torch.from_numpy(grad(rank, (12,), np.float64, 60))
    h = hvd.allreduce_async_(y, op=hvd.Adasum, name="ada.inplace")
    hvd.synchronize(h)
    want = reference([grad(r, (12,), np.float64, 60) for r in range(size)], np.dtype(np.float64))
    assert np.allclose(y.numpy(), want, rtol=1e-12)
    # Integers: refused on every rank, naming the op; the job goes on.
    try:
        hvd.allreduce(torch.ones(3, dtype=torch.int32), op=hvd.Adasum, name="ada.int")
    except Exception as exc:  # noqa: BLE001 - the type is checked by its message below
        assert "ada.int" in str(exc) and "int32" in str(exc), exc
    else:
        raise AssertionError("Adasum of int32 was accepted")
    assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(size)))
    print(f"rank {rank} ADASUM OK", flush=True)
    hvd.shutdown()
    sys.exit(0)


if __name__ == "__main__":
    main()
