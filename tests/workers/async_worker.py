"""Async mode (docs/guide/async.md) from one worker's side, run by
tests/integration/test_async.py. The servers keep a parameter of ELEMS float64 (several
parts over every server); rank 0 sets it to 1, the others start from 0 and receive rank 0's
1 (plus updates already made). Each step a worker pushes the delta (rank + 1) and receives
the parameter; the worker at rank ``slow`` sleeps ``delay`` s before each step. Prints per
step a ``STEP`` JSON line (wall time, the least and most applied deltas), after a barrier
reads the parameter back (every update applied: a ``READ`` line), and prints ``rank R OK
async``."""

from __future__ import annotations

import json
import os
import sys
import time

import fastps
import numpy as np
from fastps.worker import async_mode

STEPS, SLOW, DELAY = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
ELEMS = 50000


def main() -> None:
    fastps.init()
    rank, n = fastps.rank(), fastps.size()
    staleness = int(os.environ.get("FASTPS_STALENESS", "-1"))
    param = np.full(ELEMS, 1.0 if rank == 0 else 0.0)
    async_mode.init_params([("w", param)])
    # Rank 0's value, plus the updates of workers that started before this one's init was
    # answered (async: a late starter begins from the parameters as they stand).
    assert (param >= 1.0).all() and (rank != 0 or (param == 1.0).all()), (rank, param[:4])
    if "refusals" in sys.argv[4:]:
        # An update of a parameter rank 0 never set fails that op, naming it; the job goes on.
        lone = np.zeros(8)
        try:
            for h in async_mode.update_async([("never_set", lone, lone)]):
                h.synchronize()
        except fastps.FastPSError as exc:
            assert "before rank 0 set its initial parameters" in str(exc), exc
            assert f"worker {rank}" in str(exc), exc
        else:
            raise AssertionError("an update before init was accepted")
    delta = np.full(ELEMS, float(rank + 1))
    total = n * (n + 1) / 2  # every worker's delta, once each
    for step in range(1, STEPS + 1):
        if rank == SLOW:
            time.sleep(DELAY)
        t0 = time.monotonic()
        for h in async_mode.update_async([("w", delta, param)]):
            h.synchronize()
        took = time.monotonic() - t0
        # Every part holds 1 + the deltas applied: this worker's `step`, the others' some.
        applied = param - 1.0
        lo, hi = float(applied.min()), float(applied.max())
        if staleness == 0:
            assert lo == hi == step * total, (rank, step, lo, hi)
        own = step * (rank + 1)
        others_min = (step - staleness) * (total - rank - 1) if staleness >= 0 else 0
        assert lo >= own + max(others_min, 0), (rank, step, lo, own, others_min)
        print("STEP " + json.dumps({"step": step, "took": took, "lo": lo, "hi": hi}), flush=True)
    fastps.barrier()
    out = np.zeros(ELEMS)
    async_mode.read_params([("w", out)])
    want = 1.0 + STEPS * total
    bad = int((out != want).sum())
    print(f"READ {bad} of {ELEMS} differ from {want}", flush=True)
    assert bad == 0
    fastps.barrier()
    print(f"rank {rank} OK async", flush=True)
    fastps.shutdown()


if __name__ == "__main__":
    main()
