"""Times push_pull across emulated hosts and checks the sums (pacing tests).

``pacing_worker.py NBYTES``: one tensor of NBYTES, timed after a warm-up round.
``pacing_worker.py NBYTES ROUNDS``: ROUNDS push_pulls of NBYTES each, one after the other,
timed together (short bursts, the pacing burst rule); prints the worker's data-path stats.
"""

from __future__ import annotations

import json
import sys
import time

import fastps
import numpy as np
from fastps.worker import api


def main() -> None:
    nbytes = int(sys.argv[1])
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    fastps.init()
    rank, size = fastps.rank(), fastps.size()
    n = nbytes // 4
    x = np.full(n, rank + 1, dtype=np.float32)
    fastps.push_pull(x, average=False, name="warm")  # connections up, buffers allocated
    want = size * (size + 1) / 2
    t0 = time.monotonic()
    for i in range(rounds):
        got = fastps.push_pull(x, average=False, name="timed")
        assert np.all(got == want), (rank, i, got[:3], want)
    elapsed = time.monotonic() - t0
    print(f"ELAPSED {elapsed:.4f}", flush=True)
    print("STATS " + json.dumps(api.data_path_stats()), flush=True)
    fastps.shutdown()


if __name__ == "__main__":
    main()
