"""python -m fastps.plan in this process: rates and ranges parsed, a model file read. The
documented questions answered by the command itself: tests/integration/test_sim_plan.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastps import plan
from fastps.errors import FastPSError


def test_rates_and_ranges() -> None:
    assert plan.parse_rate("25G") == 25_000.0
    assert plan.parse_rate("800M") == 800.0
    assert plan.parse_rate("100Gbit") == 100_000.0
    with pytest.raises(FastPSError, match="--link 'fast'"):
        plan.parse_rate("fast")
    assert plan.parse_range("0..4") == [0, 1, 2, 3, 4]
    assert plan.parse_range("0,8,2") == [0, 2, 8]
    with pytest.raises(FastPSError, match="--cpu-machines '-1..3'"):
        plan.parse_range("-1..3")
    assert plan.sample_k(list(range(0, 33))) == [0, 1, 2, 4, 8, 16, 32]


def test_plan_reads_a_model_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    f = tmp_path / "m.json"
    f.write_text(
        json.dumps(
            {
                "name": "tiny",
                "iteration_s": 0.05,
                "layers": [
                    {"name": "a", "flops": 1.0, "tensors": {"w": 40 << 20}},
                    {"name": "b", "flops": 3.0, "tensors": {"w": 4 << 20, "b": 4096}},
                ],
            }
        )
    )
    assert (
        plan.main(["--model", str(f), "--workers", "8", "--link", "10G", "--cpu-machines", "0,4"])
        == 0
    )
    out = capsys.readouterr().out
    assert "model tiny: 46.1 MB" in out and "recommended" in out
    assert plan.main(["--model", "nope", "--workers", "8"]) == 2
    assert "unknown model 'nope'" in capsys.readouterr().err
