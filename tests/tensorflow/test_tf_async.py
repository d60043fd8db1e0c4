"""Async mode and quorum rounds in the TensorFlow plugin (docs/guide/async.md): the Keras digits
example trained with ``DistributedOptimizer(async=True)`` reaches the synchronous accuracy
(within 1 point) on the same samples, and quorum rounds through ``DistributedGradientTape`` are
exact sums over the workers counted, identical on every worker, with no fast worker
waiting for a late one."""

from __future__ import annotations

import re
import sys
from typing import Dict, Optional

import pytest
from tfjobs import ROOT, WORKERS, fastpsrun, tail

sys.path.insert(0, str(ROOT / "tests" / "workers"))
from quorum_outputs import by_worker  # noqa: E402
from quorum_worker import check_job  # noqa: E402

DIGITS = ROOT / "examples" / "tensorflow" / "keras_digits.py"
# The same for both: the same number of samples. 20, not 10: at 10 epochs Keras has not
# converged and SSP s=1 measured 0.960-0.967 in 5 quiet runs against sync 0.9711 (async
# unbounded 0.971-0.973); at 20, s=1 0.969-0.971 and sync 0.964 (docs/guide/async.md).
EPOCHS = 20


def keras_accuracy(*args: str, env: Optional[Dict[str, str]] = None) -> float:
    argv = [str(DIGITS), "--target", "0.9", "--epochs", str(EPOCHS), *args]
    p = fastpsrun(2, argv, timeout=420, env=env)
    assert p.returncode == 0, tail(p)
    found = re.search(r"test accuracy: ([0-9.]+)", p.stdout)
    assert found, tail(p)
    return float(found.group(1))


_sync: Dict[str, float] = {}


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("staleness", [None, 1], ids=["unbounded", "ssp1"])
def test_keras_async_digits_within_one_point_of_sync(staleness: Optional[int]) -> None:
    if "acc" not in _sync:  # one synchronous run serves every case
        _sync["acc"] = keras_accuracy()
    env = {} if staleness is None else {"FASTPS_STALENESS": str(staleness)}
    asynchronous = keras_accuracy("--async", env=env)
    print(f"digits accuracy: sync {_sync['acc']:.4f}, async (s={staleness}) {asynchronous:.4f}")
    assert asynchronous >= _sync["acc"] - 0.01, (_sync["acc"], asynchronous)


def test_keras_async_mode_from_the_environment_and_checkpoint_reads() -> None:
    p = fastpsrun(
        2, [str(WORKERS / "tf_async_worker.py")], timeout=240, env={"FASTPS_MODE": "async"}
    )
    assert p.returncode == 0, tail(p)
    assert p.stdout.count("ASYNC OK") == 2, tail(p)


def test_tf_quorum_rounds_are_exact_and_nobody_waits() -> None:
    n, k, slow, at, delay, steps, elems = 3, 2, 2, 3, 0.5, 10, 3000
    env = {"FASTPS_ROUND_QUORUM": str(k), "FASTPS_SHM": "0", "FASTPS_PARTITION_BYTES": "8K"}
    argv = [str(WORKERS / "tf_quorum_worker.py"), str(steps), str(slow), str(at)]
    argv += [str(delay), "0.02", str(elems)]
    p = fastpsrun(n, argv, timeout=240, env=env)
    assert p.returncode == 0, tail(p)
    problems = check_job(by_worker(p.stdout), steps, n, k, slow, at, delay, elems)
    assert not problems, (problems, tail(p))
