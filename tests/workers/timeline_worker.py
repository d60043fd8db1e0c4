"""A worker for tests/integration/test_timeline.py: ITERS rounds of three tensors (a small one, one
cut into several parts, one in between), submitted together. DELAY_RANK sleeps
DELAY_RANK_S before each round (an injected straggler). Prints each round's own timing
(submission to the last synchronize) as "ROUND k us". PAUSE_S sleeps after every round on
every rank (so a job lasts long enough for several heartbeats)."""

import os
import time

import fastps.worker.api as api
import numpy as np

api.init()
rank = api.rank()
delay = float(os.environ.get("DELAY_RANK_S", "0"))
if rank != int(os.environ.get("DELAY_RANK", "-1")):
    delay = 0.0
sizes = [int(x) for x in os.environ.get("SIZES", "1000,300000,70000").split(",")]
tensors = [np.full(n, rank + 1, np.float32) for n in sizes]
expect = sum(range(1, api.size() + 1))
for k in range(int(os.environ.get("ITERS", "5"))):
    if delay:
        time.sleep(delay)
    t0 = time.monotonic_ns()
    with api.submission_batch():
        hs = [
            api.push_pull_async(t, average=False, name=f"t{i}", priority=-i)
            for i, t in enumerate(tensors)
        ]
    outs = [api.synchronize(h) for h in hs]
    print(f"ROUND {k} {(time.monotonic_ns() - t0) / 1000.0:.1f}", flush=True)
    for out in outs:
        assert np.all(out == expect), (out[:4], expect)
    time.sleep(float(os.environ.get("PAUSE_S", "0")))
api.shutdown()
