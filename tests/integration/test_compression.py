"""Gradient compression through real servers (docs/guide/compression.md): every codec's sum
against the decompress-sum-recompress reference on several data paths and dtypes, error
feedback converging over a fixed sequence, and compressor mismatches refused naming both
settings (tests/workers/compression_worker.py does the checking). The codecs alone
against numpy references: tests/unit/test_compression_codecs.py."""

from __future__ import annotations

import os

import pytest
from jobs import DATA_PATHS, WORKERS, Job

WORKER = os.path.join(WORKERS, "compression_worker.py")


def run(mode: str, path: str = "tcp", n: int = 2, k: int = 2, timeout: float = 300) -> Job:
    shm, worker_hosts, server_hosts = DATA_PATHS[path](n, k)
    env = {"FASTPS_SHM": shm, "FASTPS_PARTITION_BYTES": "64K"}
    with Job(
        n, k, [WORKER, mode], worker_hosts=worker_hosts, server_hosts=server_hosts, env=env
    ) as job:
        job.wait(timeout, job.workers())
        for w in job.workers():
            assert f"rank {w.index} OK {mode}" in w.output, job.dump()
        return job


@pytest.mark.parametrize("path", ["tcp", "local", "hosts"])
def test_compressed_sum_matches_reference(path: str) -> None:
    run("sum", path)


def test_compressed_sum_three_workers() -> None:
    run("sum", "hosts", n=3, k=1)


def test_compressed_bytes_on_the_wire() -> None:
    run("wire", "hosts")


def test_error_feedback_converges() -> None:
    run("ef", "tcp")


def test_topk_momentum_correction_matches_reference() -> None:
    run("momentum", "tcp")


def test_randomk_sparsity_warmup_keeps_each_stage_fraction() -> None:
    run("warmup", "tcp")


def test_mismatch_on_the_servers_names_both_and_job_goes_on() -> None:
    run("mismatch_server", "tcp")


def test_mismatch_in_declarations_names_both() -> None:
    run("mismatch_declared", "tcp", timeout=120)
