"""fastps.spark.run on a real Spark (local[2], barrier mode): results in rank order from a
real job, digits training, a failing task's error, nothing left running; TorchDistributor
with init_process_group("fastps")."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, List

import pytest
import spark_jobs

pytestmark = pytest.mark.timeout(240)


def _spark_servers() -> List[int]:
    """Pids of fastps servers of any fastps.spark job on this machine."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"fastps.server" in cmd and any(v.startswith(b"FASTPS_JOB_ID=spark-") for v in env):
            found.append(int(pid))
    return found


def _no_servers_within(seconds: float) -> List[int]:
    deadline = time.monotonic() + seconds
    while True:
        left = _spark_servers()
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def test_run_returns_rank_ordered_results_of_a_real_job(spark: Any) -> None:
    import fastps.spark

    out = fastps.spark.run(
        spark_jobs.rank_and_sum,
        args=(10,),
        kwargs={"offset": 1},
        num_proc=2,
        env={"FASTPS_TEST_MARK": "seen"},
    )
    assert [r["rank"] for r in out] == [0, 1]
    assert [r["size"] for r in out] == [2, 2]
    assert [r["sum"] for r in out] == [3.0, 3.0]  # 1 + 2 through the job's server
    assert [r["value"] for r in out] == [1, 11]
    assert [r["env_var"] for r in out] == ["seen", "seen"]
    assert _spark_servers() == []  # each task waited for what it started
    # A second run in the same (reused) Python workers forms a new job.
    again = fastps.spark.run(spark_jobs.rank_and_sum, args=(1,), num_proc=2)
    assert [r["sum"] for r in again] == [3.0, 3.0]


def test_digits_training_reaches_single_process_accuracy(spark: Any) -> None:
    import fastps.spark
    from spark_digits import train_digits

    single = train_digits(epochs=15)
    submitted = time.time()
    out = fastps.spark.run(train_digits, kwargs={"epochs": 15, "submitted": submitted}, num_proc=2)
    assert [r["rank"] for r in out] == [0, 1]
    assert out[0]["accuracy"] == out[1]["accuracy"]
    assert out[0]["accuracy"] >= single["accuracy"] - 0.02, (out, single)
    assert out[0]["accuracy"] >= 0.93
    print(
        f"\nspark digits: single {single['accuracy']:.4f}, 2 tasks {out[0]['accuracy']:.4f}, "
        f"first step {max(r['startup_s'] for r in out):.1f} s after submission, "
        f"task peak RSS {max(r['max_rss_mib'] for r in out):.0f} MiB"
    )


def test_failing_task_fails_the_run_with_its_error(spark: Any) -> None:
    import fastps.spark
    from fastps.errors import FastPSError

    began = time.monotonic()
    with pytest.raises(FastPSError, match=r"rank 1 of 2: ValueError: rank 1 was told to fail"):
        fastps.spark.run(spark_jobs.fail_on_rank_1, num_proc=2, start_timeout=60)
    assert time.monotonic() - began < 90
    assert _no_servers_within(15) == [], "a server outlived the failed run"
    # Spark is usable afterwards, and so is fastps in it.
    out = fastps.spark.run(spark_jobs.rank_and_sum, args=(1,), num_proc=2)
    assert [r["rank"] for r in out] == [0, 1]

    with pytest.raises(FastPSError, match="num_proc=0"):
        fastps.spark.run(spark_jobs.rank_and_sum, args=(1,), num_proc=0)
    with pytest.raises(FastPSError, match="MPI"):
        fastps.spark.run(spark_jobs.rank_and_sum, args=(1,), num_proc=2, use_mpi=True)


def test_torch_distributor_trains_on_fastps(spark: Any) -> None:
    from pyspark.ml.torch.distributor import TorchDistributor

    out = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(
        spark_jobs.ddp_digits, 10
    )
    assert out["backend"] == "fastps"
    assert out["rank"] == 0 and out["size"] == 2
    assert out["accuracy"] >= 0.93, out
