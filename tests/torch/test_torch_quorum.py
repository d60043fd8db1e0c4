"""Quorum rounds in torch with a worker that is slower for good (docs/guide/async.md,
"Catch-up"): it fetches the rounds that closed without it and applies them in turn, so its
fast peers keep their own pace well past the 2·FASTPS_QUORUM_HISTORY rounds after which a
straggler that applies one round per step would pace them, and every replica ends with the
same parameters and optimizer state, bit for bit."""

from __future__ import annotations

import json
import statistics
from typing import Dict

import pytest
from quorum_examples import run_digits
from torchjobs import WORKERS, fastpsrun

N, K, SLOW = 4, 3, 3
HISTORY = 6
ROUNDS = 36
# The straggler computes 5x longer: about 5 rounds behind when caught up, inside H. Long
# sleeps, so that a loaded machine's overhead on every step does not blur the ratio.
FAST_S, SLOW_S = 0.2, 1.0


def test_persistent_straggler_catches_up_and_paces_nobody(
    subprocess_env: Dict[str, str],
) -> None:
    env = dict(subprocess_env)
    env.update(
        {
            "FASTPS_SHM": "0",  # every worker pushes itself: the servers count workers
            "FASTPS_ROUND_QUORUM": str(K),
            "FASTPS_QUORUM_CATCH_UP": "1",  # the loop counts applied rounds
            "FASTPS_QUORUM_HISTORY": str(HISTORY),
        }
    )
    res = fastpsrun(
        WORKERS / "quorum_catchup.py",
        str(ROUNDS),
        str(SLOW),
        str(FAST_S),
        str(SLOW_S),
        np=N,
        env=env,
        timeout=240,
    )
    assert res.returncode == 0, res.stdout[-4000:]
    recs = {}
    for line in res.stdout.splitlines():
        at = line.find("QUORUM ")
        if at >= 0:
            rec = json.loads(line[at + len("QUORUM ") :])
            recs[rec["rank"]] = rec
    assert sorted(recs) == list(range(N)), res.stdout[-4000:]
    # Every replica applied the same rounds: the same parameters and momentum, exactly.
    assert {r["rounds"] for r in recs.values()} == {ROUNDS}, recs
    assert len({r["digest"] for r in recs.values()}) == 1, recs
    # The straggler made far fewer steps than rounds: it caught up on the others.
    slow_took = recs[SLOW]["took"]
    assert len(slow_took) < 0.8 * ROUNDS, slow_took
    # Past 2·H rounds, a straggler applying one round per step would hold every fast step
    # to its own pace; caught up, the fast steps keep theirs (FAST_S against SLOW_S). The
    # pace is the straggler's measured step, not its sleep: a loaded machine adds the
    # same overhead to every step, and a test on one must not mistake that for pacing.
    slow_step = statistics.median(slow_took)
    for r in range(N):
        if r == SLOW:
            continue
        took = recs[r]["took"]
        assert len(took) > 2 * HISTORY, took
        late = statistics.median(took[2 * HISTORY :])
        assert late < 0.7 * slow_step, f"worker {r} was paced by the straggler: {took} {slow_took}"
        assert sum(took) < 0.85 * ROUNDS * slow_step, f"worker {r}: {sum(took):.2f} s {took}"


# --------------------------------------------------------------- the example, as users run it

# (data path, workers, quorum, servers): the commands that deadlocked at the first step before
# quorum rounds took only gradients' sums first (every worker pushes over TCP), then every
# other data path.
EXAMPLE_CASES = [
    ("tcp", 3, 2, 1),
    ("tcp", 4, 3, 2),
    ("shm", 3, 2, 1),
    ("local", 3, 2, 1),
    ("hosts", 3, 2, 1),
]


@pytest.fixture(scope="module")
def plain_accuracy() -> float:
    """The digits example's accuracy without quorum rounds (exact sums: the same on every
    data path)."""
    accuracy, _ = run_digits("torch/train_digits.py", [], "tcp", 3, None)
    return accuracy


@pytest.mark.slow
@pytest.mark.parametrize("path,n,k,servers", EXAMPLE_CASES)
def test_digits_example_trains_under_quorum_rounds(
    plain_accuracy: float, path: str, n: int, k: int, servers: int
) -> None:
    # A fixed number of steps per epoch and an allreduce of the loss after each: under
    # quorum rounds every rank's i-th step must be round i, or the job hangs at the first
    # epoch's end (a worker that caught up kept pushing rounds nobody else pushed).
    accuracy, out = run_digits("torch/train_digits.py", [], path, n, k, servers=servers)
    # Backup-worker rounds drop the late gradient, so a round averages k of n batches; the
    # test counts are an exact sum (every worker's shard: 450 test images).
    assert "/450)" in out, out[-2000:]
    assert accuracy >= plain_accuracy - 0.02, (accuracy, plain_accuracy, out[-2000:])
