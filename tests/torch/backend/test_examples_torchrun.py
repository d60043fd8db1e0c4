"""The examples as a PyTorch user launches them, with torchrun and no fastpsrun: the
Horovod-API example (``hvd.init()`` joins through torchrun's store) and the plain-DDP one on
the fastps backend, with and without the fp16 communication hook. Each trains the digits
model to the accuracy it checks itself (exit status 1 below it)."""

from __future__ import annotations

import re

import pytest
from torchrun import REPO, torchrun

EXAMPLES = REPO / "examples" / "torch"


def _accuracy(out: str) -> float:
    m = re.search(r"test accuracy: ([0-9.]+)", out)
    assert m, out[-3000:]
    return float(m.group(1))


def test_horovod_api_example_under_torchrun() -> None:
    """The issue's failing command: `torchrun --standalone --nproc-per-node 2
    examples/torch/train_digits.py` now trains (it ended with 'FASTPS_SCHEDULER_ADDR is not
    set' before)."""
    proc = torchrun(EXAMPLES / "train_digits.py", "--epochs", "10", "--min-accuracy", "0.9")
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert _accuracy(proc.stdout) >= 0.9


@pytest.mark.parametrize("hook", [False, True], ids=["plain", "fp16-hook"])
def test_ddp_example_on_fastps_backend(hook: bool) -> None:
    args = ["--epochs", "10", "--min-accuracy", "0.9"] + (["--fp16-hook"] if hook else [])
    proc = torchrun(EXAMPLES / "ddp_digits.py", *args)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "backend fastps" in proc.stdout
    assert _accuracy(proc.stdout) >= 0.9
