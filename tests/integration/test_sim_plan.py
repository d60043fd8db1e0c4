"""python -m fastps.plan as a command: answers the documented questions, with clear errors.
Its parsing and a model file read in this process: tests/unit/test_plan.py."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs" / "design" / "simulator.md"


def documented_questions() -> list:
    """The planner commands of docs/design/simulator.md ("Planning a job"), as argument lists."""
    text = DOCS.read_text()
    block = text.split("## Planning a job", 1)[1].split("```", 2)[1]
    return [
        shlex.split(ln)[3:] for ln in block.splitlines() if ln.startswith("python -m fastps.plan")
    ]


def test_plan_answers_a_documented_question(tmp_path: Path) -> None:
    png = tmp_path / "plan.png"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "fastps.plan",
            "--model",
            "bert-base",
            "--workers",
            "64",
            "--link",
            "10G",
            "--cpu-machines",
            "0..16",
            "--plot",
            str(png),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    ).stdout
    assert "recommended: k = " in out and "part size:" in out and "compression:" in out
    assert png.stat().st_size > 10_000
    # communication-bound BERT on 10G gains from CPU machines: the pick is not k = 0
    k = int(out.split("recommended: k = ")[1].split()[0])
    assert k > 0


def test_documented_questions_are_found() -> None:
    qs = documented_questions()
    assert len(qs) >= 4 and all(q[:1] == ["--model"] for q in qs)
    assert any("--racks" in q for q in qs)


@pytest.mark.slow
@pytest.mark.parametrize("question", documented_questions(), ids=lambda q: " ".join(q[1:6:2]))
def test_documented_question_answers(question: list, tmp_path: Path) -> None:
    # Every example of the docs runs to a recommendation. The timeout only catches a hang
    # (the timed answers, under 10 s of CPU each, are in docs/results/simulator.md).
    q = [tmp_path / "plan.png" if a == "plan.png" else a for a in question]
    out = subprocess.run(
        [sys.executable, "-m", "fastps.plan", *map(str, q)],
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
    ).stdout
    assert "recommended: k = " in out and "compression:" in out
