"""``train_emulated --repeats``: each cell's median over the passes
(benchmarks/emulated_repeats.py), the estimate of repeated passes, and the plot's medians."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

import pytest

from benchmarks import rack_common as rc

ROOT = Path(__file__).resolve().parents[2]


def _row(system: str, k: Any, frac: Any, repeat: int, status: str = "ok", **extra: Any) -> Dict:
    return {
        "model": "bert",
        "embedding_grad": "sparse",
        "ratio": "0.5",
        "system": system,
        "k": k,
        "repeat": repeat,
        "frac_ideal": frac,
        "iter_s": 3.0 / frac if isinstance(frac, float) else "",
        "status": status,
        **extra,
    }


def test_medians_per_cell_with_spread_and_failures() -> None:
    from benchmarks.emulated_repeats import format_medians, medians

    rows = [
        _row("compute alone", "", "", 1),
        _row("fastps cross-barrier", 4, 0.88, 1),
        _row("fastps cross-barrier", 2, 0.95, 1),
        _row("compute alone", "", "", 2),
        _row("fastps cross-barrier", 4, 0.93, 2),
        _row("fastps cross-barrier", 2, "", 2, status="timed out"),
        _row("compute alone", "", "", 3),
        _row("fastps cross-barrier", 4, 0.91, 3),
        _row("fastps cross-barrier", 2, 0.97, 3),
        _row("fastps cross-barrier", 1, "", 1, status="worker 2 died"),
    ]
    out = {m["k"]: m for m in medians(rows)}
    assert list(out) == ["4", "2", "1"]  # the order the cells first appear; no compute alone
    k4 = out["4"]
    assert (k4["runs"], k4["failed"], k4["reached"]) == (3, 0, 2)
    assert k4["frac_median"] == pytest.approx(0.91)
    assert (k4["frac_min"], k4["frac_max"]) == (0.88, 0.93)
    assert k4["iter_median_s"] == pytest.approx(3.0 / 0.91)
    assert k4["speedup_median"] is None  # no DDP in these passes
    k2 = out["2"]
    assert (k2["runs"], k2["failed"]) == (2, 1)
    assert k2["frac_median"] == pytest.approx(0.96)
    k1 = out["1"]
    assert (k1["runs"], k1["failed"], k1["frac_median"]) == (0, 1, None)
    table = format_medians(rows).splitlines()
    assert "median" in table[0] and ">=0.9" in table[0]
    k4_line = next(line for line in table if line.split()[4] == "4")
    assert "0.910" in k4_line and "0.880-0.930" in k4_line and " 2/3" in k4_line
    assert "no finished run" in next(line for line in table if line.split()[4] == "1")


def test_medians_read_back_from_the_csv(tmp_path: Path) -> None:
    """The CSV's strings are numbers again, and speedups count only where every pass had
    DDP beside the cell."""
    from benchmarks import train_emulated as te
    from benchmarks.emulated_repeats import medians

    rows = [
        _row("fastps cross-barrier", 0, 0.95, r, speedup_vs_ddp=s)
        for r, s in ((1, 1.20), (2, 1.40), (3, 1.30))
    ]
    path = tmp_path / "rep.csv"
    rc.write_csv(path, rows, te.FIELDS, {"commit": "abc"})
    _, back = rc.read_csv(path)
    assert [r["repeat"] for r in back] == ["1", "2", "3"]
    (m,) = medians(back)
    assert m["speedup_median"] == pytest.approx(1.30)
    assert m["frac_median"] == pytest.approx(0.95)


def test_estimate_and_arguments_of_repeats(capsys: Any) -> None:
    from benchmarks import train_emulated as te

    argv = "--models resnet50 --ratios 0.5 1 -k 0 4 --systems fastps-cb ddp --estimate".split()
    once = te.estimate(te.parse_args(argv))
    assert "8 runs in 4 sets of processes" in capsys.readouterr().out
    thrice = te.estimate(te.parse_args([*argv, "--repeats", "3"]))
    assert "24 runs in 12 sets of processes" in capsys.readouterr().out
    assert thrice == pytest.approx(3 * once)
    with pytest.raises(SystemExit):
        te.parse_args([*argv, "--repeats", "0"])
    assert "--repeats must be >= 1" in capsys.readouterr().err


def test_plot_draws_the_median_of_repeated_runs() -> None:
    from benchmarks import plot_emulated as pe

    def row(system: str, k: str, frac: float) -> Dict[str, str]:
        return {"model": "bert", "ratio": "0.5", "system": system, "k": k, "frac_ideal": str(frac)}

    rows = [
        row("fastps cross-barrier", "4", 0.88),
        row("fastps cross-barrier", "4", 0.93),
        row("fastps cross-barrier", "4", 0.91),
        row("fastps cross-barrier", "0", 0.95),
        row("DDP-Gloo", "0", 0.70),
        row("DDP-Gloo", "0", 0.80),
    ]
    frac = pe.series(rows, "bert", "frac_ideal")
    assert frac[("fastps cross-barrier", "0.5")] == [(0.0, 0.95), (4.0, 0.91)]
    assert frac[("DDP-Gloo", "0.5")] == [(0.0, pytest.approx(0.75)), (4.0, pytest.approx(0.75))]
