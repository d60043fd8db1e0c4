"""Worker program for the rack-hierarchy tests (FASTPS_RACK per process).

Modes: ``sum`` checks exact float64 sums of several tensor sizes over a few rounds and
prints RACK-OK; ``until-abort`` sums once, prints READY, then keeps summing until the job
is aborted and prints the abort's message after ABORTED.
"""

from __future__ import annotations

import sys

import fastps
import numpy as np
from fastps.errors import FastPSError

SIZES = [1, 1000, 70_000, 300_001, 1 << 20]


def sums(rounds: int) -> None:
    rank, size = fastps.rank(), fastps.size()
    for it in range(rounds):
        hs = []
        for j, n in enumerate(SIZES):
            # Integers below 2^53: float64 sums are exact whatever the order.
            x = np.arange(n, dtype=np.float64) * (rank + 1) + it * 1000 + rank
            hs.append((fastps.push_pull_async(x, average=False, name=f"r{j}", out=x), n))
        for h, n in hs:
            want = (
                np.arange(n, dtype=np.float64) * (size * (size + 1) / 2)
                + it * 1000 * size
                + size * (size - 1) / 2
            )
            got = h.synchronize()
            assert np.array_equal(got, want), (rank, n, it, got[:3], want[:3])


def main() -> None:
    mode = sys.argv[1]
    fastps.init()
    if mode == "sum":
        sums(3)
        print("RACK-OK", flush=True)
    elif mode == "until-abort":
        sums(1)
        print("READY", flush=True)
        try:
            for _ in range(10_000):
                sums(1)
        except FastPSError as exc:
            print(f"ABORTED {exc}", flush=True)
            sys.exit(3)
        raise AssertionError("the job was never aborted")
    fastps.shutdown()


if __name__ == "__main__":
    main()
