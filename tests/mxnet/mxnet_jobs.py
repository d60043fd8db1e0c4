"""Helpers of the MXNet plugin tests: skip without MXNet, run jobs under fastpsrun.

(Not in conftest.py: the suite's top-level conftest has that module name too.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKERS = Path(__file__).resolve().parent / "workers"
EXAMPLES = ROOT / "examples" / "mxnet"


def require_mxnet() -> None:
    """Skips the calling test module unless the real MXNet imports.

    A bare ``import mxnet`` can succeed without MXNet: folders named ``mxnet`` on the path
    (this one, for instance) import as namespace packages.
    """
    try:
        import mxnet
    except Exception as exc:  # noqa: BLE001 - any failure means no usable MXNet
        pytest.skip(
            f"MXNet is not importable here ({exc}); tests/envs/mxnet.sh builds an "
            "environment with it",
            allow_module_level=True,
        )
    if not hasattr(mxnet, "nd"):
        pytest.skip(
            "MXNet is not installed here (only a folder named mxnet is on the path); "
            "tests/envs/mxnet.sh builds an environment with it",
            allow_module_level=True,
        )


def job_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """Environment for a job: this checkout's fastps, no FASTPS_* leaking in, and MXNet
    kept to one engine thread per worker (the machine may have two cores)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FASTPS_", "DMLC_"))}
    env.update(
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS="1",
        MXNET_CPU_WORKER_NTHREADS="1",
        PYTHONWARNINGS="ignore",
    )
    env.update(extra or {})
    return env


def fastpsrun(
    np_: int,
    script: Path,
    *args: str,
    num_servers: int = 1,
    timeout: float = 120,
    env: Optional[Dict[str, str]] = None,
    launcher_args: Optional[List[str]] = None,
) -> subprocess.CompletedProcess:
    """Runs ``fastpsrun -np N [--num-servers K] python script args`` and returns its result
    (stdout and stderr together in ``.stdout``)."""
    cmd = [
        sys.executable,
        "-m",
        "fastps.launcher",
        "-np",
        str(np_),
        "--num-servers",
        str(num_servers),
        *(launcher_args or []),
        sys.executable,
        str(script),
        *args,
    ]
    return subprocess.run(
        cmd,
        env=job_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        cwd=str(ROOT),
    )
