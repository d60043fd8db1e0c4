"""An op given up just as its gather completes (issue 13's reducescatter stall under load):
the rank that withdrew still moves its data, so the others' op finishes instead of waiting
forever for its parts; a push_pull dropped unfinished blocks no thread and is released
once the core finished it (``tests/workers/late_completion_worker.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any, Dict, List

from fastps.control.protocol import ControlClient
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


def _client() -> Any:
    """A ControlClient with no connection: only its message handling is exercised."""
    return ControlClient(("127.0.0.1", 1), "job", "token")


def test_client_routes_a_completion_read_before_the_withdraw_ack() -> None:
    """The scheduler answers in order: a completion read before the acknowledgement of a
    withdrawal is the withdrawn announcement's; after it, a new announcement's."""
    c = _client()
    sent: List[Dict[str, Any]] = []
    c._send = sent.append
    c._check_live = lambda: None
    got: List[str] = []
    c.coordinate(0, [0, 1], "x", {}, lambda m: got.append("first"))
    c.withdraw(0, [0, 1], "x")
    seq = sent[-1]["seq"]
    assert sent[-1]["withdraw"] is True
    # Re-announced before the acknowledgement came back.
    c.coordinate(0, [0, 1], "x", {}, lambda m: got.append("second"))
    c._dispatch({"type": "coord_done", "set": 0, "name": "x", "records": [{}, {}]})
    assert got == ["first"]
    c._dispatch({"type": "coord_withdrawn", "set": 0, "name": "x", "seq": seq})
    c._dispatch({"type": "coord_done", "set": 0, "name": "x", "records": [{}, {}]})
    assert got == ["first", "second"]
    # A withdrawal that took effect: the next completion is the new announcement's.
    c.coordinate(0, [0, 1], "y", {}, lambda m: got.append("y1"))
    c.withdraw(0, [0, 1], "y")
    c._dispatch({"type": "coord_withdrawn", "set": 0, "name": "y", "seq": sent[-1]["seq"]})
    c.coordinate(0, [0, 1], "y", {}, lambda m: got.append("y2"))
    c._dispatch({"type": "coord_done", "set": 0, "name": "y", "records": [{}, {}]})
    assert got == ["first", "second", "y2"]
    assert c._withdrawn == {} and c._coords == {}
