"""Every collective of the shared layer, through the layer itself and through the torch
and TensorFlow plugins, as real jobs of 1, 2 and 4 workers (``worker.py`` does the checking)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict

import pytest

HERE = Path(__file__).resolve().parent
CHECKS = ["mismatch OK", "duplicate OK", "out of order OK", "process sets OK", "join OK", "ALL OK"]


@pytest.mark.parametrize("np_", [1, 2, 4])
@pytest.mark.parametrize("adapter", ["layer", "torch", "tensorflow"])
def test_every_collective(subprocess_env: Dict[str, str], adapter: str, np_: int) -> None:
    if adapter in ("torch", "tensorflow"):
        # A bare import is not proof: tests/tensorflow imports as a namespace package when
        # the real TensorFlow is missing. The TensorFlow environment runs the same harness
        # through tests/tensorflow/test_collectives.py.
        mod = pytest.importorskip(adapter)
        if getattr(mod, "__file__", None) is None:
            pytest.skip(f"{adapter} is not installed for {sys.executable}")
    env = dict(subprocess_env, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "fastps.launcher",
            "-np",
            str(np_),
            sys.executable,
            str(HERE / "worker.py"),
            adapter,
        ],
        env=env,
        cwd=str(HERE.parents[2]),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=400,
    )
    assert res.returncode == 0, res.stdout[-6000:]
    for check in CHECKS:
        got = [line for line in res.stdout.splitlines() if check in line]
        assert len(got) == np_, (check, res.stdout[-4000:])
    assert len([line for line in res.stdout.splitlines() if "dtype " in line]) >= 7 * np_


def test_single_process_layer_alone(subprocess_env: Dict[str, str]) -> None:
    """Without a launcher the layer runs every op locally (one worker)."""
    env = {k: v for k, v in subprocess_env.items() if not k.startswith("FASTPS_")}
    env["OMP_NUM_THREADS"] = "1"
    res = subprocess.run(
        [sys.executable, str(HERE / "worker.py"), "layer"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=200,
        cwd=os.getcwd(),
    )
    assert res.returncode == 0 and "ALL OK" in res.stdout, res.stdout[-4000:]
