"""Quorum rounds (FASTPS_ROUND_QUORUM, docs/guide/async.md) with real servers and workers: one
worker delayed by 500 ms; the others never wait for it, every result is the exact sum over
the workers its round counted (scaled by n/k), every worker (the late one included) gets
the same bytes, and a worker may lag only FASTPS_QUORUM_HISTORY rounds
(tests/workers/quorum_worker.py does the pushing). The settings alone:
tests/unit/test_quorum_settings.py."""

from __future__ import annotations

import json
import os
from typing import Dict, List

import pytest
from jobs import DATA_PATHS, WORKERS, Job

QUORUM_WORKER = os.path.join(WORKERS, "quorum_worker.py")
N, K, SLOW = 4, 3, 3


def run_quorum(path: str, steps: int, at: int, delay: float, pace: float, history: int):
    shm, worker_hosts, server_hosts = DATA_PATHS[path](N, 2)
    env = {
        "FASTPS_SHM": shm,
        "FASTPS_PARTITION_BYTES": "64K",
        "FASTPS_ROUND_QUORUM": str(K),
        "FASTPS_QUORUM_HISTORY": str(history),
    }
    argv = [QUORUM_WORKER, str(steps), str(SLOW), str(at), str(delay), str(pace)]
    with Job(N, 2, argv, worker_hosts=worker_hosts, server_hosts=server_hosts, env=env) as job:
        job.wait(240, job.workers())
        steps_of: Dict[int, List[dict]] = {}
        for w in job.workers():
            assert w.popen.returncode == 0 and f"rank {w.index} OK quorum" in w.output, job.dump()
            # a sum that is not a gradient's counted every worker, the late one too
            assert "EXACT ok" in w.output, job.dump()
            steps_of[w.index] = [
                json.loads(line[5:]) for line in w.output.splitlines() if line.startswith("STEP ")
            ]
            assert len(steps_of[w.index]) == steps, job.dump()
        job.wait(30)
    for s in range(steps):
        digests = {steps_of[r][s]["digest"] for r in range(N)}
        assert len(digests) == 1, f"step {s}: workers got different results {steps_of}"
        rec = steps_of[0][s]
        # Every element is the exact sum over k or n workers, scaled by n/count.
        assert rec["covered"] == 40000, rec
        assert all(bin(m).count("1") >= K for m in rec["masks"]), rec
    return steps_of


@pytest.mark.parametrize("path", ["tcp", "shm"])
def test_quorum_others_never_wait_for_a_late_worker(path: str) -> None:
    at, delay = 5, 0.5
    steps_of = run_quorum(path, 30, at, delay, 0.02, history=64)
    # The late worker's push of step `at` came 500 ms after the round had closed: no
    # element of that round counts it.
    for m in steps_of[0][at]["masks"]:
        assert not m & (1 << SLOW), steps_of[0][at]
    for r in range(N):
        if r == SLOW:
            continue
        slowest = max(rec["took"] for rec in steps_of[r])
        assert slowest < 0.6 * delay, f"worker {r} waited {slowest:.3f} s in a step"


def test_quorum_lag_is_bounded_by_the_history() -> None:
    # Four closed rounds kept: a worker 1 s late lets the others run ahead 4 rounds at
    # most, then they wait for it (and the late worker's answers still match theirs).
    at, delay, history = 2, 1.0, 4
    steps_of = run_quorum("tcp", 16, at, delay, 0.02, history=history)
    for r in range(N):
        if r == SLOW:
            continue
        took = [rec["took"] for rec in steps_of[r]]
        waited = [s for s, t in enumerate(took) if t > 0.4 * delay]
        assert waited, f"worker {r} never waited for a worker {delay} s behind: {took}"
        assert at < waited[0] <= at + history, (waited, took)
