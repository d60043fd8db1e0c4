"""Worker program for tests/integration/test_push_order.py: every worker submits the same
tensors in a different order and with staggered timing, then checks every sum exactly.

With a tiny answer window, tiny parts and several servers, workers start pushing different
parts first; the window must still never block all of them (no hang), and every sum must be
right. Exits non-zero on a wrong sum; the test's timeout catches a hang.
"""

from __future__ import annotations

import random
import sys
import time

import fastps
import numpy as np
from fastps.worker import api


def large_reversed(mode: str) -> int:
    """Large tensors (many parts each), submitted in opposite orders by the two halves of
    the workers: the most urgent part must still be pushed by everyone."""
    rank, size = fastps.rank(), fastps.size()
    sizes = [(3 << 20) // 4 + 4099 * i for i in range(6)]  # ~3 MiB of float32 each
    for it in range(2):
        order = list(range(len(sizes)))
        if rank % 2:
            order.reverse()
        handles = []
        for i in order:
            x = np.full(sizes[i], float(rank + 1 + i + it), dtype=np.float32)
            prio = i if mode == "large-priority" else 0
            handles.append(
                (i, fastps.push_pull_async(x, average=False, name=f"big{i}", priority=prio))
            )
        for i, h in handles:
            out = h.synchronize()
            want = sum(float(r + 1 + i + it) for r in range(size))
            if not np.all(out == want):
                print(f"WRONG SUM rank {rank} tensor big{i} iter {it}", flush=True)
                return 1
    print(f"ORDER-OK rank {rank}", flush=True)
    fastps.shutdown()
    return 0


def priority_mismatch() -> int:
    """Rank 1 gives a tensor another priority than rank 0: the job must abort, naming the
    tensor and both priorities, instead of risking a hang."""
    rank = fastps.rank()
    x = np.ones(1 << 18, np.float32)
    try:
        fastps.push_pull(x, name="conv1.weight", priority=3 if rank == 0 else 8)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the abort may arrive after that sum
            fastps.push_pull(x[:10], name="steady")
            time.sleep(0.01)
    except fastps.FastPSError as exc:
        print(f"CAUGHT {type(exc).__name__}: {exc}", flush=True)
        return 3
    print("NO-ERROR", flush=True)
    return 0


def main() -> int:
    mode = sys.argv[1]  # "priority": distinct priorities; "equal": all priority 0
    fastps.init()
    if mode in ("large-equal", "large-priority"):
        return large_reversed(mode)
    if mode == "priority-mismatch":
        return priority_mismatch()
    rank, size = fastps.rank(), fastps.size()
    sizes = [1 + (i * 7919) % 40000 for i in range(60)]
    for it in range(3):
        tensors = [
            np.full(n, float(rank + 1 + i + it), dtype=np.float32) for i, n in enumerate(sizes)
        ]
        order = list(range(len(sizes)))
        random.Random(rank * 1000 + it).shuffle(order)  # a different order on every worker
        handles = []
        for j, i in enumerate(order):
            prio = -i if mode == "priority" else 0
            handles.append(
                (i, fastps.push_pull_async(tensors[i], average=False, name=f"t{i}", priority=prio))
            )
            if j % (7 + rank) == 0:
                time.sleep(0.002 * (rank + 1))  # skew the workers' timing too
        for i, h in handles:
            out = h.synchronize()
            want = sum(float(r + 1 + i + it) for r in range(size))
            if not np.all(out == want):
                print(
                    f"WRONG SUM rank {rank} tensor t{i} iter {it}: {out[:3]} != {want}", flush=True
                )
                return 1
    nudged = api.data_path_stats()["nudged"]
    print(f"ORDER-OK rank {rank} nudged {nudged}", flush=True)
    fastps.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
