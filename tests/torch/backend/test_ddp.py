"""DDP on the ``fastps`` torch.distributed backend equals DDP on gloo, bit for bit, and
``fastps.torch.ddp_comm_hook`` trains DDP on either backend.

Each run is ``torchrun`` of ``workers/ddp_worker.py``; the workers save their final
parameters, buffers and losses to a folder and the tests compare the folders. The worker
rounds every gradient to a 2^-40 grid below 2^8 (its docstring), so the cross-rank sums are
exact in any order: the comparisons are bit-equal at 2 and at 4 ranks.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Dict, List

import pytest
import torch
from torchrun import DATA_PATHS, WORKERS, torchrun

WORKER = WORKERS / "ddp_worker.py"
PLAIN = ["default", "bucket_view", "no_sync", "static_graph", "unused", "buckets"]
HOOKS = ["hook_none", "hook_fp16", "hook_bf16", "hook_onebit_ef"]
# Unit roundoff of the codecs' number formats (10 and 7 stored mantissa bits).
UNIT_ROUNDOFF = {"hook_fp16": 2.0**-11, "hook_bf16": 2.0**-8}


def _env(path: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPS_")}
    env.update(DATA_PATHS[path])
    return env


def run_ddp(
    out: Path,
    backend: str,
    cases: List[str],
    nproc: int = 2,
    path: str = "shm",
    device: str = "cpu",
) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    env = _env(path)
    env["DDP_TEST_DEVICE"] = device
    res = torchrun(WORKER, backend, str(out), *cases, nproc=nproc, env=env, timeout=280)
    assert res.returncode == 0, res.stdout[-6000:]
    for case in cases:
        assert len(re.findall(rf"DDP CASE {case} rank=\d+ OK", res.stdout)) == nproc
    return out


def load(folder: Path, case: str, nproc: int = 2) -> List[Dict[str, torch.Tensor]]:
    """Every rank's results of ``case``, checked to agree between the ranks."""
    results = [torch.load(folder / f"{case}.{r}.pt") for r in range(nproc)]
    for r in range(1, nproc):
        assert torch.equal(results[r]["params"], results[0]["params"]), f"{case}: rank {r}"
        assert torch.equal(results[r]["init"], results[0]["init"]), f"{case}: rank {r}"
    return results


def assert_bit_equal(
    got: Dict[str, torch.Tensor], want: Dict[str, torch.Tensor], what: str
) -> None:
    for key in ("init", "params", "buffers", "losses"):
        diff = (got[key] - want[key]).abs().max().item()
        assert torch.equal(got[key], want[key]), f"{what}: {key} differ by up to {diff:.3g}"


@pytest.fixture(scope="module")
def gloo2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference: every case on gloo, 2 ranks (the hooks with gloo as the group)."""
    return run_ddp(tmp_path_factory.mktemp("gloo2"), "gloo", PLAIN + HOOKS)


@pytest.fixture(scope="module")
def fastps2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every case on the fastps backend, 2 ranks, shared memory (the default data path)."""
    return run_ddp(tmp_path_factory.mktemp("fastps2"), "fastps", PLAIN + HOOKS)


@pytest.mark.parametrize("case", PLAIN)
def test_ddp_matches_gloo(gloo2: Path, fastps2: Path, case: str) -> None:
    """DDP on fastps (default options; gradient_as_bucket_view; no_sync accumulation;
    static_graph; find_unused_parameters with a branch each rank skips on other steps;
    several buckets) gives the parameters, BatchNorm buffers (broadcast every forward) and
    losses of DDP on gloo bit for bit, from the model rank 0 broadcast, on every rank."""
    got, want = load(fastps2, case), load(gloo2, case)
    assert not torch.equal(want[0]["params"], want[0]["init"])  # it trained
    for r in range(2):
        assert_bit_equal(got[r], want[r], f"{case} rank {r}")


def test_ddp_bucket_order_is_priority(fastps2: Path) -> None:
    """With several buckets, each backward's allreduces go to fastps in DDP's bucket order
    under consecutive op names, and a later bucket gets a lower priority than every
    earlier one still in flight (first issued, first pushed): the backend restarts its
    count at 0 exactly when no allreduce is in flight (whether a bucket's exchange ends
    before the next bucket is ready depends on the machine's load), else counts down."""
    steps = [json.loads((fastps2 / f"priorities.{r}.json").read_text()) for r in range(2)]
    assert [[c["name"] for c in s] for s in steps[0]] == [[c["name"] for c in s] for s in steps[1]]
    assert len(steps[0]) == 10  # steps 2..11 of 12, after DDP rebuilt its buckets
    sizes = [c["bytes"] for c in steps[0][0]]
    assert len(sizes) >= 3, sizes
    overlapped = 0
    for rank_steps in steps:
        for calls in rank_steps:
            assert [c["bytes"] for c in calls] == sizes
            seq = [int(c["name"].rsplit(".", 1)[1]) for c in calls]
            assert seq == list(range(seq[0], seq[0] + len(seq))), seq
            assert calls[0]["busy"] == 0  # DDP waited for the last backward's buckets
            for before, after in zip(calls, calls[1:]):
                # "busy" is read just before the backend's count: an exchange may still end
                # in between, but none can start (one thread issues the allreduces).
                want = (before["priority"] - 1, 0) if after["busy"] else (0,)
                assert after["priority"] in want, calls
            overlapped += sum(1 for c in calls if c["priority"] < 0)
    # Some bucket was handed over while an earlier one was in flight, and so queued behind it.
    assert overlapped > 0, "no bucket's allreduce overlapped an earlier one's"


@pytest.mark.parametrize("path", ["hosts", pytest.param("tcp", marks=pytest.mark.slow)])
def test_ddp_data_paths(gloo2: Path, tmp_path: Path, path: str) -> None:
    """Default DDP on fastps over TCP only, and with every rank a host of its own, gives
    gloo's results bit for bit (shared memory: test_ddp_matches_gloo)."""
    out = run_ddp(tmp_path, "fastps", ["default"], path=path)
    got, want = load(out, "default"), load(gloo2, "default")
    for r in range(2):
        assert_bit_equal(got[r], want[r], f"{path} rank {r}")


@pytest.mark.slow
def test_ddp_four_ranks(tmp_path: Path) -> None:
    """At 4 ranks (where sums depend on their order unless exact: the worker makes them
    exact) every DDP option on fastps gives gloo's results bit for bit."""
    want_dir = run_ddp(tmp_path / "gloo", "gloo", PLAIN, nproc=4)
    got_dir = run_ddp(tmp_path / "fastps", "fastps", PLAIN, nproc=4)
    for case in PLAIN:
        got, want = load(got_dir, case, 4), load(want_dir, case, 4)
        for r in range(4):
            assert_bit_equal(got[r], want[r], f"{case} rank {r}")


def test_comm_hook_none_is_plain_ddp(gloo2: Path, fastps2: Path) -> None:
    """The fastps comm hook without compression, with the process group on gloo (fastps
    joins through torch's store from inside the hook) and on fastps, gives plain gloo DDP's
    results bit for bit."""
    want = load(gloo2, "default")
    for folder in (gloo2, fastps2):
        got = load(folder, "hook_none")
        for r in range(2):
            assert_bit_equal(got[r], want[r], f"hook_none ({folder.name}) rank {r}")


@pytest.mark.parametrize("case", ["hook_fp16", "hook_bf16"])
def test_comm_hook_16_bit_close(gloo2: Path, fastps2: Path, case: str) -> None:
    """The comm hook with fp16 / bf16 compression stays close to plain DDP: the largest
    parameter deviation is at most 16 unit roundoffs of the format, relative to how far the
    parameters moved. Why 16: each step's averaged gradient is rounded at most twice (the
    rank's cast or encode, the sum's rounding or re-encode), so each update is off by <= 2u
    relative; the updates' errors accumulate over the 12 steps and feed back through the
    dynamics, which the remaining factor 8 covers (measured: 0.5u fp16, 4.3u bf16). A wrong
    average (a sum, a rank's own gradient) is off by O(1). Also: the compression did act
    (not bit-equal), and the hook's results are the same bits on either process group."""
    want = load(gloo2, "default")[0]
    moved = (want["params"] - want["init"]).abs().max().item()
    on_gloo = load(gloo2, case)
    on_fastps = load(fastps2, case)
    for r in range(2):
        assert_bit_equal(on_fastps[r], on_gloo[r], f"{case} on fastps vs on gloo, rank {r}")
    rel = (on_gloo[0]["params"] - want["params"]).abs().max().item() / moved
    assert 0 < rel <= 16 * UNIT_ROUNDOFF[case], f"{case}: deviation {rel:.3g} of the movement"
    assert torch.allclose(on_gloo[0]["losses"], want["losses"], rtol=0, atol=0.02)


def test_comm_hook_onebit_error_feedback_trains(gloo2: Path, fastps2: Path) -> None:
    """The comm hook with onebit compression and error feedback (sign x mean |x| per part:
    far from plain DDP's parameters) still trains: the loss of the last step is under 70% of
    the first (plain DDP: under 10%), on either process group, the same bits on both."""
    on_gloo = load(gloo2, "hook_onebit_ef")
    on_fastps = load(fastps2, "hook_onebit_ef")
    for r in range(2):
        assert_bit_equal(on_fastps[r], on_gloo[r], f"onebit on fastps vs on gloo, rank {r}")
    plain = load(gloo2, "default")[0]
    assert not torch.allclose(on_gloo[0]["params"], plain["params"], rtol=0, atol=1e-3)
    losses = (on_gloo[0]["losses"] + on_gloo[1]["losses"]) / 2
    assert losses[-1] < 0.7 * losses[0], losses.tolist()
    plain_losses = (load(gloo2, "default")[1]["losses"] + plain["losses"]) / 2
    assert plain_losses[-1] < 0.1 * plain_losses[0], plain_losses.tolist()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("path", ["shm", "hosts"])
def test_ddp_on_cuda_matches_gloo_on_cuda(tmp_path: Path, path: str) -> None:
    """A model on the GPU: DDP on ``backend="fastps"`` (its buckets staged through host
    memory to the servers) gives gloo-on-CUDA's parameters, buffers and losses bit for bit,
    for every DDP option and the comm hook without compression; with fp16 the hook's
    results are the same bits on either process group."""
    cases = PLAIN + ["hook_none", "hook_fp16"]
    want_dir = run_ddp(tmp_path / "gloo", "gloo", cases, device="cuda")
    got_dir = run_ddp(tmp_path / "fastps", "fastps", cases, path=path, device="cuda")
    for case in cases:
        got, want = load(got_dir, case), load(want_dir, case)
        assert not torch.equal(want[0]["params"], want[0]["init"]), case  # it trained
        for r in range(2):
            assert_bit_equal(got[r], want[r], f"cuda {case} rank {r}")
    plain = load(want_dir, "default")
    for r in range(2):
        assert_bit_equal(load(want_dir, "hook_none")[r], plain[r], f"cuda hook_none rank {r}")
