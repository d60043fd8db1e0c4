"""An op given up just as its gather completes (issue 13's reducescatter stall under load):
the rank that withdrew still moves its data, so the others' op finishes instead of waiting
forever for its parts; a push_pull dropped unfinished blocks no thread and is released
once the core finished it (``tests/workers/late_completion_worker.py``). The client's
routing of completions alone: tests/unit/test_late_completion_routing.py."""

from __future__ import annotations

import os
import subprocess
import sys

from jobs import WORKERS

WORKER = os.path.join(WORKERS, "late_completion_worker.py")


def test_withdrawn_op_whose_gather_completed_still_moves_its_data() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPS_")}
    # Short, so that without the fix rank 1's stuck reducescatter fails the job quickly.
    env.update(FASTPS_OP_TIMEOUT="10", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    res = subprocess.run(
        [sys.executable, "-m", "fastps.launcher", "-np", "2", sys.executable, WORKER],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-6000:]
    for rank in (0, 1):
        assert f"rank {rank} LATE OK" in res.stdout, out[-6000:]
        assert f"rank {rank} ABANDON OK" in res.stdout, out[-6000:]
        assert f"rank {rank} GIVE UP OK" in res.stdout, out[-6000:]
    assert "did not start" not in res.stdout  # rank 1's op never missed rank 0's data
