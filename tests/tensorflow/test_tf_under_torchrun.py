"""fastps.tensorflow's ``hvd.init()`` in processes torchrun started (no fastpsrun): the job
forms through torch's store. Runs in the TensorFlow tier (torch is there too: the tier's
interpreter is the main one, or a venv that sees its packages); the worker and the torchrun
helper are the torch backend tier's (``tests/torch/backend``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")  # the tier's environment always has it (tests/envs/tensorflow.sh)

BACKEND_TESTS = Path(__file__).resolve().parents[1] / "torch" / "backend"
sys.path.insert(0, str(BACKEND_TESTS))
from torchrun import WORKERS, torchrun  # noqa: E402


def test_fastps_tensorflow_init_under_torchrun() -> None:
    """Rank, size, local_rank as torchrun set them, and a Sum allreduce."""
    proc = torchrun(WORKERS / "hvd_worker.py", "tf", nproc=2, timeout=300.0)
    out = proc.stdout
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out[-6000:]}"
    assert out.count("tensorflow hvd.init() and allreduce OK") == 2, out[-3000:]
