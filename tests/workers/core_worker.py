"""Worker program for the core tests, run under fastpsrun. Exits non-zero on any wrong sum.

Every rank can compute every other rank's input (seeded by rank, iteration and tensor), so
each checks the exact expected result against numpy.
"""

from __future__ import annotations

import json
import sys
import time

import fastps
import numpy as np
from fastps.worker import api

DTYPES = [
    "float32",
    "float64",
    "float16",
    "bfloat16",
    "int32",
    "int64",
    "uint8",
    "int8",
    "int16",
    "bool",
]


def np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        return np.dtype(np.uint16)  # carried as raw bits; see bf16 helpers
    return np.dtype(name)


def bf16_from_f32(x: np.ndarray) -> np.ndarray:
    b = x.astype(np.float32).view(np.uint32)
    rounding = ((b >> 16) & 1) + 0x7FFF
    return ((b + rounding) >> 16).astype(np.uint16)


def bf16_to_f32(x: np.ndarray) -> np.ndarray:
    return (x.astype(np.uint32) << 16).view(np.float32)


def make(dtype: str, n: int, rank: int, it: int, salt: int) -> np.ndarray:
    rng = np.random.default_rng([rank, it, salt, 7])
    if dtype == "bool":
        return rng.integers(0, 2, n).astype(bool)
    if dtype.startswith("int") or dtype == "uint8":
        hi = 5 if dtype in ("uint8", "int8") else 1000
        lo = 0 if dtype == "uint8" else -hi
        return rng.integers(lo, hi, n).astype(dtype)
    vals = rng.integers(-8, 8, n).astype(np.float32) / 4  # exact in every float type
    if dtype == "bfloat16":
        return bf16_from_f32(vals)
    return vals.astype(dtype)


def expected(dtype: str, n: int, size: int, it: int, salt: int, average: bool) -> np.ndarray:
    parts = [make(dtype, n, r, it, salt) for r in range(size)]
    if dtype == "bool":
        return np.logical_or.reduce(parts) if parts else np.zeros(n, bool)
    if dtype == "bfloat16":
        s = sum(bf16_to_f32(p) for p in parts)
        return s / size if average else s
    s = sum(p.astype(np.float64) for p in parts)
    if average:
        s = s / size
        if not np.dtype(dtype).kind == "f":
            s = np.trunc(s)
    return s


def check(name: str, got: np.ndarray, want: np.ndarray, dtype: str) -> None:
    if dtype == "bfloat16":
        got = bf16_to_f32(got)
    ok = (
        np.array_equal(got, want)
        if dtype == "bool"
        else np.allclose(
            got.astype(np.float64),
            want,
            rtol=1e-2 if dtype in ("float16", "bfloat16") else 1e-6,
            atol=1e-2,
        )
    )
    if not ok:
        bad = np.flatnonzero(~np.isclose(got.astype(np.float64), np.asarray(want, np.float64)))
        print(
            f"rank {fastps.rank()}: WRONG {name}: first bad index {bad[:5]} "
            f"got {got.flat[bad[:5]]} want {np.asarray(want).flat[bad[:5]]}",
            flush=True,
        )
        sys.exit(3)


def matrix(iters: int) -> None:
    """Every dtype x sizes (0, 1, odd, one partition exactly, many partitions), sum and
    average, in place and out of place, values changing every iteration."""
    size, rank = fastps.size(), fastps.rank()
    part = 64 * 1024  # the tests launch with --partition-bytes 64K
    for it in range(iters):
        for di, dtype in enumerate(DTYPES):
            item = np_dtype(dtype).itemsize
            for si, n in enumerate([0, 1, 1001, part // item, 5 * part // item + 3]):
                salt = di * 100 + si
                average = dtype != "bool" and (it + si) % 2 == 1
                x = make(dtype, n, rank, it, salt)
                name = f"{dtype}.{n}"
                as_dt = "bfloat16" if dtype == "bfloat16" else None
                if si % 2:
                    got = fastps.push_pull(x, average=average, name=name, out=x, dtype=as_dt)
                else:
                    got = fastps.push_pull(x, average=average, name=name, dtype=as_dt)
                check(
                    f"{name} it {it} avg {average}",
                    got,
                    expected(dtype, n, size, it, salt, average),
                    dtype,
                )


def many(iters: int, count: int) -> None:
    """count tensors per iteration, all in flight together, completed in reverse order."""
    size, rank = fastps.size(), fastps.rank()
    for it in range(iters):
        xs = [make("float32", 1 + (j % 37), rank, it, j) for j in range(count)]
        hs = [
            fastps.push_pull_async(x, average=False, name=f"m{j}", priority=j % 5)
            for j, x in enumerate(xs)
        ]
        for j in reversed(range(count)):
            got = hs[j].synchronize()
            check(f"m{j}", got, expected("float32", 1 + (j % 37), size, it, j, False), "float32")


def out_of_order() -> None:
    size, rank = fastps.size(), fastps.rank()
    xs = [make("float32", 50_000 * (j + 1), rank, 0, j) for j in range(6)]
    hs = [fastps.push_pull_async(x, average=False, name=f"o{j}") for j, x in enumerate(xs)]
    order = [3, 0, 5, 1, 4, 2]
    for j in order:
        while not hs[j].poll():
            time.sleep(0.001)
        check(
            f"o{j}",
            hs[j].synchronize(),
            expected("float32", 50_000 * (j + 1), size, 0, j, False),
            "float32",
        )
    # broadcast from the last rank, anonymous names matched by call order
    root = size - 1
    b = np.full(10, rank, dtype=np.int64)
    routed = api.data_path_stats()["pushed_routed"]
    got = fastps.broadcast(b, root_rank=root)
    assert (got == root).all(), got
    # routed: the root's push alone carries data (not a sum of zeros from every rank)
    assert api.data_path_stats()["pushed_routed"] > routed
    # in place, with a larger tensor over several parts
    big = np.full(300_000, float(rank), dtype=np.float32)
    assert fastps.broadcast(big, root_rank=0, name="bcast.big", out=big) is big
    assert (big == 0.0).all(), big[:4]
    anon = fastps.push_pull(np.ones(3, np.float32), average=False)
    assert (anon == size).all(), anon
    fastps.barrier()


def regrow() -> None:
    """One name reused with sizes that change its number of parts, up and down."""
    size, rank = fastps.size(), fastps.rank()
    for n in [10, 3 << 20, 5, 6 << 20, 1, 0, 70_000]:
        got = fastps.push_pull(np.full(n, rank + 1, np.float32), average=False, name="x")
        assert np.all(got == size * (size + 1) / 2), (n, got[:3])


def main() -> None:
    mode = sys.argv[1]
    fastps.init()
    t0 = time.time()
    if mode == "matrix":
        matrix(int(sys.argv[2]))
    elif mode == "many":
        many(int(sys.argv[2]), int(sys.argv[3]))
    elif mode == "order":
        out_of_order()
    elif mode == "regrow":
        regrow()
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(f"rank {fastps.rank()} OK {mode} in {time.time() - t0:.1f}s", flush=True)
    print("STATS " + json.dumps(api.data_path_stats()), flush=True)
    fastps.shutdown()


if __name__ == "__main__":
    main()
