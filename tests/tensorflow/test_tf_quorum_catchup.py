"""Quorum rounds with a Keras worker that is slower for good (docs/guide/async.md, "Catch-up"):
``fastps.tensorflow.keras.DistributedOptimizer`` fetches the rounds that closed without
it and applies them in turn, so its fast peers keep their own pace well past the
2·FASTPS_QUORUM_HISTORY rounds after which a straggler that applies one round per step
would pace them; every replica ends with the same parameters and optimizer state, and every
round is the mean over exactly the quorum of workers (tests/workers/catchup_ledger.py)."""

from __future__ import annotations

import sys

import pytest
from tfjobs import ROOT, WORKERS, fastpsrun, tail

sys.path.insert(0, str(ROOT / "tests" / "workers"))
from catchup_ledger import problems, records  # noqa: E402

N, K, SLOW = 3, 2, 2  # quorum n-1
HISTORY = 6
ROUNDS = 30
# The straggler computes 5x longer: about 5 rounds behind when caught up, inside H.
FAST_S, SLOW_S = 0.2, 1.0


@pytest.mark.parametrize(
    "mode", ["graph", pytest.param("eager", marks=pytest.mark.slow)], ids=["graph", "eager"]
)
def test_keras_straggler_catches_up_and_paces_nobody(mode: str) -> None:
    env = {
        "FASTPS_SHM": "0",  # every worker pushes itself: the servers count workers
        "FASTPS_ROUND_QUORUM": str(K),
        "FASTPS_QUORUM_CATCH_UP": "1",  # the loop counts applied rounds
        "FASTPS_QUORUM_HISTORY": str(HISTORY),
    }
    argv = [str(WORKERS / "tf_quorum_catchup.py"), str(ROUNDS), str(SLOW)]
    argv += [str(FAST_S), str(SLOW_S), mode]
    p = fastpsrun(N, argv, timeout=300, env=env)
    assert p.returncode == 0, tail(p)
    found = problems(records(p.stdout), N, K, SLOW, ROUNDS, HISTORY)
    assert not found, (found, tail(p))
