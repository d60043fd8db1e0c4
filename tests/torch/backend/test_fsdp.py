"""FSDP2 (``fully_shard``) on the ``fastps`` torch.distributed backend trains exactly as on
gloo: parameters sharded over ``init_device_mesh("cpu", (world,))`` move with
all_gather_into_tensor, gradients with reduce_scatter_tensor (SUM for float64, AVG for
float32, PREMUL_SUM after ``set_gradient_divide_factor``).

Each run is one ``torchrun`` of ``workers/fsdp_worker.py``: every case on the fastps
default group and again on a gloo group of the same ranks (the reference), saving the full
parameters (``DTensor.full_tensor()``) and losses; the tests compare the two.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Dict, List

import pytest
import torch
from torchrun import DATA_PATHS, WORKERS, torchrun

WORKER = WORKERS / "fsdp_worker.py"
CASES = ["sgd", "adam", "fp32", "premul"]


def run_fsdp(out: Path, cases: List[str], nproc: int = 2, device: str = "cpu") -> Path:
    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPS_")}
    env.update(DATA_PATHS["shm"])
    env["FSDP_TEST_DEVICE"] = device
    res = torchrun(WORKER, "fastps", str(out), *cases, nproc=nproc, env=env, timeout=280)
    assert res.returncode == 0, res.stdout[-6000:]
    for case in cases:
        for backend in ("fastps", "gloo"):
            done = re.findall(rf"FSDP CASE {case} {backend} rank=\d+ OK", res.stdout)
            assert len(done) == nproc, (case, backend)
    return out


def load(folder: Path, case: str, backend: str, nproc: int = 2) -> List[Dict[str, torch.Tensor]]:
    """Every rank's results of ``case`` on ``backend``: the gathered parameters agree
    between the ranks, and each rank held only a shard."""
    results = [torch.load(folder / f"{case}.{backend}.{r}.pt") for r in range(nproc)]
    total = results[0]["params"].numel()
    assert sum(int(r["local_numel"]) for r in results) >= total  # shards (padded) cover it
    for r in range(nproc):
        assert int(results[r]["local_numel"]) < total, f"{case}: rank {r} holds everything"
        assert torch.equal(results[r]["params"], results[0]["params"]), f"{case}: rank {r}"
    return results


@pytest.fixture(scope="module")
def runs2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_fsdp(tmp_path_factory.mktemp("fsdp2"), CASES)


@pytest.mark.parametrize("case", CASES)
def test_fsdp2_matches_gloo(runs2: Path, case: str) -> None:
    """FSDP2 on fastps gives gloo's full parameters and losses bit for bit at 2 ranks (a
    sum of two numbers is exact in either order): float64 with SGD-momentum, with Adam and
    unresharded parameters and a layer FSDP2 pads; float32 (ReduceOp.AVG); float32 with a
    gradient divide factor (PREMUL_SUM on fastps; gloo refuses it, so its run sums and
    divides: with a power-of-two factor the same bits)."""
    got, want = load(runs2, case, "fastps"), load(runs2, case, "gloo")
    for r in range(2):
        for key in ("params", "losses"):
            diff = (got[r][key] - want[r][key]).abs().max().item()
            assert torch.equal(got[r][key], want[r][key]), f"{case} {key}: up to {diff:.3g}"


def test_fsdp2_divide_factor_acts(runs2: Path) -> None:
    """The PREMUL_SUM run is not the default float32 run: the factor reached the
    gradients (the mean over twice the ranks halves them)."""
    premul, plain = load(runs2, "premul", "fastps")[0], load(runs2, "fp32", "fastps")[0]
    assert torch.equal(premul["losses"][0], plain["losses"][0])
    assert not torch.allclose(premul["params"], plain["params"], rtol=0, atol=1e-6)


@pytest.mark.slow
def test_fsdp2_four_ranks(tmp_path: Path) -> None:
    """At 4 ranks (uneven shards; sums of four gradients round by their order, which differs
    between the backends) FSDP2 on fastps matches gloo within 1e-12 relative."""
    cases = ["sgd", "adam", "premul"]
    out = run_fsdp(tmp_path, cases, nproc=4)
    for case in cases:
        got, want = load(out, case, "fastps", 4)[0], load(out, case, "gloo", 4)[0]
        rtol = 1e-12 if case != "premul" else 1e-5  # premul: float32
        torch.testing.assert_close(got["params"], want["params"], rtol=rtol, atol=rtol)
        torch.testing.assert_close(got["losses"], want["losses"], rtol=rtol, atol=rtol)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_fsdp2_on_cuda(tmp_path: Path) -> None:
    """FSDP2 with its mesh on the GPU and the fastps backend (parameters all-gathered and
    gradients reduce-scattered through host memory) matches FSDP2 on a gloo CPU mesh within
    rounding (the GPU's float64 kernels round differently from the CPU's)."""
    cases = ["sgd", "adam", "premul"]
    out = run_fsdp(tmp_path, cases, device="cuda")
    for case in cases:
        got, want = load(out, case, "fastps")[0], load(out, case, "gloo")[0]
        rtol = 1e-10 if case != "premul" else 1e-5  # premul: float32
        torch.testing.assert_close(got["params"], want["params"], rtol=rtol, atol=rtol)
        torch.testing.assert_close(got["losses"], want["losses"], rtol=rtol, atol=rtol)
