"""Worker program for the shared-memory and local-reduce tests.

Modes: ``sum`` checks sums over a few iterations and prints the data-path statistics;
``error-exit`` raises after a few sums (so the process exits with an error);
``kill`` has rank 1 SIGKILL itself mid-run while the others keep pushing; ``mismatch``
gives rank 1 a different shape than its local peers.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import sys
import time

import fastps
import numpy as np
from fastps.worker import api


def shm_files() -> int:
    """This worker's own segment name: removed as soon as its peers and servers mapped it."""
    job = os.environ["FASTPS_JOB_ID"]
    return len(glob.glob(f"/dev/shm/fastps-{job}-w{fastps.rank()}"))


def sums(iters: int) -> None:
    rank, size = fastps.rank(), fastps.size()
    sizes = [1, 1000, 70_000, 300_001, 1 << 20]
    for it in range(iters):
        hs = []
        for j, n in enumerate(sizes):
            x = np.arange(n, dtype=np.float32) * (rank + 1) + it
            hs.append((fastps.push_pull_async(x, average=(j % 2 == 1), name=f"p{j}", out=x), n, j))
        for h, n, j in hs:
            want = np.arange(n, dtype=np.float32) * (size * (size + 1) / 2) + it * size
            if j % 2 == 1:
                want = want / size
            got = h.synchronize()
            assert np.allclose(got, want, rtol=1e-5), (n, got[:3], want[:3])


def main() -> None:
    mode = sys.argv[1]
    fastps.init()
    print(f"SHM-FILES-AFTER-INIT {shm_files()}", flush=True)
    rank = fastps.rank()
    if mode == "sum":
        sums(3)
        print("STATS " + json.dumps(api.data_path_stats()), flush=True)
        print("SHM-OK", flush=True)
    elif mode == "error-exit":
        sums(1)
        if rank == 0:
            raise RuntimeError("deliberate failure in worker 0")
        sums(100)  # the others are stopped by the abort
    elif mode == "kill":
        sums(1)
        fastps.barrier()
        t0 = time.monotonic()
        if rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            sums(1000)
        except fastps.FastPSError as exc:
            print(f"ERROR-SEEN {time.monotonic() - t0:.2f} {type(exc).__name__}: {exc}", flush=True)
            sys.exit(17)
    elif mode == "mismatch":
        sums(1)
        t0 = time.monotonic()
        shape = (10, 3) if rank != 1 else (10, 4)
        try:
            fastps.push_pull(np.ones(shape, np.float32), name="fc.weight")
        except fastps.FastPSError as exc:
            print(f"ERROR-SEEN {time.monotonic() - t0:.2f} {type(exc).__name__}: {exc}", flush=True)
            sys.exit(17)
    fastps.shutdown()


if __name__ == "__main__":
    main()
