"""Worker program for tests/integration/test_grouped.py: grouped push_pull and submission batches.

Every worker runs the same script, so every error case happens on all of them at once and
the job stays in step. Exits non-zero (with the reason) on a wrong sum or a missing error.
"""

from __future__ import annotations

import sys

import fastps
import numpy as np
from fastps import FastPSError


def expect_error(fn, *words: str) -> str:  # type: ignore[no-untyped-def]
    try:
        fn()
    except FastPSError as exc:
        msg = str(exc)
        missing = [w for w in words if w not in msg]
        if missing:
            raise AssertionError(f"error lacks {missing}: {msg}") from None
        return msg
    raise AssertionError(f"no error; expected one naming {words}")


def check(out: np.ndarray, want: float, what: str) -> None:
    if not np.all(out == want):
        raise AssertionError(f"{what}: got {out[:4]}..., want {want}")


def main() -> int:
    fastps.init()
    rank, n = fastps.rank(), fastps.size()
    total = n * (n + 1) / 2  # every worker sends rank + 1

    # 1. A group of many sizes and priorities, in place and into new arrays, several rounds.
    sizes = [1 + (i * 7919) % 50000 for i in range(40)]
    names = [f"g{i}" for i in range(len(sizes))]
    for it in range(3):
        tensors = [np.full(s, float(rank + 1 + it), dtype=np.float32) for s in sizes]
        outs = [t if i % 2 else None for i, t in enumerate(tensors)]
        handles = fastps.grouped_push_pull_async(
            tensors,
            average=False,
            names=names,
            priorities=[-i for i in range(len(sizes))],
            outs=outs,
        )
        for i, h in enumerate(handles):
            check(h.synchronize(), total + n * it, f"rank {rank} group tensor g{i} round {it}")
        if any(h.poll() is not True for h in handles):
            raise AssertionError("a synchronized handle does not poll as done")
    avg = fastps.grouped_push_pull(
        [np.full(5, float(rank + 1), dtype=np.float64)], average=True, names=["avg"]
    )
    check(avg[0], total / n, "grouped average")

    # 2. submission_batch: synchronizing inside the block starts what was collected.
    a = np.full(1000, float(rank + 1), dtype=np.float32)
    b = np.full(3000, float(rank + 1), dtype=np.int32)
    with fastps.submission_batch():
        ha = fastps.push_pull_async(a, average=False, name="ba")
        check(ha.synchronize(), total, "batch tensor synchronized inside the block")
        hb = fastps.push_pull_async(b, average=False, name="bb")
        with fastps.submission_batch():  # nested: joins the outer batch
            hc = fastps.push_pull_async(a.copy(), average=False, name="bc")
    check(hb.synchronize(), total, "batch tensor bb")
    check(hc.synchronize(), total, "nested batch tensor bc")

    # 3. A name twice in one batch: the call names it and both positions; nothing starts.
    def twice() -> None:
        fastps.grouped_push_pull([a, a.copy(), b], average=False, names=["d0", "d1", "d0"])

    expect_error(twice, "'d0'", "twice", "0", "2")

    # 4. The core starts all or none: a name the core finds busy (here: twice in the rows,
    # which the Python layer would have refused earlier) undoes the names before it.
    from fastps.worker import api

    core = api._st().worker
    row = (a.ctypes.data, a.ctypes.data, a.nbytes, "float32")
    try:
        core.push_pull_group(
            [(*row, "free", 0, 1.0), (*row, "free2", 0, 1.0), (*row, "free", 0, 1.0)]
        )
    except RuntimeError as exc:
        if "'free'" not in str(exc) or "in flight" not in str(exc):
            raise AssertionError(f"core error does not name 'free': {exc}") from None
    else:
        raise AssertionError("the core started a group with a name twice")
    got = fastps.grouped_push_pull([b.copy(), a.copy()], average=False, names=["free", "free2"])
    check(got[0], total, "group after a refused group (free)")
    check(got[1], total, "group after a refused group (free2)")

    # 5. An exception inside the block: its handles fail, nothing starts, names stay free.
    held = []
    try:
        with fastps.submission_batch():
            held.append(fastps.push_pull_async(a.copy(), average=False, name="late"))
            raise KeyError("boom")
    except KeyError:
        pass
    expect_error(held[0].synchronize, "not started", "boom")
    check(fastps.push_pull(a.copy(), average=False, name="late"), total, "name after discard")

    # 6. Argument counts that do not match the tensors.
    expect_error(lambda: fastps.grouped_push_pull([a, b], names=["x"]), "1 names", "2 tensors")

    # 7. An empty group is a no-op.
    if fastps.grouped_push_pull([]) != []:
        raise AssertionError("empty group returned something")

    print(f"GROUP-OK rank {rank}", flush=True)
    fastps.barrier()
    fastps.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
