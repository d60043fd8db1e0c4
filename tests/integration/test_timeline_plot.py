"""``python -m fastps.timeline summarize TRACE --plot out.png`` where matplotlib is missing
(an optional dependency, the ``plot`` extra): one clear line naming what to install and a
non-zero exit, not a traceback; the text summary itself needs no matplotlib.

matplotlib is made unimportable for one process, in a subprocess by an import blocker that a
``sitecustomize`` on PYTHONPATH puts first on ``sys.meta_path``, in this process by a
``None`` in ``sys.modules``. The trace is written here: two workers and a server, two rounds
of one tensor, as the merged timeline lays them out (docs/guide/timeline.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest
from fastps.errors import FastPSError
from fastps.timeline import summarize

BLOCKER = '''\
import sys


class NoMatplotlib:
    """Finds every matplotlib module as a missing one."""

    def find_spec(self, name, path=None, target=None):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NoMatplotlib())
'''

WORKER_STAGES = [
    ("queued", 50),
    ("push", 100),
    ("at server", 150),
    ("answer", 100),
    ("copy out", 100),
]
SERVER_STAGES = [("receive", 50), ("wait for workers", 100), ("answer", 100)]


def _trace() -> Dict[str, Any]:
    events: List[Dict[str, Any]] = []

    def span(pid: int, name: str, cat: str, ts: float, dur: float, rnd: int, **args: Any) -> None:
        args.update(tensor="w", part=0, round=rnd)
        e = {"ph": "X", "pid": pid, "tid": 100, "name": name, "cat": cat, "ts": ts, "dur": dur}
        events.append({**e, "args": args})

    for rnd in range(2):
        t0 = 1000.0 * rnd
        for pid in (1, 2):  # workers 0 and 1
            span(pid, "w", "part", t0, 500, rnd, bytes=4096)
            at = t0
            for name, dur in WORKER_STAGES:
                span(pid, name, "stage", at, dur, rnd)
                at += dur
        span(1001, "w", "part", t0 + 150, 250, rnd, bytes=4096, last_worker=1)  # server 0
        at = t0 + 150
        for name, dur in SERVER_STAGES:
            span(1001, name, "stage", at, dur, rnd)
            at += dur
    return {"traceEvents": events}


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(_trace()))
    return path


def _no_matplotlib_env(tmp_path: Path) -> Dict[str, str]:
    """This process's environment (the checkout importable), with the blocker installed."""
    blocker = tmp_path / "no-matplotlib"
    blocker.mkdir(exist_ok=True)
    (blocker / "sitecustomize.py").write_text(BLOCKER)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPS_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(blocker), env.get("PYTHONPATH")) if p)
    return env


def _run(args: List[str], env: Dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=120
    )


def _without_matplotlib(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m fastps.timeline ARGS`` in a process that cannot import matplotlib."""
    return _run(["-m", "fastps.timeline", *args], _no_matplotlib_env(tmp_path))


def test_the_blocker_hides_matplotlib(tmp_path: Path) -> None:
    r = _run(["-c", "import matplotlib"], _no_matplotlib_env(tmp_path))
    assert r.returncode != 0 and "No module named 'matplotlib'" in r.stderr, r.stderr


def test_plot_without_matplotlib_says_what_to_install(trace: Path, tmp_path: Path) -> None:
    png = tmp_path / "gantt.png"
    r = _without_matplotlib(tmp_path, "summarize", str(trace), "--plot", str(png))
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "Traceback" not in out, out
    assert "needs matplotlib" in r.stderr, out
    assert "pip install 'fastps[plot]'" in r.stderr, out
    assert "per stage:" not in r.stdout, "it failed after the work rather than before"
    assert not png.exists()


def test_the_summary_itself_needs_no_matplotlib(trace: Path, tmp_path: Path) -> None:
    r = _without_matplotlib(tmp_path, "summarize", str(trace))
    assert r.returncode == 0, r.stdout + r.stderr
    for heading in ("per stage:", "per tensor", "critical path", "links"):
        assert heading in r.stdout, r.stdout


def test_plot_raises_an_import_error_that_is_a_fastps_error(
    trace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(summarize.PlotUnavailable, match=r"fastps\[plot\]") as info:
        summarize.plot(summarize.load(str(trace)), str(tmp_path / "x.png"))
    assert isinstance(info.value, ImportError) and isinstance(info.value, FastPSError)


def test_plot_draws_the_trace_where_matplotlib_is_installed(trace: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "gantt.png"
    assert summarize.plot(summarize.load(str(trace)), str(png)) == 1  # the median iteration
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_of_an_iteration_the_trace_lacks_is_a_clear_error(trace: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    args = ["summarize", str(trace), "--plot", str(tmp_path / "x.png"), "--iteration", "7"]
    r = _run(["-m", "fastps.timeline", *args], dict(os.environ))
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert "no stages of iteration 7" in r.stderr, r.stderr
