"""``hvd.init()`` in processes torchrun started (no fastpsrun): fastps.torch and
fastps.tensorflow join through torch's store, and mix with ``init_process_group("fastps")``
in one job. Worker: ``workers/hvd_worker.py``."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from torchrun import WORKERS, torchrun

WORKER = WORKERS / "hvd_worker.py"


def _run(mode: str, nproc: int = 2, timeout: float = 240.0) -> str:
    proc = torchrun(WORKER, mode, nproc=nproc, timeout=timeout)
    out = proc.stdout
    assert proc.returncode == 0, f"{mode}: exit {proc.returncode}\n{out[-6000:]}"
    ok = sorted(int(r) for r in re.findall(r"HVD OK rank (\d+)", out))
    assert ok == list(range(nproc)), out[-4000:]
    return out


def test_fastps_torch_init_under_torchrun() -> None:
    """fastps.torch's hvd.init() under torchrun: rank, size, local_rank/local_size as
    torchrun set them, exact sums, and DistributedOptimizer training equal to
    single-process training on all ranks' data."""
    out = _run("torch")
    assert out.count("DistributedOptimizer steps match the reference") == 2, out[-3000:]


@pytest.mark.parametrize("order", ["both", "pg-first"])
def test_hvd_and_process_group_share_one_job(order: str) -> None:
    """hvd.init() and init_process_group("fastps") in the same process, in either order:
    one job (the second joins nothing new), and both APIs' collectives work interleaved."""
    out = _run(order)
    assert out.count("one job, both work") == 2, out[-3000:]


def _tensorflow_importable() -> str:
    """'' if ``import tensorflow`` works in a fresh interpreter, else why not."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", "import tensorflow"],
            capture_output=True,
            text=True,
            timeout=180,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
        )
    except subprocess.TimeoutExpired:
        return "import tensorflow took over 180 s"
    if proc.returncode != 0:
        return "import tensorflow failed: " + (proc.stderr.strip().splitlines() or ["?"])[-1]
    return ""


def test_fastps_tensorflow_init_under_torchrun() -> None:
    """fastps.tensorflow's hvd.init() under torchrun (the store comes from torch): rank,
    size, local_rank, and a Sum allreduce."""
    why = _tensorflow_importable()
    if why:
        pytest.skip(why)
    out = _run("tf", timeout=300.0)
    assert out.count("tensorflow hvd.init() and allreduce OK") == 2, out[-3000:]
