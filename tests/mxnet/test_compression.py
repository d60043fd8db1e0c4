"""The core's compressors through the MXNet plugin (docs/guide/compression.md): allreduce against
the codec's reference, error feedback over a fixed sequence of rounds, DistributedTrainer
training with top-k, and mismatched settings named on every rank
(workers/compression_worker.py)."""

from __future__ import annotations

import time

from mxnet_jobs import WORKERS, fastpsrun, require_mxnet

require_mxnet()


def test_compressors_through_allreduce_and_trainer() -> None:
    res = fastpsrun(2, WORKERS / "compression_worker.py", "checks", timeout=240)
    out = res.stdout
    assert res.returncode == 0, out[-6000:]
    for what in ("allreduce", "error feedback", "trainer", "mismatch"):
        for rank in (0, 1):
            assert f"rank {rank} COMPRESSION OK {what}" in out, out[-6000:]


def test_trainer_compression_mismatch_names_both_settings() -> None:
    start = time.monotonic()
    res = fastpsrun(
        2,
        WORKERS / "compression_worker.py",
        "mismatch",
        timeout=120,
        env={"FASTPS_OP_TIMEOUT": "30"},
    )
    out = res.stdout
    assert res.returncode != 0, out[-6000:]
    assert "NO ERROR" not in out, out[-6000:]
    assert "compression mismatch" in out, out[-6000:]
    assert "topk:0.1:ef" in out and "onebit" in out, out[-6000:]
    assert time.monotonic() - start < 90
