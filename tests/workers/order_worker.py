"""Worker program for tests/test_push_order.py: every worker submits the same tensors in a
different order and with staggered timing, then checks every sum exactly.

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


def main() -> int:
    mode = sys.argv[1]  # "priority": distinct priorities; "equal": all priority 0
    fastps.init()
    rank, size = fastps.rank(), fastps.size()
    sizes = [1 + (i * 7919) % 40000 for i in range(60)]
    for it in range(3):
        tensors = [np.full(n, float(rank + 1 + i + it), dtype=np.float32)
                   for i, n in enumerate(sizes)]
        order = list(range(len(sizes)))
        random.Random(rank * 1000 + it).shuffle(order)  # a different order on every worker
        handles = []
        for j, i in enumerate(order):
            prio = -i if mode == "priority" else 0
            handles.append((i, fastps.push_pull_async(tensors[i], average=False, name=f"t{i}",
                                                       priority=prio)))
            if j % (7 + rank) == 0:
                time.sleep(0.002 * (rank + 1))  # skew the workers' timing too
        for i, h in handles:
            out = h.synchronize()
            want = sum(float(r + 1 + i + it) for r in range(size))
            if not np.all(out == want):
                print(f"WRONG SUM rank {rank} tensor t{i} iter {it}: {out[:3]} != {want}",
                      flush=True)
                return 1
    print(f"ORDER-OK rank {rank}", flush=True)
    fastps.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
