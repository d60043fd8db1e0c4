"""Helpers for the TensorFlow plugin tests: run a worker script as a fastps job."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

HERE = Path(__file__).resolve().parent
WORKERS = HERE / "workers"
ROOT = HERE.parent.parent


def job_env(op_timeout: float = 90) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPS_")}
    env.update(
        {
            "PYTHONUNBUFFERED": "1",
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "TF_ENABLE_ONEDNN_OPTS": "0",
            # A wedged job must fail the test, not hang it: operations give up after this.
            "FASTPS_OP_TIMEOUT": str(op_timeout),
        }
    )
    return env


def fastpsrun(
    n: int,
    argv: List[str],
    timeout: float = 240,
    num_servers: int = 1,
    op_timeout: Optional[float] = None,
    env: Optional[Dict[str, str]] = None,
) -> subprocess.CompletedProcess:
    """Runs ``python argv...`` as ``n`` workers under fastpsrun and returns the finished run.

    The job gets its own process group, killed as a whole if it outlives ``timeout``.
    """
    cmd = [
        sys.executable,
        "-m",
        "fastps.launcher",
        "-np",
        str(n),
        "--num-servers",
        str(num_servers),
        sys.executable,
        *argv,
    ]
    extra = env or {}
    env = job_env() if op_timeout is None else job_env(op_timeout)
    env.update(extra)
    p = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=str(ROOT),
        start_new_session=True,
    )
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        err += f"\n(killed after {timeout} s)"
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def tail(p: subprocess.CompletedProcess, chars: int = 6000) -> str:
    return (
        f"rc={p.returncode}\n--- stdout ---\n{p.stdout[-chars:]}\n"
        f"--- stderr ---\n{p.stderr[-chars:]}"
    )
