"""The PyTorch examples run as documented (slow: real training and benchmark runs)."""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Dict

import pytest
from torchjobs import REPO, fastpsrun, lines_of

EXAMPLES = REPO / "examples" / "torch"
TINY = [
    "--batch-size",
    "4",
    "--num-warmup-batches",
    "1",
    "--num-batches-per-iter",
    "1",
    "--num-iters",
    "2",
]


@pytest.mark.slow
def test_train_digits_reaches_accuracy(subprocess_env: Dict[str, str]) -> None:
    res = fastpsrun(
        EXAMPLES / "train_digits.py", "--min-accuracy", "0.95", env=subprocess_env, timeout=240
    )
    assert res.returncode == 0, res.stdout[-4000:]
    found = re.search(r"test accuracy: ([0-9.]+)", res.stdout)
    assert found and float(found.group(1)) >= 0.95, res.stdout[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("model", ["vgg", "resnet"])
def test_synthetic_benchmark_fastps(subprocess_env: Dict[str, str], model: str) -> None:
    res = fastpsrun(
        EXAMPLES / "synthetic_benchmark.py", "--model", model, *TINY, env=subprocess_env
    )
    assert res.returncode == 0, res.stdout[-4000:]
    result = lines_of(res.stdout, "RESULT system=fastps")
    assert len(result) == 1 and f"model={model}" in result[0] and "workers=2" in result[0]


@pytest.mark.slow
def test_synthetic_benchmark_ddp(subprocess_env: Dict[str, str]) -> None:
    env = dict(subprocess_env, OMP_NUM_THREADS="1")
    res = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "synthetic_benchmark.py"),
            "--ddp",
            "--ddp-np",
            "2",
            "--model",
            "resnet",
            *TINY,
        ],
        env=env,
        cwd=str(REPO),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=180,
    )
    assert res.returncode == 0, res.stdout[-4000:]
    assert len(lines_of(res.stdout, "RESULT system=ddp-gloo model=resnet")) == 1
