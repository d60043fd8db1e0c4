"""Async mode in torch (docs/guide/async.md): ``DistributedOptimizer(async=True)`` and its
aliases, and the digits example trained asynchronously reaching the synchronous accuracy
(within 1 point) on the same number of samples."""

from __future__ import annotations

import re
from typing import Dict, Optional

import pytest
import torch
from torchjobs import REPO, fastpsrun

DIGITS = REPO / "examples" / "torch" / "train_digits.py"


def digits_accuracy(env: Dict[str, str], *args: str, staleness: Optional[int] = None) -> float:
    run_env = dict(env)
    if staleness is not None:
        run_env["FASTPS_STALENESS"] = str(staleness)
    res = fastpsrun(DIGITS, "--min-accuracy", "0.9", *args, np=4, env=run_env, timeout=300)
    assert res.returncode == 0, res.stdout[-4000:]
    found = re.search(r"test accuracy: ([0-9.]+)", res.stdout)
    assert found, res.stdout[-2000:]
    return float(found.group(1))


_sync: Dict[str, float] = {}


@pytest.mark.slow
@pytest.mark.parametrize("staleness", [None, 1, 4])
def test_async_digits_within_one_point_of_sync(
    subprocess_env: Dict[str, str], staleness: Optional[int]
) -> None:
    if "acc" not in _sync:  # one synchronous run serves every case
        _sync["acc"] = digits_accuracy(subprocess_env)
    sync = _sync["acc"]
    asynchronous = digits_accuracy(subprocess_env, "--async", staleness=staleness)
    assert asynchronous >= sync - 0.01, (sync, asynchronous)


def test_async_flag_spellings() -> None:
    from fastps.torch.async_optimizer import async_requested

    assert async_requested({"async": True}, "sync")
    assert async_requested({"asynchronous": True}, "sync")
    assert not async_requested({"async": False}, "async")
    assert async_requested({}, "async") and not async_requested({}, "sync")
    assert async_requested({"asynchronous": None}, "async")
    with pytest.raises(ValueError, match="disagree"):
        async_requested({"async": True, "asynchronous": False}, "sync")
    with pytest.raises(TypeError, match="asynch"):
        async_requested({"asynch": True}, "sync")


def test_async_refuses_unsupported_dtypes() -> None:
    from fastps.errors import FastPSError
    from fastps.torch.async_optimizer import _Param

    with pytest.raises(FastPSError, match="'p'.*int64"):
        _Param("p", torch.zeros(3, dtype=torch.int64))
