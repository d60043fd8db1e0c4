"""The round-trip benchmark (benchmarks/bench_latency.py) runs real jobs and checks every
sum: on loopback (two local workers) and across two hosts of the emulated rack (root)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from benchmarks import bench_latency
from benchmarks.rack import is_supported


def _rows(out: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(line for line in out.open() if not line.startswith("#")))


def test_loopback_round_trips_are_timed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "lat.csv"
    argv = ["--systems", "fastps", "--iters", "50", "--warmup", "5", "--repeats", "1"]
    assert bench_latency.main([*argv, "--out", str(out)]) == 0
    assert "on loopback" in capsys.readouterr().out
    rows = _rows(out)
    assert sorted(int(r["size_bytes"]) for r in rows) == [4096, 65536]
    for r in rows:
        assert 0 < float(r["median_us"]) <= float(r["p99_us"]), r


_OK, _WHY = is_supported()


@pytest.mark.root
@pytest.mark.skipif(not _OK, reason=_WHY)
@pytest.mark.timeout(180)
def test_rack_round_trips_cross_two_hosts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "lat.csv"
    argv = ["--rack", "--systems", "fastps", "--iters", "50", "--warmup", "5", "--repeats", "1"]
    assert bench_latency.main([*argv, "--sizes", "4096", "--out", str(out)]) == 0
    assert "on two rack hosts at 1000 Mbit/s" in capsys.readouterr().out
    (row,) = _rows(out)
    assert 0 < float(row["median_us"]) <= float(row["p99_us"]), row
