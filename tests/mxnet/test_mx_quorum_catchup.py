"""Quorum rounds with a Gluon worker that is slower for good (docs/guide/async.md, "Catch-up"):
``fastps.mxnet.DistributedTrainer`` fetches the rounds that closed without it and applies
them in turn, so its fast peers keep their own pace well past the 2·FASTPS_QUORUM_HISTORY
rounds after which a straggler that applies one round per step would pace them; every
replica ends with the same parameters and optimizer state, and every round is the mean over
exactly the quorum of workers (tests/workers/catchup_ledger.py)."""

from __future__ import annotations

import sys

from mxnet_jobs import ROOT, WORKERS, fastpsrun, require_mxnet

require_mxnet()

sys.path.insert(0, str(ROOT / "tests" / "workers"))
from catchup_ledger import problems, records  # noqa: E402

N, K, SLOW = 3, 2, 2  # quorum n-1
HISTORY = 6
ROUNDS = 30
# The straggler computes 5x longer: about 5 rounds behind when caught up, inside H.
FAST_S, SLOW_S = 0.2, 1.0


def test_gluon_straggler_catches_up_and_paces_nobody() -> None:
    env = {
        "FASTPS_SHM": "0",  # every worker pushes itself: the servers count workers
        "FASTPS_ROUND_QUORUM": str(K),
        "FASTPS_QUORUM_CATCH_UP": "1",  # the loop counts applied rounds
        "FASTPS_QUORUM_HISTORY": str(HISTORY),
        "FASTPS_OP_TIMEOUT": "90",
    }
    args = [str(ROUNDS), str(SLOW), str(FAST_S), str(SLOW_S)]
    res = fastpsrun(N, WORKERS / "quorum_catchup_mx.py", *args, env=env, timeout=300)
    assert res.returncode == 0, res.stdout[-6000:]
    found = problems(records(res.stdout), N, K, SLOW, ROUNDS, HISTORY)
    assert not found, (found, res.stdout[-6000:])
