"""Runs torch test workers as real fastps jobs: ``fastpsrun -np N python <worker>``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
WORKERS = HERE / "workers"


def fastpsrun(
    script: Path,
    *args: str,
    np: int = 2,
    env: Optional[Dict[str, str]] = None,
    timeout: float = 180.0,
    launcher_args: Optional[List[str]] = None,
) -> subprocess.CompletedProcess:
    """Runs ``script`` as ``np`` workers with one server and returns the finished process
    (stdout and stderr together in ``.stdout``)."""
    cmd = [
        sys.executable,
        "-m",
        "fastps.launcher",
        "-np",
        str(np),
        *(launcher_args or []),
        sys.executable,
        str(script),
        *args,
    ]
    run_env = dict(env if env is not None else os.environ)
    run_env.setdefault("PYTHONUNBUFFERED", "1")
    # Several workers share few cores: one torch thread each keeps them from fighting.
    run_env.setdefault("OMP_NUM_THREADS", "1")
    proc = subprocess.Popen(
        cmd,
        env=run_env,
        cwd=str(REPO),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # on a timeout, the whole job goes, not only fastpsrun
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # SIGTERM first: fastpsrun stops its processes and says what was still running;
        # the output then shows where the job stood (subprocess.run's timeout loses it).
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        raise AssertionError(
            f"fastpsrun of {script.name} did not end within {timeout:g} s; its output:\n"
            + (out or "")[-8000:]
        ) from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, None)


def lines_of(output: str, marker: str) -> List[str]:
    return [line for line in output.splitlines() if marker in line]
