"""Tensor fusion (csrc/worker/fusion.h) as real jobs: exact sums on every data path, the
parts really fused, a tensor missing for an iteration, errors naming the member tensor,
and DistributedOptimizer with and without fusion giving identical parameters."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Dict

import pytest
from jobs import DATA_PATHS, WORKERS, Job

FUSION_WORKER = os.path.join(WORKERS, "fusion_worker.py")
TORCH_WORKER = os.path.join(WORKERS, "fusion_torch_worker.py")


@pytest.mark.parametrize("path", list(DATA_PATHS))
@pytest.mark.parametrize(
    "n,k",
    [
        (2, 2),
        pytest.param(3, 1, marks=pytest.mark.slow),
        pytest.param(4, 2, marks=pytest.mark.slow),
    ],
)
def test_fused_sums_are_exact_on_every_path(path: str, n: int, k: int) -> None:
    shm, worker_hosts, server_hosts = DATA_PATHS[path](n, k)
    env = {"FASTPS_SHM": shm, "FASTPS_PARTITION_BYTES": "64K", "FASTPS_FUSION_THRESHOLD": "16K"}
    with Job(
        n,
        k,
        [FUSION_WORKER, "exact", "3"],
        worker_hosts=worker_hosts,
        server_hosts=server_hosts,
        env=env,
    ) as job:
        job.wait(240, job.workers())
        for w in job.workers():
            assert w.popen.returncode == 0 and " OK exact" in w.output, job.dump()
        job.wait(30)


def test_fused_sums_are_exact_on_hosts_of_uneven_size() -> None:
    """Two workers reduce locally on one host, a third is alone on another: the buckets
    mix local sums and a lone worker's pushes at the servers."""
    env = {"FASTPS_SHM": "1", "FASTPS_PARTITION_BYTES": "64K", "FASTPS_FUSION_THRESHOLD": "16K"}
    with Job(
        3,
        2,
        [FUSION_WORKER, "exact", "2"],
        worker_hosts=["a", "a", "b"],
        server_hosts=["a", "b"],
        env=env,
    ) as job:
        job.wait(240, job.workers())
        for w in job.workers():
            assert w.popen.returncode == 0 and " OK exact" in w.output, job.dump()
        job.wait(30)


def test_errors_name_the_member_tensor() -> None:
    env = {"FASTPS_PARTITION_BYTES": "64K", "FASTPS_FUSION_THRESHOLD": "16K"}
    with Job(2, 1, [FUSION_WORKER, "errors"], env=env) as job:
        job.wait(60, job.workers())
        for w in job.workers():
            assert "SIZE-REFUSED" in w.output, job.dump()
            m = re.search(r"ERROR-SEEN ([\d.]+) (.*)", w.output)
            assert m, job.dump()
            msg = m.group(2)
            assert msg.startswith("FastPSTimeoutError: "), msg
            assert "tensor 'e2'" in msg and "'gone'" in msg, msg


@pytest.mark.parametrize("cross_barrier", ["0", "1"])
def test_optimizer_fused_equals_unfused(subprocess_env: Dict[str, str], cross_barrier: str) -> None:
    pytest.importorskip("torch")
    results = {}
    for threshold in ("0", "64K"):
        env = dict(
            subprocess_env,
            OMP_NUM_THREADS="1",
            PYTHONUNBUFFERED="1",
            FASTPS_FUSION_THRESHOLD=threshold,
            FASTPS_CROSS_BARRIER=cross_barrier,
        )
        res = subprocess.run(
            [sys.executable, "-m", "fastps.launcher", "-np", "2", sys.executable, TORCH_WORKER],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=300,
        )
        assert res.returncode == 0, res.stdout[-4000:]
        digests = re.findall(r"DIGEST (\d) (\S+) buckets (\d+)", res.stdout)
        assert len(digests) == 2, res.stdout[-4000:]
        assert digests[0][1] == digests[1][1], digests  # ranks agree
        results[threshold] = digests[0]
    assert results["0"][2] == "0" and int(results["64K"][2]) > 0, results
    assert results["0"][1] == results["64K"][1], results


def test_optimizers_sharing_gradient_names_take_over_each_others_plans() -> None:
    """A GAN's two optimizers (same parameter names, other shapes) stepped in turn, then
    one rebuilt: with fusion on, neither meets the other's plan (Horovod's
    test_dynamic_requires_grad did, before the takeover)."""
    env = dict(
        {k: v for k, v in os.environ.items() if not k.startswith("FASTPS_")},
        PYTHONUNBUFFERED="1",
        FASTPS_FUSION_THRESHOLD="64K",
    )
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "fastps.launcher",
            "-np",
            "2",
            sys.executable,
            os.path.join(WORKERS, "fusion_shared_names_worker.py"),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout[-4000:]
    assert res.stdout.count("OK shared names") == 2, res.stdout[-4000:]
