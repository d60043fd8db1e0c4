"""Runs test workers the way PyTorch users launch them: ``torchrun --standalone``.

No fastpsrun: the ``fastps`` torch.distributed backend (and ``hvd.init()``) form the job
through torchrun's store (``fastps.launch.store_rendezvous``)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
WORKERS = HERE / "workers"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _command(
    script: Path, args: Sequence[str], nproc: int, port: int, extra: Sequence[str]
) -> List[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(nproc),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
        *extra,
        str(script),
        *args,
    ]


def _env(env: Optional[Dict[str, str]]) -> Dict[str, str]:
    """The workers' environment: no fastpsrun job to join, one torch thread each."""
    run_env = dict(os.environ if env is None else env)
    run_env.pop("FASTPS_SCHEDULER_ADDR", None)
    run_env.setdefault("PYTHONUNBUFFERED", "1")
    run_env.setdefault("OMP_NUM_THREADS", "1")
    return run_env


def torchrun(
    script: Path,
    *args: str,
    nproc: int = 2,
    env: Optional[Dict[str, str]] = None,
    timeout: float = 240.0,
    torchrun_args: Optional[List[str]] = None,
) -> subprocess.CompletedProcess:
    """``torchrun --nproc-per-node nproc script args`` on a fresh port of this machine;
    returns the finished process (stdout and stderr together in ``.stdout``)."""
    cmd = _command(script, args, nproc, free_port(), torchrun_args or [])
    run_env = _env(env)
    proc = subprocess.Popen(
        cmd,
        env=run_env,
        cwd=str(REPO),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc)  # torchrun's workers run in sessions of their own: end them too
        out, _ = proc.communicate()
        raise subprocess.TimeoutExpired(cmd, timeout, output=out) from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, None)


# The data paths every matrix runs over: shared memory and local reduce between the ranks of
# a host (the default), TCP only, and every rank its own emulated host (workers read
# FASTPS_TEST_DISTINCT_HOSTS and name their host after their rank before joining).
DATA_PATHS: Dict[str, Dict[str, str]] = {
    "shm": {},
    "tcp": {"FASTPS_SHM": "0"},
    "hosts": {"FASTPS_TEST_DISTINCT_HOSTS": "1"},
}


def path_env(path: str, **extra: str) -> Dict[str, str]:
    env = dict(os.environ)
    env.update(DATA_PATHS[path])
    env.update(extra)
    return env


def start_torchrun(
    script: Path,
    *args: str,
    nproc: int = 2,
    env: Optional[Dict[str, str]] = None,
    log: Path,
    port: Optional[int] = None,
) -> subprocess.Popen:
    """:func:`torchrun` without waiting (:func:`kill_tree` ends what it started); stdout
    and stderr go to ``log``; the store listens on ``port`` (default: a free one)."""
    cmd = _command(script, args, nproc, port or free_port(), [])
    run_env = _env(env)
    with open(log, "wb") as out:
        return subprocess.Popen(
            cmd,
            env=run_env,
            cwd=str(REPO),
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILLs what :func:`start_torchrun` started and is still running: torchrun, its
    workers (torchrun starts each in a session of its own) and their servers."""
    import psutil

    try:
        procs = [psutil.Process(proc.pid)]
        procs += procs[0].children(recursive=True)
    except psutil.NoSuchProcess:
        procs = []
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=10)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        pass
