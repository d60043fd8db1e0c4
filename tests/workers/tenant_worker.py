"""Worker of a job on the shared multi-tenant server host (tests/integration/test_shared_server.py).

argv: job tag (an integer mixed into every value, so another job's data in a sum would
show), elements per tensor, seconds to run (or a number of rounds with a trailing "r").
Every round push_pulls one tensor and checks the exact sum; prints "TENANT-ROUNDS <n>
<seconds>" at the end, or "TENANT-WRONG ..." and exits 3 on a wrong sum, or
"TENANT-ERROR ..." and exits 17 on a fastps error.
"""

from __future__ import annotations

import sys
import time

import fastps
import numpy as np


def main() -> None:
    tag, elems, budget = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    rounds_max = int(budget[:-1]) if budget.endswith("r") else None
    seconds = None if rounds_max is not None else float(budget)
    try:
        fastps.init()
        n, rank = fastps.size(), fastps.rank()
        x = np.empty(elems, np.float32)
        done = 0
        fastps.barrier()
        t0 = time.monotonic()
        while True:
            if rounds_max is not None and done >= rounds_max:
                break
            if seconds is not None and done % 16 == 0:
                # Every rank must stop after the same round: rank 0's clock decides.
                late = float(rank == 0 and time.monotonic() - t0 >= seconds)
                stop = fastps.push_pull(np.array([late], np.float32), name="tenant.stop")
                if stop[0] > 0:
                    break
            x.fill(tag * 1000 + rank + done % 7)
            out = fastps.push_pull(x, name="tenant", average=False)
            want = n * (tag * 1000 + done % 7) + n * (n - 1) / 2
            if not np.all(out == want):
                print(f"TENANT-WRONG round {done} got {out[:3]} want {want}", flush=True)
                sys.exit(3)
            done += 1
        elapsed = time.monotonic() - t0
        print(f"TENANT-ROUNDS {done} {elapsed:.3f}", flush=True)
        fastps.shutdown()
    except fastps.FastPSError as exc:
        print(f"TENANT-ERROR {type(exc).__name__}: {exc}", flush=True)
        sys.exit(17)


if __name__ == "__main__":
    main()
