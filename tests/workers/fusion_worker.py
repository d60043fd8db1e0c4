"""Worker program for the tensor-fusion tests (csrc/worker/fusion.h). Exits non-zero on any
wrong sum or any unexpected number of parts.

Every rank computes every other rank's inputs (core_worker.make), so sums are checked
exactly; a reference planner written here independently of the C++ one says which tensors
share a bucket, so each rank checks that its pushes were the buckets and the unfused parts.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Dict, List, Tuple

import fastps
import numpy as np
from core_worker import DTYPES, check, expected, make, np_dtype
from fastps import _core
from fastps.errors import FastPSError, FastPSTimeoutError
from fastps.worker import api

Row = Tuple[str, int, str, int]  # name, nbytes, dtype, priority


def specs() -> List[Tuple[str, str, int, int]]:
    """(name, dtype, elements, priority): uneven sizes, every dtype, a few tensors above
    the threshold between small ones, repeated priorities (ties go by tensor id)."""
    out = []
    sizes = [1, 3, 17, 100, 1001, 2, 555, 40, 9, 1500, 7]
    for j in range(61):
        prio = (j * 7) % 11
        dtype = DTYPES[prio % len(DTYPES)]  # neighbours in the order share a dtype
        n = 70_000 if j % 13 == 5 else sizes[j % len(sizes)]
        if j == 33:
            n = 0
        out.append((f"t{j}.{dtype}", dtype, n, prio))
    return out


def reference_plan(rows: List[Row], capacity: int) -> List[List[str]]:
    """The buckets the core must build: urgency order, same-dtype runs cut at capacity."""
    order = sorted(rows, key=lambda r: (-r[3], _core.tensor_id(r[0])))
    buckets: List[List[str]] = []
    cur: List[Row] = []

    def close() -> None:
        if len(cur) >= 2:
            buckets.append([r[0] for r in cur])
        cur.clear()

    for r in order:
        if r[1] == 0 or r[1] >= capacity:
            close()
            continue
        if cur and (r[2] != cur[0][2] or sum(c[1] for c in cur) + r[1] > capacity):
            close()
        cur.append(r)
    close()
    return buckets


def parts_pushed() -> int:
    s = api.data_path_stats()
    if s["local_reduce"]:
        return s["reduced_locally"] + s["contributed_shm"] + s["contributed_socket"]
    return s["pushed_shm"] + s["pushed_socket"]


def expected_parts(rows: List[Row], buckets: List[List[str]]) -> int:
    fused = {n for b in buckets for n in b}
    w = api._st().worker
    n = len(buckets)  # each bucket fits one part
    for name, nbytes, dtype, _ in rows:
        if name not in fused:
            n += len(w.part_layout(name, nbytes, np_dtype(dtype).itemsize))
    return n


def run_iteration(tensors, it: int, skip: str = "") -> Dict[str, object]:
    """Submits every tensor (but ``skip``) in an order of this rank's own, then waits in
    another order; checks each sum exactly. Returns the handles by name."""
    size, rank = fastps.size(), fastps.rank()
    rng = np.random.default_rng([rank, it, 99])
    todo = [t for t in tensors if t[0] != skip]
    submit = [todo[i] for i in rng.permutation(len(todo))]
    handles = {}
    inputs = {}
    for si, (name, dtype, n, prio) in enumerate(submit):
        salt = int(name[1 : name.index(".")])
        x = make(dtype, n, rank, it, salt)
        average = dtype != "bool" and (it + salt) % 2 == 1
        as_dt = "bfloat16" if dtype == "bfloat16" else None
        out = x if si % 2 else None  # in place and out of place
        handles[name] = fastps.push_pull_async(
            x, average=average, name=name, priority=prio, out=out, dtype=as_dt
        )
        inputs[name] = (dtype, n, salt, average)
    for i in rng.permutation(len(submit)):
        name = submit[i][0]
        dtype, n, salt, average = inputs[name]
        got = handles[name].synchronize()
        check(f"{name} it {it}", got, expected(dtype, n, size, it, salt, average), dtype)
    return handles


def exact(iters: int) -> None:
    cfg = api._st().cfg
    capacity = min(cfg.fusion_threshold, cfg.part_sizes([])[0])
    tensors = specs()
    rows: List[Row] = [(nm, n * np_dtype(dt).itemsize, dt, p) for nm, dt, n, p in tensors]
    ref = reference_plan(rows, capacity)
    assert len(ref) >= 5, ref
    got = api.set_fusion_plan("test", rows)
    assert got == len(ref), (got, len(ref))
    want_parts = expected_parts(rows, ref)
    assert want_parts < len([r for r in rows if r[1]]), (want_parts, len(rows))
    for it in range(iters):
        before = parts_pushed()
        run_iteration(tensors, it)
        pushed = parts_pushed() - before
        assert pushed == want_parts, f"iteration {it}: {pushed} parts, want {want_parts}"

    # A tensor no rank produces this iteration: once every rank submitted the others, the
    # plan without it pushes its half-filled bucket (zeros in its place).
    skip = next(n for b in ref for n in b)
    h = run_iteration_async_skip(tensors, iters, skip, rows)
    del h
    rows2 = [r for r in rows if r[0] != skip]
    ref2 = reference_plan(rows2, capacity)
    before = parts_pushed()
    run_iteration([t for t in tensors if t[0] != skip], iters + 1)
    assert parts_pushed() - before == expected_parts(rows2, ref2)
    # And back: the tensor is fused again.
    assert api.set_fusion_plan("test", rows) == len(ref)
    before = parts_pushed()
    run_iteration(tensors, iters + 2)
    assert parts_pushed() - before == want_parts
    assert api.set_fusion_plan("test", []) == 0
    before = parts_pushed()
    run_iteration(tensors, iters + 3)
    assert parts_pushed() - before == expected_parts(rows, [])


def run_iteration_async_skip(tensors, it: int, skip: str, rows: List[Row]):
    """Like run_iteration without ``skip``; the plan changes before the waits."""
    size, rank = fastps.size(), fastps.rank()
    handles = {}
    meta = {}
    for name, dtype, n, prio in tensors:
        if name == skip:
            continue
        salt = int(name[1 : name.index(".")])
        average = dtype != "bool" and (it + salt) % 2 == 1
        x = make(dtype, n, rank, it, salt)
        as_dt = "bfloat16" if dtype == "bfloat16" else None
        handles[name] = fastps.push_pull_async(
            x, average=average, name=name, priority=prio, dtype=as_dt
        )
        meta[name] = (dtype, n, salt, average)
    api.set_fusion_plan("test", [r for r in rows if r[0] != skip])
    for name, h in handles.items():
        dtype, n, salt, average = meta[name]
        check(
            f"{name} skip-it", h.synchronize(), expected(dtype, n, size, it, salt, average), dtype
        )
    return handles


def errors() -> None:
    rows: List[Row] = [(f"e{j}", 40, "float32", 5) for j in range(4)]
    rows.append(("gone", 40, "float32", 5))
    assert api.set_fusion_plan("err", rows) == 1
    # Another size than planned: refused at once, naming the tensor; nothing starts.
    try:
        fastps.push_pull(np.ones(11, np.float32), name="e1")
    except FastPSError as exc:
        msg = str(exc)
        assert "'e1'" in msg and "40 bytes" in msg and "44 bytes" in msg, msg
        print(f"rank {fastps.rank()} SIZE-REFUSED {msg}", flush=True)
    else:
        raise AssertionError("a planned tensor of another size was accepted")
    # Every member but 'gone': the wait names the tensor waited for and the one missing.
    hs = [fastps.push_pull_async(np.ones(10, np.float32), name=f"e{j}") for j in range(4)]
    t0 = time.monotonic()
    try:
        hs[2].synchronize(timeout=2.0)
    except FastPSTimeoutError as exc:
        print(f"ERROR-SEEN {time.monotonic() - t0:.1f} {type(exc).__name__}: {exc}", flush=True)
    else:
        raise AssertionError("a bucket missing a member completed")
    # The timeout aborted this worker; staying a moment lets the other rank's own wait time
    # out too (rather than see this one leave), then nothing is left to shut down cleanly.
    time.sleep(5)
    os._exit(0)


def main() -> None:
    mode = sys.argv[1]
    fastps.init()
    t0 = time.time()
    if mode == "exact":
        exact(int(sys.argv[2]))
    elif mode == "errors":
        errors()
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(f"rank {fastps.rank()} OK {mode} in {time.time() - t0:.1f}s", flush=True)
    fastps.shutdown()


if __name__ == "__main__":
    main()
