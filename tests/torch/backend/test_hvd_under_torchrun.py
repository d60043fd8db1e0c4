"""``hvd.init()`` in processes torchrun started (no fastpsrun): fastps.torch joins through
torch's store, and mixes with ``init_process_group("fastps")`` in one job. Worker:
``workers/hvd_worker.py``. fastps.tensorflow's case runs in the TensorFlow tier
(``tests/tensorflow/test_tf_under_torchrun.py``), where TensorFlow is installed."""

from __future__ import annotations

import re

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
