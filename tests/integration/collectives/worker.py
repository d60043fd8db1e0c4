"""Checks every collective through one adapter (``harness.py``); run by
``test_collectives.py`` under fastpsrun as N workers. Prints ``<check> OK`` per check."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import ADAPTERS  # noqa: E402

SUM, AVG, MIN, MAX, PROD = 1, 0, 3, 4, 5


def data(rank: int, shape: tuple, salt: int = 0) -> np.ndarray:
    """Small positive integers, exact in every dtype, different on every rank."""
    n = int(np.prod(shape)) if shape else 1
    return ((np.arange(n) + 3 * rank + salt) % 5 + 1).astype(np.float64).reshape(shape)


def expect(name: str, got: np.ndarray, want: np.ndarray) -> None:
    got = np.asarray(got, dtype=np.float64)
    if got.shape != want.shape or not np.allclose(got, want, rtol=1e-2, atol=1e-2):
        raise AssertionError(
            f"{name}: got {got.ravel()[:8]} {got.shape}, want {want.ravel()[:8]} {want.shape}"
        )


def main() -> None:
    hv = ADAPTERS[sys.argv[1]]()
    r, n = hv.rank, hv.size
    ranks = range(n)
    shape = (3, 4)

    for dt in hv.dtypes:
        stack = np.stack([data(k, shape) for k in ranks])
        expect(f"{dt} sum", hv.allreduce(data(r, shape), dt, SUM), stack.sum(0))
        avg = stack.sum(0) / n
        if not dt.startswith(("float", "bfloat")):
            avg = np.trunc(avg)
        expect(f"{dt} average", hv.allreduce(data(r, shape), dt, AVG), avg)
        expect(f"{dt} min", hv.allreduce(data(r, shape), dt, MIN), stack.min(0))
        expect(f"{dt} max", hv.allreduce(data(r, shape), dt, MAX), stack.max(0))
        if dt not in ("int8", "uint8"):
            expect(f"{dt} product", hv.allreduce(data(r, shape), dt, PROD), stack.prod(0))
        if dt.startswith(("float", "bfloat")):
            expect(
                f"{dt} scaled",
                hv.allreduce(data(r, shape), dt, SUM, pre=0.5, post=3.0),
                stack.sum(0) * 1.5,
            )
        rows = [k + 1 for k in ranks]  # allgather with a different first dimension per rank
        expect(
            f"{dt} allgather",
            hv.allgather(data(r, (rows[r], 2)), dt),
            np.concatenate([data(k, (rows[k], 2)) for k in ranks]),
        )
        for root in ranks:
            expect(
                f"{dt} broadcast {root}", hv.broadcast(data(r, shape), dt, root), data(root, shape)
            )
        # alltoall: rank k sends (j + k) % 2 + 1 rows to rank j
        splits = {k: [(j + k) % 2 + 1 for j in ranks] for k in ranks}
        got, received = hv.alltoall(data(r, (sum(splits[r]), 2)), dt, splits[r])
        want = []
        for k in ranks:
            src = data(k, (sum(splits[k]), 2))
            begin = sum(splits[k][:r])
            want.append(src[begin : begin + splits[k][r]])
        expect(f"{dt} alltoall", got, np.concatenate(want))
        assert received == [splits[k][r] for k in ranks], (received, dt)
        got, received = hv.alltoall(data(r, (2 * n, 2)), dt, None)
        expect(
            f"{dt} alltoall even",
            got,
            np.concatenate([data(k, (2 * n, 2))[2 * r : 2 * r + 2] for k in ranks]),
        )
        full = np.stack([data(k, (n + 1, 2)) for k in ranks]).sum(0)
        share = [(n + 1) // n + (1 if i < (n + 1) % n else 0) for i in ranks]
        begin = sum(share[:r])
        expect(
            f"{dt} reducescatter",
            hv.reducescatter(data(r, (n + 1, 2)), dt, SUM),
            full[begin : begin + share[r]],
        )
        outs = hv.grouped_allreduce([data(r, (2,)), data(r, (5,), 1)], dt, SUM)
        expect(f"{dt} grouped", outs[1], np.stack([data(k, (5,), 1) for k in ranks]).sum(0))
        print(f"dtype {dt} OK", flush=True)

    # A mismatch raises on every rank, naming both shapes, and the next op works.
    try:
        hv.allreduce(data(r, (2 + r,)), "float32", SUM)
        raise AssertionError("mismatched shapes did not raise" if n > 1 else "")
    except RuntimeError as exc:
        if n > 1:
            assert "rank 0 has [2]" in str(exc) and "rank 1 has [3]" in str(exc), exc
    except AssertionError:
        if n > 1:
            raise
    try:
        hv.allreduce(data(r, (2,)), "float32" if r == 0 else "float64", SUM)
        assert n == 1, "mismatched dtypes did not raise"
    except RuntimeError as exc:
        assert "float32" in str(exc) and "float64" in str(exc), exc
    try:
        if r == 0:
            hv.allreduce(data(r, (2,)), "float32", SUM)
        else:
            hv.allgather(data(r, (2,)), "float32")
        assert n == 1, "different ops did not raise"
    except RuntimeError as exc:
        assert "allreduce" in str(exc) and "allgather" in str(exc), exc
    expect(
        "after mismatch",
        hv.allreduce(data(r, (4,)), "float32", SUM),
        np.stack([data(k, (4,)) for k in ranks]).sum(0),
    )
    print("mismatch OK", flush=True)

    # A duplicate name in flight raises at once, on the caller only. Rank 0 makes both calls
    # before any other rank announces the op (the barrier orders them), so its first op is
    # certainly still in flight. (Alone, an op is done as soon as it starts, so there is
    # nothing in flight to collide with.)
    if r == 0:
        first = hv.allreduce_async(data(r, (4,)), "float32", SUM, name="dup")
        t0 = time.monotonic()
        try:
            second = hv.allreduce_async(data(r, (4,)), "float32", SUM, name="dup")
            assert n == 1, "duplicate name did not raise"
            second.synchronize()
        except ValueError:
            assert time.monotonic() - t0 < 1.0
        hv.barrier()
    else:
        hv.barrier()
        first = hv.allreduce_async(data(r, (4,)), "float32", SUM, name="dup")
    expect(
        "first of duplicates", first.synchronize(), np.stack([data(k, (4,)) for k in ranks]).sum(0)
    )
    print("duplicate OK", flush=True)

    # Async ops complete out of order.
    handles = [
        hv.allreduce_async(data(r, (3,), i), "float64", SUM, name=f"ooo.{i}") for i in range(4)
    ]
    for i in reversed(range(4)):
        expect(
            f"out of order {i}",
            handles[i].synchronize(),
            np.stack([data(k, (3,), i) for k in ranks]).sum(0),
        )
    print("out of order OK", flush=True)

    # Process sets: evens and odds reduce separately; an outsider's call raises.
    evens = [k for k in ranks if k % 2 == 0]
    odds = [k for k in ranks if k % 2 == 1]
    even_set = hv.add_process_set(evens)
    odd_set = hv.add_process_set(odds) if odds else None
    mine, mine_ranks = (even_set, evens) if r % 2 == 0 else (odd_set, odds)
    expect(
        "process set sum",
        hv.allreduce(data(r, (5,)), "float32", SUM, ps=mine),
        np.stack([data(k, (5,)) for k in mine_ranks]).sum(0),
    )
    expect(
        "process set allgather",
        hv.allgather(data(r, (1, 2)), "int32", ps=mine),
        np.concatenate([data(k, (1, 2)) for k in mine_ranks]),
    )
    expect(
        "process set broadcast",
        hv.broadcast(data(r, (3,)), "float64", mine_ranks[-1], ps=mine),
        data(mine_ranks[-1], (3,)),
    )
    hv.barrier(mine)
    if odd_set is not None:
        other = odd_set if r % 2 == 0 else even_set
        try:
            hv.allreduce(data(r, (5,)), "float32", SUM, ps=other)
            raise AssertionError("a rank outside the set was not refused")
        except ValueError as exc:
            assert "not a member" in str(exc), exc
        assert hv.remove_process_set(odd_set)
    assert hv.remove_process_set(even_set)
    print("process sets OK", flush=True)

    # join with uneven work: the last rank does one more allreduce; the others stand in.
    if r == n - 1:
        extra = hv.allreduce(data(r, (4,)), "float32", SUM, name="uneven")
        expect("join stand-in", extra, data(r, (4,)))
    last = hv.join()
    assert last == n - 1, last
    assert hv.allgather_object(last) == [n - 1] * n
    assert hv.broadcast_object({"from": r}, n - 1) == {"from": n - 1}
    hv.barrier()
    print("join OK", flush=True)
    hv.shutdown()
    print("ALL OK", flush=True)


if __name__ == "__main__":
    main()
