"""Times push_pull of one tensor across emulated hosts and checks the sum (pacing test)."""

from __future__ import annotations

import sys
import time

import fastps
import numpy as np


def main() -> None:
    nbytes = int(sys.argv[1])
    fastps.init()
    rank, size = fastps.rank(), fastps.size()
    n = nbytes // 4
    x = np.full(n, rank + 1, dtype=np.float32)
    fastps.push_pull(x, average=False, name="warm")  # connections up, buffers allocated
    t0 = time.monotonic()
    got = fastps.push_pull(x, average=False, name="timed")
    elapsed = time.monotonic() - t0
    want = size * (size + 1) / 2
    assert np.all(got == want), (rank, got[:3], want)
    print(f"ELAPSED {elapsed:.4f}", flush=True)
    fastps.shutdown()


if __name__ == "__main__":
    main()
