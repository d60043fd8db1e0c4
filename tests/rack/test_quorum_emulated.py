"""Quorum rounds with a straggler behind a slow link, on the emulated rack: the job must end
cleanly. The straggler still has late answers in flight when it shuts down; closing its
sockets with them unread used to reset the connections, lose its bye, and fail the server
("worker 3 ... disconnected from server 0: receive failed: Connection reset by peer").

Rack prefix ``fpsq`` (docs/design/rack.md lists the others).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # plain `pytest` does not put the repo root on sys.path
    sys.path.insert(0, str(REPO))

from benchmarks.rack import is_supported  # noqa: E402

_OK, _WHY = is_supported()
pytestmark = [pytest.mark.root, pytest.mark.skipif(not _OK, reason=_WHY), pytest.mark.timeout(240)]


def test_quorum_with_a_slow_linked_straggler_ends_cleanly(tmp_path: Path) -> None:
    out = tmp_path / "straggler.json"
    cmd = [
        sys.executable,
        str(REPO / "benchmarks" / "bench_straggler.py"),
        "--rack",
        "--task",
        "digits",
        "--np",
        "4",
        "--iters",
        "20",
        "--warmup",
        "2",
        "--compute-ms",
        "50",
        "--only",
        "link:quorum-n-1",
        "--prefix",
        "fpsq",
        "--base-port",
        "35600",
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=220)
    assert out.exists(), proc.stdout[-4000:] + proc.stderr[-4000:]
    configs = json.loads(out.read_text())["configs"]
    for name in ("sync-no-straggler", "link:quorum-n-1"):
        result = configs[name]["result"]
        assert result["status"] == "ok", (name, result["status"], proc.stdout[-4000:])
    # The straggler really was slower, so late answers were in flight at the end.
    quorum = configs["link:quorum-n-1"]["result"]
    assert quorum["straggler_ms_per_iter"] > 1.3 * quorum["fast_ms_per_iter"], quorum
