"""The stall inspector with real processes (core/worker/stall.py, core/control/stalls.py):
ranks that wait on a tensor some rank did not submit log who is missing what; past
FASTPS_STALL_SHUTDOWN_S the job stops with an error naming them; a stall proven permanent
(every rank waits for a rank that waits too) stops the job at once, naming the cycle. The
inspector's judgement alone, without a job: tests/unit/test_stall_inspector.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Dict, Tuple

import pytest
from jobs import WORKERS

WORKER = os.path.join(WORKERS, "stall_worker.py")
DEADLOCK_WORKER = os.path.join(WORKERS, "deadlock_worker.py")
FASTPSRUN = [sys.executable, "-m", "fastps.launcher"]
PERMANENT = "permanent stall (no rank can make progress): "


def _run(
    env_extra: Dict[str, str], timeout: float = 120, worker: str = WORKER, np: int = 3
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPS_")}
    env.update(env_extra)
    return subprocess.run(
        [*FASTPSRUN, "-np", str(np), "--num-servers", "1", sys.executable, worker],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_waiting_ranks_name_the_missing_rank_and_tensor() -> None:
    r = _run({"FASTPS_STALL_WARNING_S": "1", "LATE_RANK": "2", "LATE_S": "4"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("LONELY DONE") == 3
    for rank in (0, 1):
        lines = [
            line
            for line in r.stderr.splitlines()
            if line.startswith(f"[worker {rank}]") and "stall:" in line
        ]
        assert lines, r.stderr
        assert "tensor 'lonely'" in lines[0] and "rank 2 did not submit it" in lines[0]
        assert "ranks 0, 1" in lines[0]
    # The rank that is late waits for nothing, so it reports nothing; 'common' never stalled.
    assert not any(
        line.startswith("[worker 2]") and "stall:" in line for line in r.stderr.splitlines()
    )
    assert "'common'" not in r.stderr
    # The late rank sleeps (it waits for nothing): a stall, never a permanent one.
    assert "permanent stall" not in r.stdout + r.stderr


def test_stall_shutdown_stops_the_job_naming_rank_and_tensor() -> None:
    r = _run(
        {
            "FASTPS_STALL_WARNING_S": "1",
            "FASTPS_STALL_SHUTDOWN_S": "3",
            "LATE_RANK": "1",
            "LATE_S": "-1",
        }
    )
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "FASTPS_STALL_SHUTDOWN_S=3" in out
    assert "tensor 'lonely'" in out and "rank 1 did not submit it" in out
    aborted = [line for line in r.stdout.splitlines() if "ABORTED:" in line]
    assert aborted and all("rank 1 did not submit it" in line for line in aborted), out


# --------------------------------------------------------------- permanent stalls, for real

# A deadlock must end the job within a few warning periods, the op and barrier timeouts
# being far away (10 min): it is the inspector that ends it.
WARNING_S = 2.0
FAR = "600"


def _deadlock(scenario: str, np: int, **extra: str) -> Tuple[subprocess.CompletedProcess, float]:
    env = {
        "SCENARIO": scenario,
        "FASTPS_STALL_WARNING_S": str(WARNING_S),
        "FASTPS_OP_TIMEOUT": FAR,
        "FASTPS_TIMEOUT": FAR,
        **extra,
    }
    start = time.monotonic()
    r = _run(env, timeout=180, worker=DEADLOCK_WORKER, np=np)
    return r, time.monotonic() - start


@pytest.mark.parametrize(
    "scenario,np,expected",
    [
        (
            "order",
            2,
            "rank 0 waits for round 1 of 'a', which rank 1 has not submitted; "
            "rank 1 waits for round 1 of 'b', which rank 0 has not submitted",
        ),
        (
            "collective_order",
            3,
            "rank 0 waits in collective 'a', which ranks 1, 2 have not called; "
            "ranks 1, 2 wait in collective 'b', which rank 0 has not called",
        ),
        (
            "skip_then_barrier",
            3,
            "ranks 0, 1 wait for round 1 of 'lonely', which rank 2 has not submitted; "
            "rank 2 waits in barrier 'barrier.0', which ranks 0, 1 have not entered",
        ),
    ],
)
def test_permanent_stall_ends_the_job_at_once(scenario: str, np: int, expected: str) -> None:
    r, took = _deadlock(scenario, np)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    # Startup, a warning period, a poll and the proof's second look: far below 10 min.
    assert took < 60, f"{took:.0f} s\n{out}"
    assert f"job aborted: {PERMANENT}{expected}" in out, out
    aborted = [line for line in r.stdout.splitlines() if "ABORTED:" in line]
    assert len(aborted) == np and all(PERMANENT + expected in line for line in aborted), out
    assert "DONE" not in r.stdout


def test_ranks_progressing_on_a_process_set_are_not_a_permanent_stall() -> None:
    """Rank 0 waits on 'lonely' for many warning periods while ranks 1 and 2, each with an
    allreduce of their own process set in flight while they compute, make progress."""
    r, _ = _deadlock("progressing", 3, STEPS="12", FASTPS_STALL_WARNING_S="1")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert r.stdout.count("DONE") == 3, out
    assert "tensor 'lonely' has waited" in out  # it was a stall, and warned about
    assert "permanent stall" not in out
    # A process set's parts are owed by its members only: rank 0 is never named for one.
    assert not any("'p." in line and "rank 0 did not" in line for line in out.splitlines()), out


# --------------------------------------------------------------- the decision, without processes
