"""A process killed at any stage of start-up: every survivor names it within the heartbeat
timeout, none hangs or crashes (no SIGABRT), and nothing is left in /dev/shm."""

from __future__ import annotations

import glob
import os
import re

import pytest
from jobs import WORKERS, Job

STARTUP_WORKER = os.path.join(WORKERS, "startup_worker.py")
VICTIM = os.path.join(WORKERS, "startup_victim.py")
HEARTBEAT_TIMEOUT = 5.0

CASES = [
    ("worker", 1, "registered"),
    ("worker", 1, "membership"),
    ("worker", 0, "membership"),
    ("worker", 1, "started"),
    ("server", 0, "registered"),
    ("server", 0, "membership"),
]


@pytest.mark.parametrize(("role", "index", "stage"), CASES)
def test_death_during_startup_is_named_by_every_survivor(role: str, index: int, stage: str) -> None:
    victim = f"{role} {index}"
    # Three workers on one host: the local group (shared memory) is part of start-up.
    # At stage "registered" the others register a second later, so the membership is not
    # complete when the victim dies.
    delay = "1.0" if stage == "registered" else "0"
    with Job(
        3,
        1,
        [STARTUP_WORKER, "30", delay],
        heartbeat_timeout=HEARTBEAT_TIMEOUT,
        custom={(role, index): [VICTIM, role, stage]},
    ) as job:
        job.wait(60)
        died = job.proc(role, index).exited_at
        assert died is not None
        for p in job.procs:
            if (p.role, p.index) == (role, index):
                assert p.popen.returncode == -9, job.dump()
                continue
            # A clean failure: an error exit, not a signal (SIGABRT, SIGSEGV).
            assert p.popen.returncode > 0, job.dump()
            assert re.search(rf"\b{victim}\b", p.output), (
                f"{p.role} {p.index} did not name {victim}:\n{job.dump()}"
            )
            if p.role == "worker":
                assert "ERROR-SEEN" in p.output, job.dump()
            # Named and gone within the heartbeat timeout of the death (+1 s to exit).
            assert p.exited_at is not None and p.exited_at - died < HEARTBEAT_TIMEOUT + 1, (
                p.role,
                p.index,
                p.exited_at - died,
                job.dump(),
            )
        assert not glob.glob(f"/dev/shm/fastps-{job.job_id}-*"), job.dump()
