"""A worker for tests/integration/test_stall.py: every rank pushes 'common'; then every rank but
LATE_RANK pushes 'lonely' at once, while LATE_RANK pushes it only after LATE_S seconds
(never, if LATE_S < 0), so the others stall on it."""

import os
import time

import fastps.worker.api as api
import numpy as np
from fastps.errors import FastPSAbort

api.init()
rank = api.rank()
late_rank = int(os.environ["LATE_RANK"])
late_s = float(os.environ["LATE_S"])
x = np.ones(1000, np.float32)
api.push_pull(x, average=False, name="common")
if rank == late_rank:
    if late_s < 0:
        time.sleep(120)  # never submits; the job's abort ends it
    time.sleep(late_s)
try:
    out = api.push_pull(x, average=False, name="lonely")
except FastPSAbort as exc:
    print(f"ABORTED: {exc}", flush=True)
    raise SystemExit(3) from None
assert np.all(out == api.size())
print("LONELY DONE", flush=True)
api.shutdown()
