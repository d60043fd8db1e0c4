"""Every op of the ``fastps`` torch.distributed backend, every dtype, every data path.

Each test runs ``workers/ops_worker.py`` under torchrun; the worker checks every result
against a reference it computes itself and exits 1 listing each mismatch (see its
docstring for what a suite covers).
"""

from __future__ import annotations

import re
from typing import List

import pytest
import torch
from torchrun import DATA_PATHS, WORKERS, path_env, torchrun

WORKER = WORKERS / "ops_worker.py"
PATHS = list(DATA_PATHS)


def _run_suite(suite: str, nproc: int, path: str, timeout: float = 300.0) -> str:
    proc = torchrun(WORKER, suite, nproc=nproc, env=path_env(path), timeout=timeout)
    out = proc.stdout
    failures = [line for line in out.splitlines() if "FAIL rank" in line]
    assert proc.returncode == 0 and not failures, (
        f"{suite} suite, {nproc} ranks, {path} path: exit {proc.returncode}, "
        f"{len(failures)} mismatches:\n"
        + "\n".join(failures[:40])
        + "\n--- output tail:\n"
        + out[-6000:]
    )
    ok: List[str] = re.findall(r"OPS OK rank (\d+) checks (\d+)", out)
    assert sorted(int(r) for r, _ in ok) == list(range(nproc)), out[-4000:]
    assert all(int(n) > 0 for _, n in ok)
    return out


@pytest.mark.parametrize("path", PATHS)
def test_all_ops_two_ranks(path: str) -> None:
    """Two ranks: every collective x every dtype (float32/64/16, bfloat16, int8-64,
    uint8-64, bool, complex64/128; float8 for data movement) x every reduce op, contiguous
    and strided, refusals as ValueErrors naming op and dtype, object collectives,
    coalescing, subgroups, async work — all results exact."""
    _run_suite("full", 2, path)


@pytest.mark.parametrize("path", PATHS)
def test_essential_ops_four_ranks(path: str) -> None:
    """Four ranks: the same ops on a few dtypes (float32, bfloat16, int8, uint16, bool,
    complex64, float8) and ops (SUM, AVG, MAX, BXOR); subgroups of 2 and 3 of 4 ranks,
    overlapping and without rank 0."""
    _run_suite("essential", 4, path)


@pytest.mark.slow
@pytest.mark.parametrize("path", PATHS)
def test_all_ops_four_ranks(path: str) -> None:
    """Four ranks, the full matrix of the two-rank test."""
    _run_suite("full", 4, path, timeout=500.0)


@pytest.mark.parametrize(("nproc", "path"), [(2, "shm"), (4, "hosts")])
def test_shape_mismatch_raises_everywhere(nproc: int, path: str) -> None:
    """Ranks passing different shapes to all_reduce (sync and async_op=True) all get an
    error naming the op and both shapes, quickly (no hang, no silently wrong result), and
    the group's next ops work."""
    out = _run_suite("mismatch", nproc, path, timeout=200.0)
    # The ranks' lines share torchrun's stdout and may run together: match, don't split.
    errors = re.findall(r"rank (\d+): mismatch error: (\w+: op '[^']+': mismatched shape)", out)
    assert sorted(int(r) for r, _ in errors) == list(range(nproc)), out[-4000:]
    pattern = r"rank (\d+): async mismatch error: \w+: op '[^']+': mismatched shape"
    assert sorted(int(r) for r in re.findall(pattern, out)) == list(range(nproc)), out[-4000:]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("path", PATHS)
def test_cuda_tensors(path: str) -> None:
    """Collectives on CUDA tensors (made by kernels on a side stream), staged through host
    memory: every result exact and on the caller's device, strided and async (wait and
    future) included, object collectives with CUDA as the group's device."""
    proc = torchrun(WORKERS / "cuda_ops_worker.py", nproc=2, env=path_env(path), timeout=300)
    out = proc.stdout
    assert proc.returncode == 0, out[-6000:]
    ok = re.findall(r"CUDA OPS OK rank (\d+) checks (\d+)", out)
    assert sorted(int(r) for r, _ in ok) == [0, 1], out[-4000:]
    assert ok[0][1] == ok[1][1] and int(ok[0][1]) >= 90, ok  # 99 checks on 2 ranks
