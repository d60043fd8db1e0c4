"""Adasum in real jobs: ``hvd.allreduce(t, op=hvd.Adasum)`` and the distributed optimizer
with 2 and 4 workers against a numpy reference. The formula and its tree alone:
tests/unit/test_adasum_formula.py."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Dict

import pytest
from jobs import WORKERS


@pytest.mark.parametrize("np_", [2, 4])
def test_torch_allreduce_adasum(subprocess_env: Dict[str, str], np_: int) -> None:
    pytest.importorskip("torch")
    env = dict(subprocess_env, OMP_NUM_THREADS="1")
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "fastps.launcher",
            "-np",
            str(np_),
            sys.executable,
            os.path.join(WORKERS, "adasum_worker.py"),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout[-4000:]
    assert res.stdout.count("ADASUM OK") == np_, res.stdout[-4000:]


@pytest.mark.parametrize("np_,passes", [(2, 1), (4, 1), (2, 2)])
def test_torch_distributed_optimizer_adasum(
    subprocess_env: Dict[str, str], np_: int, passes: int
) -> None:
    """Horovod's delta optimizer: local steps in the hooks, the ranks' updates combined by
    Adasum in step(), against a numpy reference of the pairwise formula (SGD with momentum
    and Adam, a parameter only some ranks use, backward_passes_per_step)."""
    pytest.importorskip("torch")
    env = dict(subprocess_env, OMP_NUM_THREADS="1")
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "fastps.launcher",
            "-np",
            str(np_),
            sys.executable,
            os.path.join(WORKERS, "adasum_optimizer_worker.py"),
            str(passes),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout[-4000:]
    assert res.stdout.count("ADASUM OPTIMIZER OK") == np_, res.stdout[-4000:]
