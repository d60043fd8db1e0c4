"""The quorum catch-up tests of the Keras and Gluon plugins (docs/guide/async.md, "Catch-up"),
framework-neutral halves: what a worker adds to its loss, and the checks of a job.

Besides a small model, every worker trains a float64 "ledger" vector, one element per round,
with SGD (momentum ``MOMENTUM``, learning rate ``LR``). A worker whose next push is round r
(the rounds it applied so far) adds ``2**rank * ledger[r]`` to its loss, so its ledger
gradient is ``2**rank`` at element r and 0 elsewhere. A round that closed with the workers S
counted applies ``sum(2**i for i in S) / K`` there (the mean over the counted workers: the
server scales by n/K, the worker divides by n), so every element of the final ledger names
the workers its round counted. Every worker prints one ``CATCHUP`` JSON line; the test
checks them with :func:`problems`.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import statistics
from typing import Dict, Iterable, List, Optional

import numpy as np

LR, MOMENTUM = 0.5, 0.5


def ledger_gradient(rank: int, rnd: int, rounds: int) -> np.ndarray:
    """What ``rank`` multiplies the ledger with in the loss when it pushes round ``rnd``."""
    hot = np.zeros(rounds, np.float64)
    if 0 <= rnd < rounds:
        hot[rnd] = 2.0**rank
    return hot


def final_value(applied: float, rnd: int, rounds: int) -> float:
    """The ledger element of round ``rnd`` after every round: ``applied`` there, then
    momentum SGD with a zero gradient for the rounds after."""
    w = m = 0.0
    for t in range(rnd, rounds):
        m = MOMENTUM * m - LR * (applied if t == rnd else 0.0)
        w += m
    return w


def counted(value: float, rnd: int, rounds: int, n: int, k: int) -> Optional[List[int]]:
    """The workers whose gradients round ``rnd`` counted, from its ledger element: the
    one subset of k workers whose mean reproduces it (to 1e-12 relative: the scale of a
    mean is rounded), or None when none does."""
    for subset in itertools.combinations(range(n), k):
        want = final_value(sum(2.0**i for i in subset) / k, rnd, rounds)
        if abs(value - want) <= 1e-12 * abs(want):
            return list(subset)
    return None


def digest(arrays: Iterable[np.ndarray]) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def report(rank: int, rounds: int, took: List[float], ledger: np.ndarray, state: str) -> str:
    """The ``CATCHUP`` line: the rounds this worker applied, its steps' times, its ledger
    and the digest of its parameters and optimizer state."""
    record = {
        "rank": rank,
        "rounds": rounds,
        "took": took,
        "ledger": [float(x) for x in ledger],
        "digest": state,
    }
    return "CATCHUP " + json.dumps(record)


def records(stdout: str) -> Dict[int, dict]:
    out = {}
    for line in stdout.splitlines():
        at = line.find("CATCHUP ")
        if at >= 0:
            rec = json.loads(line[at + len("CATCHUP ") :])
            out[rec["rank"]] = rec
    return out


def problems(
    recs: Dict[int, dict], n: int, k: int, slow: int, rounds: int, history: int
) -> List[str]:
    """What is wrong with a catch-up job (none when it worked): every worker applied every
    round and ends with the same parameters and optimizer state; every round is the mean
    over exactly k workers; the straggler made far fewer steps than rounds (it caught up);
    and past 2·history rounds the fast workers kept their own pace, not the straggler's
    (its measured step, so that a loaded machine's overhead on every step cannot pass for
    pacing)."""
    found: List[str] = []
    if sorted(recs) != list(range(n)):
        return [f"CATCHUP lines from ranks {sorted(recs)}, expected {n}"]
    if {r["rounds"] for r in recs.values()} != {rounds}:
        found.append(f"rounds applied: {[recs[r]['rounds'] for r in range(n)]}, not {rounds}")
    if len({r["digest"] for r in recs.values()}) != 1:
        found.append("the workers' parameters or optimizer state differ")
    ledger = recs[0]["ledger"]
    for rnd in range(rounds):
        who = counted(ledger[rnd], rnd, rounds, n, k)
        if who is None:
            found.append(f"round {rnd}: {ledger[rnd]!r} is no mean over {k} of the {n} workers")
    slow_took = recs[slow]["took"]
    if len(slow_took) >= 0.8 * rounds:
        found.append(f"the straggler made {len(slow_took)} steps for {rounds} rounds")
    slow_step = statistics.median(slow_took)
    for r in range(n):
        if r == slow:
            continue
        took = recs[r]["took"]
        if len(took) <= 2 * history:
            found.append(f"rank {r} made {len(took)} steps")
            continue
        late = statistics.median(took[2 * history :])
        if late >= 0.7 * slow_step:
            found.append(
                f"rank {r} was paced by the straggler: median step {late:.3f} s "
                f"(the straggler's {slow_step:.3f} s)"
            )
        if sum(took) >= 0.85 * rounds * slow_step:
            found.append(f"rank {r}: {sum(took):.2f} s in all, straggler step {slow_step:.3f} s")
    return found
