"""N-worker training equals single-process training on the concatenated batches, through
DistributedTrainer, DistributedOptimizer, the 'fastps' KVStore (Gluon and Module)."""

from __future__ import annotations

import re

import pytest
from mxnet_jobs import EXAMPLES, WORKERS, fastpsrun, require_mxnet

require_mxnet()

ENTRIES = [
    "trainer",
    "trainer_fp16",
    "optimizer",
    "kvstore",
    "kvstore_local",
    "kvstore_str",
    "module",
]


@pytest.mark.parametrize("entry", ENTRIES)
def test_matches_single_process(entry: str) -> None:
    res = fastpsrun(2, WORKERS / "train_worker.py", entry)
    assert res.returncode == 0, res.stdout[-6000:]
    for r in range(2):
        assert f"[worker {r}] TRAIN OK {entry} {r}" in res.stdout, res.stdout[-6000:]


def test_three_workers_two_servers_small_partitions() -> None:
    # Tensors cut into many parts spread over two servers.
    res = fastpsrun(
        3,
        WORKERS / "train_worker.py",
        "trainer",
        num_servers=2,
        launcher_args=["--partition-bytes", "256"],
    )
    assert res.returncode == 0, res.stdout[-6000:]
    assert res.stdout.count("TRAIN OK trainer") == 3, res.stdout[-6000:]


@pytest.mark.parametrize("example", ["gluon_digits.py", "gluon_digits_kvstore.py"])
def test_example_reaches_accuracy(example: str) -> None:
    res = fastpsrun(2, EXAMPLES / example, "--min-accuracy", "0.95")
    assert res.returncode == 0, res.stdout[-6000:]
    m = re.search(r"test accuracy: ([0-9.]+)", res.stdout)
    assert m and float(m.group(1)) >= 0.95, res.stdout[-6000:]


def test_cross_barrier_trainer_equals_synchronous() -> None:
    """DistributedTrainer(cross_barrier=True): step() returns while the engine still waits
    for the sums (rank 1 is late on some steps), and weights and optimizer states equal the
    synchronous trainer's bit for bit in float64: SGD with momentum and weight decay, Adam
    with an lr scheduler, and allreduce_grads + clip_global_norm + update with fp16 on the
    wire."""
    res = fastpsrun(2, WORKERS / "cross_barrier_worker.py", "6", timeout=300)
    assert res.returncode == 0, res.stdout[-6000:]
    for case in ("sgd", "adam-scheduler", "clip-fp16"):
        m = re.search(rf"\[worker 0\] CB EQUAL {case} owed=(\d+) deferred=(\d+)", res.stdout)
        assert m and int(m.group(1)) > 0 and int(m.group(2)) > 0, res.stdout[-6000:]
    assert res.stdout.count("CB OK") == 2, res.stdout[-6000:]
