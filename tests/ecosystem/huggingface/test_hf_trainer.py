"""Hugging Face on fastps, against the real ``transformers`` and ``accelerate``: the default
process group created with ``init_process_group("fastps")`` before ``Trainer``/``Accelerator``
look for one, which they then use (neither library patched). torchrun, 2 processes, a tiny
BERT built from a BertConfig, 20 steps of transformers' Trainer and 20 of a plain Accelerate
loop (``workers/hf_tiny_bert_worker.py``): the loss falls, both ranks end with identical
parameters, and those equal the same job's on gloo within fp32 tolerance."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict

import pytest
import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
WORKER = HERE / "workers" / "hf_tiny_bert_worker.py"
sys.path.insert(0, str(REPO / "tests" / "torch" / "backend"))
from torchrun import torchrun  # noqa: E402  (the torch tier's torchrun launcher)

MODES = ("trainer", "accelerate")


def _job(backend: str, out: Path) -> Dict[str, list]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPS_")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONWARNINGS="ignore")
    try:
        proc = torchrun(WORKER, "--backend", backend, "--out", str(out), env=env, timeout=150)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the {backend} job ran past 150 s:\n{str(exc.output)[-4000:]}")
    assert proc.returncode == 0, proc.stdout[-6000:]
    return {
        mode: [torch.load(out / f"{mode}_rank{r}.pt", weights_only=False) for r in (0, 1)]
        for mode in MODES
    }


@pytest.fixture(scope="module")
def gloo(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, list]:
    return _job("gloo", tmp_path_factory.mktemp("gloo"))


def test_trainer_and_accelerate_on_fastps(gloo: Dict[str, list], tmp_path: Path) -> None:
    fastps = _job("fastps", tmp_path)
    for mode in MODES:
        r0, r1 = fastps[mode]
        g0, _ = gloo[mode]
        assert r0["backend"] == r1["backend"] == "fastps", (mode, r0["backend"])
        assert g0["backend"] == "gloo", (mode, g0["backend"])
        assert r0["world_size"] == 2
        losses = r0["losses"]
        assert len(losses) == 20, (mode, losses)
        first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
        assert last < 0.5 * first, f"{mode}: the loss did not fall: {losses}"
        assert torch.equal(r0["params"], r1["params"]), f"{mode}: the ranks' parameters differ"
        diff = float((r0["params"] - g0["params"]).abs().max())
        assert torch.allclose(r0["params"], g0["params"], rtol=1e-5, atol=1e-5), (
            f"{mode}: fastps and gloo differ by up to {diff:g}"
        )
