"""Async mode (FASTPS_MODE=async, docs/guide/async.md) with real servers: rank 0's parameters
reach every worker through the servers, updates are applied exactly once, a read after the
last update returns every worker's deltas (a checkpoint from any worker), and the
staleness bound: with one worker slowed, the fast ones run s updates ahead of it without
waiting and wait at the next, not before (tests/workers/async_worker.py)."""

from __future__ import annotations

import json
import os
from typing import Dict, List, Optional

import pytest
from jobs import DATA_PATHS, WORKERS, Job

ASYNC_WORKER = os.path.join(WORKERS, "async_worker.py")
N, SLOW = 3, 2


def run_async(staleness: Optional[int], steps: int, delay: float, path: str = "tcp", *extra: str):
    shm, worker_hosts, server_hosts = DATA_PATHS[path](N, 2)
    env = {"FASTPS_SHM": shm, "FASTPS_PARTITION_BYTES": "64K", "FASTPS_MODE": "async"}
    if staleness is not None:
        env["FASTPS_STALENESS"] = str(staleness)
    argv = [ASYNC_WORKER, str(steps), str(SLOW), str(delay), *extra]
    with Job(N, 2, argv, worker_hosts=worker_hosts, server_hosts=server_hosts, env=env) as job:
        job.wait(240, job.workers())
        steps_of: Dict[int, List[dict]] = {}
        for w in job.workers():
            assert w.popen.returncode == 0 and f"rank {w.index} OK async" in w.output, job.dump()
            steps_of[w.index] = [
                json.loads(line[5:]) for line in w.output.splitlines() if line.startswith("STEP ")
            ]
        job.wait(30)
    return steps_of


@pytest.mark.parametrize("s", [1, 3])
def test_staleness_bound_makes_fast_workers_wait_at_s_not_before(s: int) -> None:
    delay = 0.4
    steps_of = run_async(s, s + 3, delay)
    for r in range(N):
        if r == SLOW:
            continue
        took = [rec["took"] for rec in steps_of[r]]
        # Updates 1..s run ahead of the slow worker's first: none waits.
        assert all(t < 0.5 * delay for t in took[:s]), (r, took)
        # Update s+1 needs the slow worker's first, ~delay after the start.
        assert took[s] > 0.5 * delay, (r, took)


def test_unbounded_async_never_waits() -> None:
    delay = 0.3
    steps_of = run_async(None, 5, delay)
    for r in range(N):
        if r != SLOW:
            assert max(rec["took"] for rec in steps_of[r]) < 0.5 * delay, steps_of[r]


@pytest.mark.parametrize("path", ["tcp", "shm"])
def test_staleness_zero_is_synchronous(path: str) -> None:
    # The worker checks that every answer holds exactly step * (1 + ... + n) of deltas.
    run_async(0, 4, 0.05, path)


def test_update_before_init_is_refused_by_name() -> None:
    run_async(None, 2, 0.0, "tcp", "refusals")
