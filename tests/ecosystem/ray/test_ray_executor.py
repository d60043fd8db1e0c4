"""fastps.ray.RayExecutor on a real local Ray cluster: Horovod's API, per-rank results in
rank order, a real job (sums through fastps's servers), training, errors, clean shutdown."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Dict, List

import pytest
import ray_jobs

pytestmark = pytest.mark.timeout(240)


def _server_processes(job_id: str) -> List[int]:
    """Pids of this machine's fastps servers of job ``job_id``."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if b"fastps.server" in cmd and f"FASTPS_JOB_ID={job_id}".encode() in env.split(b"\0"):
            found.append(int(pid))
    return found


def _gone_soon(job_id: str, within: float = 15.0) -> List[int]:
    deadline = time.monotonic() + within
    while True:
        left = _server_processes(job_id)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def test_run_execute_run_remote_execute_single(ray_cluster: None) -> None:
    import ray
    from fastps.ray import RayExecutor

    settings = RayExecutor.create_settings(timeout_s=60)
    executor = RayExecutor(settings, num_hosts=1, num_workers_per_host=2)
    executor.start(executable_cls=ray_jobs.Executable, executable_args=[3])
    try:
        # start() built the executables, which joined the job.
        assert executor.execute(lambda e: e.rank_epoch()) == [0, 3]
        assert executor.execute_single(lambda e: e.rank_epoch()) == 0

        out = executor.run(ray_jobs.rank_and_sum, args=[10], kwargs={"offset": 1})
        assert [r["rank"] for r in out] == [0, 1]
        assert [r["size"] for r in out] == [2, 2]
        assert [r["local_rank"] for r in out] == [0, 1]  # one node: both local
        assert [r["sum"] for r in out] == [3.0, 3.0]  # 1 + 2, through the servers
        assert [r["value"] for r in out] == [1, 11]
        job = out[0]["job"]
        assert out[1]["job"] == job and job.startswith("ray-")
        assert len(_server_processes(job)) == 1  # one server for the one node

        refs = executor.run_remote(ray_jobs.rank_and_sum, args=[5])
        assert len(refs) == 2
        assert [r["value"] for r in ray.get(refs, timeout=60)] == [0, 5]
    finally:
        executor.shutdown()
    assert _gone_soon(job) == [], "a server of the job outlived shutdown()"
    executor.shutdown()  # idempotent


def test_digits_training_reaches_single_process_accuracy(ray_cluster: None) -> None:
    from fastps.ray import RayExecutor
    from ray_digits import train_digits

    single = train_digits(epochs=15)  # no job: one process, as without a launcher
    submitted = time.time()
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=2)
    executor.start()
    try:
        out: List[Dict] = executor.run(train_digits, kwargs={"epochs": 15, "submitted": submitted})
    finally:
        executor.shutdown()
    assert [r["rank"] for r in out] == [0, 1]
    assert out[0]["accuracy"] == out[1]["accuracy"]  # evaluated together
    assert out[0]["accuracy"] >= single["accuracy"] - 0.02, (out, single)
    assert out[0]["accuracy"] >= 0.93
    print(
        f"\nray digits: single {single['accuracy']:.4f}, 2 workers {out[0]['accuracy']:.4f}, "
        f"first step {max(r['startup_s'] for r in out):.1f} s after submission, "
        f"worker peak RSS {max(r['max_rss_mib'] for r in out):.0f} MiB"
    )


def test_failing_rank_is_named_and_bad_requests_are_refused(ray_cluster: None) -> None:
    from fastps.errors import FastPSError
    from fastps.ray import RayExecutor

    executor = RayExecutor(RayExecutor.create_settings(timeout_s=30), num_workers=2)
    executor.start()
    try:
        with pytest.raises(FastPSError, match=r"rank 1 failed: ValueError: rank 1 was told"):
            executor.run(ray_jobs.fail_on_rank_1)
    finally:
        executor.shutdown()

    with pytest.raises(FastPSError, match="num_workers=2 .* and min_workers"):
        RayExecutor(RayExecutor.create_settings(), num_workers=2, min_workers=1)
    with pytest.raises(FastPSError, match="num_workers=0"):
        RayExecutor(RayExecutor.create_settings(), num_workers=0)

    # More than the cluster has: start() gives up after placement_group_timeout_s.
    settings = RayExecutor.create_settings(timeout_s=30, placement_group_timeout_s=2)
    big = RayExecutor(settings, num_workers=16)
    began = time.monotonic()
    with pytest.raises(TimeoutError, match="did not grant 16 workers"):
        big.start()
    assert time.monotonic() - began < 20
    big.shutdown()
