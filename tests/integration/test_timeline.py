"""The job's timeline (docs/guide/timeline.md), with real processes: fastpsrun writes one
merged trace that a Chrome-trace checker accepts; spans nest and are ordered; every part
of every round appears exactly once per stage on every process, on every data path; the
summary names an injected straggler and agrees with the job's own timing. The merge on
recorded events alone: tests/unit/test_timeline_rounds.py."""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
from collections import Counter, defaultdict
from typing import Any, Dict, List, Tuple

import pytest
from fastps.timeline import summarize
from fastps.timeline.merge import merge_files
from fastps.timeline.schema import check
from jobs import DATA_PATHS, WORKERS, Job

WORKER = os.path.join(WORKERS, "timeline_worker.py")
FASTPSRUN = [sys.executable, "-m", "fastps.launcher"]

# The stage sequences a worker's part may go through, by data path (merge.WORKER_STAGES).
DIRECT = ["queued", "push", "at server", "answer", "copy out"]
OWNER_REMOTE = [
    "queued",
    "local reduce",
    "queued for push",
    "push",
    "at server",
    "answer",
    "copy out",
]
OWNER_ALONE = ["queued", "local reduce", "copy out"]  # every worker on one host: no server
NOT_OWNER = ["queued", "at local owner"]
SERVER = ["receive", "wait for workers", "answer"]


def _env(**extra: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPS_")}
    env.update(extra)
    return env


def _run(args: List[str], env: Dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)


def _spans(trace: Dict[str, Any]) -> List[Dict[str, Any]]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def _check_structure(trace: Dict[str, Any], rounds: int, allowed: List[List[str]]) -> None:
    """Every part round once per process, its stages once each, in order, inside it."""
    assert check(trace) == []
    spans = _spans(trace)
    parts = [e for e in spans if e["cat"] == "part"]
    stages = [e for e in spans if e["cat"] == "stage"]
    key = lambda e: (e["pid"], e["args"]["tensor"], e["args"]["part"], e["args"]["round"])  # noqa: E731
    parents = Counter(key(e) for e in parts)
    assert parents and max(parents.values()) == 1, "a part round appears twice on a process"
    by_parent: Dict[Tuple, List[Dict[str, Any]]] = defaultdict(list)
    for s in stages:
        by_parent[key(s)].append(s)
    parent_of = {key(e): e for e in parts}
    for k, kids in by_parent.items():
        assert k in parent_of, f"stage without its part span: {k}"
        p = parent_of[k]
        kids.sort(key=lambda s: (s["ts"], s["dur"]))
        names = [s["name"] for s in kids]
        if p["pid"] > 1000:
            assert names == SERVER, (k, names)
        else:
            assert names in allowed, (k, names)
        end = p["ts"]
        for s in kids:
            assert s["tid"] == p["tid"]
            assert s["ts"] >= end - 0.002, (k, names)  # ordered, not overlapping
            end = s["ts"] + s["dur"]
        assert end <= p["ts"] + p["dur"] + 0.002
        assert abs(kids[0]["ts"] - p["ts"]) < 0.002
    # Every process saw the same rounds of every part.
    per_proc: Dict[int, Counter] = defaultdict(Counter)
    for pid, tensor, part, _rnd in parents:
        per_proc[pid][(tensor, part)] += 1
    for pid, c in per_proc.items():
        assert set(c.values()) == {rounds}, (pid, c)
    workers = [pid for pid in per_proc if pid < 1000]
    for pid in workers:
        assert set(per_proc[pid]) == set(per_proc[workers[0]])
    server_parts = set().union(*[set(c) for pid, c in per_proc.items() if pid > 1000] or [set()])
    if server_parts:
        assert server_parts == set(per_proc[workers[0]])


def test_fastpsrun_writes_one_merged_valid_trace(tmp_path: Any) -> None:
    out = tmp_path / "trace.json"
    rounds = 4
    r = _run(
        [
            *FASTPSRUN,
            "-np",
            "2",
            "--num-servers",
            "2",
            "--timeline-filename",
            str(out),
            sys.executable,
            WORKER,
        ],
        _env(FASTPS_SHM="0", ITERS=str(rounds)),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"timeline: {out} (4 processes" in r.stderr
    assert not (tmp_path / "trace.json.parts").exists()  # merged and cleaned up
    trace = json.loads(out.read_text())
    _check_structure(trace, rounds, [DIRECT])
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert {n.split(" (")[0] for n in names} == {"worker 0", "worker 1", "server 0", "server 1"}
    counters = [e for e in trace["traceEvents"] if e["ph"] == "C"]
    assert {e["name"] for e in counters} == {
        "bytes in flight to server 0",
        "bytes in flight to server 1",
    }
    # Each worker's counter goes back to zero: every pushed byte was answered.
    last: Dict[Tuple[int, str], int] = {}
    for e in sorted(counters, key=lambda e: e["ts"]):
        last[(e["pid"], e["name"])] = e["args"]["bytes"]
    assert set(last.values()) == {0}
    # The servers' sums nest inside their stages.
    sums = [e for e in _spans(trace) if e["cat"] == "sum"]
    assert sums and all(e["pid"] > 1000 for e in sums)
    assert trace["otherData"]["fastps"]["max_clock_error_us"] == 0  # one machine: exact


@pytest.mark.parametrize("path", sorted(DATA_PATHS))
def test_every_part_once_per_stage_on_every_data_path(path: str, tmp_path: Any) -> None:
    n, k, rounds = 4, 2, 3
    shm, whosts, shosts = DATA_PATHS[path](n, k)
    out = str(tmp_path / "trace.json")
    env = {"FASTPS_SHM": shm, "FASTPS_TIMELINE": out, "ITERS": str(rounds)}
    with Job(n, k, [WORKER], env=env, worker_hosts=whosts, server_hosts=shosts) as job:
        job.wait(180)
        for p in job.procs:
            assert p.popen.returncode == 0, job.dump()
    info = merge_files(out)
    assert info is not None and info["processes"] == n + k
    trace = json.load(open(out))
    allowed = {
        "tcp": [DIRECT],
        "shm": [DIRECT],
        "hosts": [DIRECT],
        "local": [OWNER_ALONE, NOT_OWNER],
    }[path]
    _check_structure(trace, rounds, allowed)
    if path == "local":
        stages = Counter(e["name"] for e in _spans(trace))
        assert stages["local reduce"] > 0 and stages["at local owner"] > 0


def test_summarize_names_the_injected_straggler(tmp_path: Any) -> None:
    out = tmp_path / "trace.json"
    r = _run(
        [
            *FASTPSRUN,
            "-np",
            "3",
            "--num-servers",
            "2",
            "--timeline-filename",
            str(out),
            sys.executable,
            WORKER,
        ],
        _env(FASTPS_SHM="0", ITERS="6", DELAY_RANK="0", DELAY_RANK_S="0.04"),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    png = tmp_path / "gantt.png"
    s = _run(
        [sys.executable, "-m", "fastps.timeline", "summarize", str(out), "--plot", str(png)],
        os.environ.copy(),
    )
    assert s.returncode == 0, s.stdout + s.stderr
    assert "straggler: worker 0 " in s.stdout, s.stdout
    table, name = summarize.stragglers(summarize.load(str(out)))
    assert name == "worker 0"
    assert table["worker 0"]["median_ms"] > 20  # it slept 40 ms before each round
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for heading in ("per stage:", "per tensor", "critical path", "links"):
        assert heading in s.stdout


def test_summary_agrees_with_the_jobs_own_timing(tmp_path: Any) -> None:
    """Each worker times every round itself (submission to the last synchronize); the
    trace's round time of that worker (first part submitted to last part out) agrees."""
    out = tmp_path / "trace.json"
    rounds = 8
    r = _run(
        [
            *FASTPSRUN,
            "-np",
            "2",
            "--num-servers",
            "1",
            "--timeline-filename",
            str(out),
            sys.executable,
            WORKER,
        ],
        _env(FASTPS_SHM="0", ITERS=str(rounds), SIZES="2000000,3000000"),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    own: Dict[Tuple[str, int], float] = {}
    for m in re.finditer(r"\[worker (\d+)\] ROUND (\d+) ([\d.]+)", r.stdout):
        own[(f"worker {m[1]}", int(m[2]))] = float(m[3])
    tl = summarize.load(str(out))
    traced: Dict[Tuple[str, int], Tuple[float, float]] = {}
    for s in tl.worker_parts():
        a, b = traced.get((s.proc, s.args["round"]), (s.ts, s.end))
        traced[(s.proc, s.args["round"])] = (min(a, s.ts), max(b, s.end))
    keys = [k for k in own if k[1] > 0]  # round 0 also declares the tensors
    assert len(keys) == 2 * (rounds - 1)
    ratio = sum(traced[k][1] - traced[k][0] for k in keys) / sum(own[k] for k in keys)
    # The trace's spans lie inside the worker's own (each part's done mark precedes the
    # waiter's wake-up), but 1.0017 was seen once at a load of 8 on 2 cores (cause not
    # traced): 1% over is allowed, a miscount of whole parts or rounds is far larger.
    assert 0.95 <= ratio <= 1.01, (ratio, statistics.median(own.values()))
