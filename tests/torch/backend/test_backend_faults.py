"""Faults under the ``fastps`` backend: a dead rank fails the others' pending op quickly,
naming it; killing the rank that started the scheduler and servers leaves no server
behind; a normal run leaves none either. Workers: ``workers/fault_worker.py``."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Dict, List

import psutil
import pytest
from torchrun import WORKERS, kill_tree, path_env, start_torchrun, torchrun

WORKER = WORKERS / "fault_worker.py"
OP_TIMEOUT = 60.0  # the workers' init_process_group timeout


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _job_servers(job_id: str) -> List[int]:
    """Pids of the ``python -m fastps.server`` processes of job ``job_id`` still running."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if "fastps.server" not in (p.info["cmdline"] or []):
                continue
            if p.environ().get("FASTPS_JOB_ID") == job_id and _alive(p.pid):
                found.append(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def _read_ranks(
    directory: Path, nproc: int, proc: subprocess.Popen, log: Path, limit: float
) -> Dict[int, dict]:
    """Every rank's ``rank<R>.json`` (pid, job id, server pids), once all are written."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        files = sorted(directory.glob("rank*.json"))
        if len(files) == nproc:
            return {int(d["rank"]): d for d in (json.loads(f.read_text()) for f in files)}
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    raise AssertionError(f"the workers did not all start:\n{log.read_text()[-4000:]}")


@pytest.mark.parametrize(
    ("nproc", "path", "victim"), [(2, "shm", 1), (4, "tcp", 2), (4, "hosts", 3)]
)
def test_dead_rank_fails_pending_op(nproc: int, path: str, victim: int) -> None:
    """A rank SIGKILLed while the others wait in an all_reduce: each survivor's op raises
    within far less than the 60 s op timeout, naming the dead rank, and torchrun exits
    non-zero. (With 'hosts' the victim owns a server, which dies with it.)"""
    t0 = time.monotonic()
    proc = torchrun(WORKER, "suicide", str(victim), nproc=nproc, env=path_env(path), timeout=240)
    out = proc.stdout
    assert proc.returncode != 0, out[-4000:]
    # The ranks' lines share torchrun's stdout and may run together: stop at the next one.
    survivors = re.findall(
        r"SURVIVOR rank (\d+): (\w+) after ([\d.]+) s: (.*?)(?=SURVIVOR rank |\n|$)", out
    )
    assert sorted(int(r) for r, *_ in survivors) == [r for r in range(nproc) if r != victim], out[
        -6000:
    ]
    for rank, kind, took, msg in survivors:
        assert float(took) < 45.0, f"rank {rank} waited {took} s (timeout {OP_TIMEOUT:g} s)"
        # by its rank, also when a server it started died with it (the server leaves the
        # verdict to the scheduler)
        named = f"worker {victim} " in msg
        assert named, f"rank {rank}: {kind}: {msg!r} does not name the dead rank {victim}"
    assert "returned" not in out, out[-4000:]
    assert time.monotonic() - t0 < 200


@pytest.mark.parametrize("path", ["shm", "hosts"])
def test_killing_rank0_leaves_no_server(tmp_path: Path, path: str) -> None:
    """kill -9 of rank 0 (it runs the scheduler and started servers): every server it
    started is gone within 10 s (parent-death signal), and every server of the job soon
    after; torchrun exits non-zero."""
    log = tmp_path / "torchrun.log"
    proc = start_torchrun(WORKER, "forever", str(tmp_path), nproc=2, env=path_env(path), log=log)
    try:
        ranks = _read_ranks(tmp_path, 2, proc, log, limit=150)
        job_id = ranks[0]["job_id"]
        own = ranks[0]["servers"]
        assert own, f"rank 0 reports no server: {ranks}"
        running = _job_servers(job_id)
        assert set(own) <= set(running), (own, running)
        for pid in own:
            assert psutil.Process(pid).ppid() == ranks[0]["pid"]
        expected = sum(len(d["servers"]) for d in ranks.values())
        assert len(running) == expected, (running, ranks)
        psutil.Process(ranks[0]["pid"]).kill()
        t0 = time.monotonic()
        while time.monotonic() - t0 < 10 and any(_alive(p) for p in own):
            time.sleep(0.1)
        left = [p for p in own if _alive(p)]
        assert not left, f"rank 0's servers {left} outlived it by 10 s"
        while time.monotonic() - t0 < 30 and _job_servers(job_id):
            time.sleep(0.2)
        assert not _job_servers(job_id), "servers of the job still running 30 s later"
        assert proc.wait(90) != 0, log.read_text()[-4000:]
    finally:
        kill_tree(proc)


def test_normal_run_leaves_no_server(tmp_path: Path) -> None:
    """A job that ends normally (every rank its own host: two servers) leaves no
    ``fastps.server`` process behind."""
    proc = torchrun(WORKER, "normal", str(tmp_path), nproc=2, env=path_env("hosts"), timeout=180)
    assert proc.returncode == 0, proc.stdout[-4000:]
    ranks = {int(f.stem[4:]): json.loads(f.read_text()) for f in tmp_path.glob("rank*.json")}
    servers = [pid for d in ranks.values() for pid in d["servers"]]
    assert len(servers) == 2, ranks
    left = [p for p in servers if _alive(p)] + _job_servers(ranks[0]["job_id"])
    assert not left, f"servers {left} still running after the job ended"
