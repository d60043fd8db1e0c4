"""Async mode and quorum rounds in the MXNet plugin (docs/guide/async.md): the Gluon digits
example trained with ``DistributedTrainer(async=True)`` reaches the synchronous accuracy
(within 1 point) on the same samples; the servers' parameters are exactly every worker's
deltas; quorum rounds through the trainer's gradient reduction are exact sums over the
workers counted, identical on every worker, with no fast worker waiting for a late one."""

from __future__ import annotations

import re
import sys
from typing import Dict, Optional

import pytest
from mxnet_jobs import EXAMPLES, ROOT, WORKERS, fastpsrun, require_mxnet

require_mxnet()

sys.path.insert(0, str(ROOT / "tests" / "workers"))
from quorum_outputs import by_worker  # noqa: E402
from quorum_worker import check_job  # noqa: E402

DIGITS = EXAMPLES / "gluon_digits.py"


def gluon_accuracy(*args: str, env: Optional[Dict[str, str]] = None) -> float:
    res = fastpsrun(2, DIGITS, "--min-accuracy", "0.9", *args, env=env, timeout=300)
    assert res.returncode == 0, res.stdout[-6000:]
    found = re.search(r"test accuracy: ([0-9.]+)", res.stdout)
    assert found, res.stdout[-6000:]
    return float(found.group(1))


_sync: Dict[str, float] = {}


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("staleness", [None, 1], ids=["unbounded", "ssp1"])
def test_gluon_async_digits_within_one_point_of_sync(staleness: Optional[int]) -> None:
    if "acc" not in _sync:  # one synchronous run serves every case
        _sync["acc"] = gluon_accuracy()
    env = {} if staleness is None else {"FASTPS_STALENESS": str(staleness)}
    asynchronous = gluon_accuracy("--async", env=env)
    print(f"digits accuracy: sync {_sync['acc']:.4f}, async (s={staleness}) {asynchronous:.4f}")
    assert asynchronous >= _sync["acc"] - 0.01, (_sync["acc"], asynchronous)


def test_trainer_async_from_the_environment_is_exact() -> None:
    res = fastpsrun(2, WORKERS / "async_worker_mx.py", env={"FASTPS_MODE": "async"})
    assert res.returncode == 0, res.stdout[-6000:]
    assert res.stdout.count("ASYNC OK") == 2, res.stdout[-6000:]


def test_mxnet_quorum_rounds_are_exact_and_nobody_waits() -> None:
    # 4 workers: the trainer's average (1/4) and the worker's x4 are exact.
    n, k, slow, at, delay, steps, elems = 4, 3, 3, 3, 0.5, 10, 3000
    env = {"FASTPS_ROUND_QUORUM": str(k), "FASTPS_SHM": "0", "FASTPS_PARTITION_BYTES": "8K"}
    argv = [str(steps), str(slow), str(at), str(delay), "0.02", str(elems)]
    res = fastpsrun(n, WORKERS / "quorum_worker_mx.py", *argv, env=env, timeout=240)
    assert res.returncode == 0, res.stdout[-6000:]
    problems = check_job(by_worker(res.stdout), steps, n, k, slow, at, delay, elems)
    assert not problems, (problems, res.stdout[-6000:])
