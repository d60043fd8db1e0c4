"""benchmarks/bench_compression_accuracy.py keeps working: its CIFAR-like data is
deterministic and well formed, and a tiny run of two compressors (real fastpsrun jobs)
trains above chance, records every epoch and reports and plots them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Dict

import numpy as np
from torchjobs import REPO

sys.path.insert(0, str(REPO))

from benchmarks import bench_compression_accuracy as bench  # noqa: E402
from benchmarks import compression_tasks as ct  # noqa: E402
from benchmarks import rack_common as rc  # noqa: E402


def test_cifar_like_data_is_deterministic_and_covers_every_class() -> None:
    a, b = ct.cifar_task(n_train=300, n_test=50), ct.cifar_task(n_train=300, n_test=50)
    assert tuple(a.x_train.shape) == (300, 3, 32, 32) and tuple(a.x_test.shape) == (50, 3, 32, 32)
    assert np.array_equal(a.x_train.numpy(), b.x_train.numpy())
    assert np.array_equal(a.y_test.numpy(), b.y_test.numpy())
    assert sorted(set(a.y_train.tolist())) == list(range(10))
    assert np.isfinite(a.x_train.numpy()).all()
    # The test images are not copies of training images.
    assert not np.array_equal(a.x_train[:50].numpy(), a.x_test.numpy())
    logits = a.build_model()(a.x_test[:4])
    assert tuple(logits.shape) == (4, 10)


def test_warmup_half_resolves_to_half_the_rounds() -> None:
    assert bench.resolve_spec("randomk:0.01:ef:warmup=half", 1260) == "randomk:0.01:ef:warmup=630"
    assert bench.resolve_spec("topk:0.01:ef", 1260) == "topk:0.01:ef"


def test_two_compressors_train_and_report(tmp_path: Path, subprocess_env: Dict[str, str]) -> None:
    out, png = tmp_path / "acc.csv", tmp_path / "acc.png"
    cmd = [sys.executable, "-m", "benchmarks.bench_compression_accuracy", "--tasks", "digits"]
    cmd += ["--specs", "none", "onebit:ef", "--epochs", "2", "--out", str(out), "--plot", str(png)]
    res = subprocess.run(
        cmd,
        cwd=str(REPO),
        env=subprocess_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=240,
    )
    assert res.returncode == 0, res.stdout[-4000:]
    _, rows = rc.read_csv(out)
    by_spec: Dict[str, list] = {}
    for row in rows:
        assert row["status"] == "ok", row
        by_spec.setdefault(row["compression"], []).append(row)
    assert sorted(by_spec) == ["none", "onebit:ef"]
    for spec, epochs in by_spec.items():
        assert [int(r["epoch"]) for r in epochs] == [1, 2], spec
        times = [float(r["train_s"]) for r in epochs]
        assert 0 < times[0] < times[1], (spec, times)
        # Ten classes: chance is 0.1; two epochs of the digits MLP get far past it.
        assert float(epochs[-1]["accuracy"]) > 0.5, (spec, epochs[-1])
    # One bit per value (plus headers) against 4 bytes: far fewer bytes on the wire.
    none_mb = float(by_spec["none"][-1]["mb_sent"])
    onebit_mb = float(by_spec["onebit:ef"][-1]["mb_sent"])
    assert 0 < onebit_mb < none_mb / 5, (none_mb, onebit_mb)
    assert "| none | 1 |" in res.stdout and "| onebit:ef | 1 |" in res.stdout, res.stdout
    assert png.stat().st_size > 10_000
