"""The simulator against the emulated rack's stored measurements (docs/results): the cheap
rows, every prediction within 10% (the full table: python -m benchmarks.sim_calibration)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import sim_calibration as calibration  # noqa: E402


def test_quick_rows_within_ten_percent() -> None:
    rows = calibration.scenarios(quick=True)
    assert {r.scenario for r in rows} == {
        "push_pull n=4 k=0 parts 256 KiB",
        "push_pull n=4 k=4 parts 256 KiB",
    }
    for row in rows:
        row.predicted_s = row.predict()
        assert abs(row.error) <= 0.10, (row.scenario, row.measured_s, row.predicted_s)


def test_stored_measurements_are_read_not_invented(tmp_path) -> None:
    # the measured values come from the CSV: a changed file changes the row
    src = (calibration.RESULTS / "comm.csv").read_text()
    (tmp_path / "comm.csv").write_text(
        src.replace(
            "resnet50,fastps,4,0,1000,956.379,102.228,161,3,1.30092",
            "resnet50,fastps,4,0,1000,956.379,102.228,161,3,2.60184",
        )
    )
    rows = calibration._comm_rows(tmp_path / "comm.csv", in_ci=(0,), partition=256 << 10)
    row = next(r for r in rows if r.scenario == "push_pull n=4 k=0 parts 256 KiB")
    assert row.measured_s == 2.60184
    assert "2.86 2.32 2.38" == row.load
