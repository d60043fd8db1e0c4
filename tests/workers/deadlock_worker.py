"""A worker for tests/integration/test_stall.py: deadlocks the stall inspector must prove
permanent, and a job that only looks stuck. SCENARIO:

- ``order``: push_pull 'a' then 'b' on rank 0, 'b' then 'a' on the others;
- ``collective_order``: the same with the collective layer's allreduce (the waits are
  announcements the scheduler holds, no push_pull);
- ``skip_then_barrier``: the last rank skips push_pull 'lonely' and enters a barrier;
- ``progressing``: rank 0 waits on 'lonely' while the others run allreduces on their own
  process set for STEPS steps (slow, but progressing) and then push it.

Prints ``DONE`` when the scenario completes, ``ABORTED: <reason>`` when the job was aborted
(and exits 3)."""

from __future__ import annotations

import os
import time

import fastps
import numpy as np
from fastps.collectives import ops as C
from fastps.errors import FastPSError
from fastps.worker import api

fastps.init()
C.start_session()
rank, size = api.rank(), api.size()
scenario = os.environ["SCENARIO"]
x = np.ones(64, np.float32)


def push(name: str) -> None:
    out = api.push_pull(x, average=False, name=name)
    assert np.all(out == size), out


def collective(name: str) -> None:
    out = C.allreduce_async(x, "float32", name, C.ReduceOp.SUM).synchronize()
    assert np.all(out == size), out


try:
    push("warmup")
    if scenario == "order":
        for name in ("a", "b") if rank == 0 else ("b", "a"):
            push(name)
    elif scenario == "collective_order":
        for name in ("a", "b") if rank == 0 else ("b", "a"):
            collective(name)
    elif scenario == "skip_then_barrier":
        if rank != size - 1:
            push("lonely")
        api.barrier()
    elif scenario == "progressing":
        others = C.add_process_set(list(range(1, size)))
        if rank != 0:
            for i in range(int(os.environ["STEPS"])):
                op = C.allreduce_async(x, "float32", f"p.{i}", C.ReduceOp.SUM, process_set=others)
                time.sleep(0.2 * rank)  # in flight while computing; the last rank the slowest
                assert np.all(op.synchronize() == size - 1)
        push("lonely")
    else:
        raise SystemExit(f"unknown SCENARIO {scenario!r}")
except FastPSError as exc:
    print(f"ABORTED: {exc}", flush=True)
    raise SystemExit(3) from None
print("DONE", flush=True)
C.end_session()
api.shutdown()
