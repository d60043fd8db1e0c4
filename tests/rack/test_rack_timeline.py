"""The timeline on the emulated rack (benchmarks/timeline_rack.py): a 4-worker, 2-server job,
one process per host namespace, gives one merged trace with every stage on every worker and
server track, and the summary names the worker that was slowed before each iteration.
Needs root; skipped with the reason otherwise. Rack prefix ``fptt``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.rack import find_stale, is_supported  # noqa: E402
from benchmarks.timeline_rack import stages_per_process, verify  # noqa: E402

_OK, _WHY = is_supported()
pytestmark = [pytest.mark.root, pytest.mark.skipif(not _OK, reason=_WHY), pytest.mark.timeout(200)]

PREFIX = "fptt"


def test_rack_trace_names_the_straggler(tmp_path: Any) -> None:
    if find_stale(PREFIX):
        pytest.fail(
            f"stale rack objects {find_stale(PREFIX)}; run python -m "
            f"benchmarks.rack.cli down --prefix {PREFIX}"
        )
    out = tmp_path / "rack.json"
    argv = [sys.executable, "-m", "benchmarks.timeline_rack", "--out", str(out)]
    argv += ["--prefix", PREFIX, "--port", "29830", "--iters", "6", "--timeout", "150"]
    argv += ["--straggler", "2", "--delay-ms", "60"]
    r = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=190)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert not find_stale(PREFIX)
    assert "(6 processes, clocks aligned within 0 us)" in r.stdout, r.stdout
    assert "straggler: worker 2 " in r.stdout, r.stdout
    trace = json.loads(out.read_text())
    assert verify(trace, 4, 2) == []
    stages, parts = stages_per_process(trace)
    assert sorted(stages) == [f"server {s}" for s in (0, 1)] + [f"worker {w}" for w in range(4)]
    # Every worker saw the same parts (verify), 6 rounds of each, all summed on the two
    # servers between them, each server holding some.
    per_round = {(t, p) for t, p, _ in parts["worker 0"]}
    assert len(parts["worker 0"]) == 6 * len(per_round)
    assert len(parts["server 0"]) + len(parts["server 1"]) == len(parts["worker 0"])
    assert len(parts["server 0"]) > 0 and len(parts["server 1"]) > 0
