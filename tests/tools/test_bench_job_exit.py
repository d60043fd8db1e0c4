"""The job-end benchmark (benchmarks/bench_job_exit.py) runs real jobs under both settings
and reports them; bad settings are named."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from benchmarks import bench_job_exit


def test_one_job_per_setting_is_timed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "exit.csv"
    assert bench_job_exit.main(["--repeats", "1", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "freeze / no freeze: end" in text
    rows = list(csv.DictReader(out.open()))
    assert sorted(r["setting"] for r in rows) == sorted(bench_job_exit.SETTINGS)
    for r in rows:
        tail, wall = float(r["end_after_last_worker_s"]), float(r["job_wall_s"])
        assert 0 < tail < wall, r


def test_bad_settings_are_named(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench_job_exit.main(["--repeats", "0"])
    assert "--repeats must be >= 1, got 0" in capsys.readouterr().err
