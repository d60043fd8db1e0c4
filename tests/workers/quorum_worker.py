"""Quorum rounds (docs/guide/async.md) from one worker's side, run by
tests/integration/test_quorum.py with FASTPS_ROUND_QUORUM=k. Each step every worker pushes
2**rank * (step+1) * (1 + i % 7) at element i, so a result names the workers its round
counted: result = S * n/k, S the sum over the counted workers. The worker at rank ``slow``
sleeps ``delay`` s before step ``at``. Prints per step a ``STEP`` JSON line: its wall time,
the result's digest, and the set of counted workers (as a mask) found in every element;
then ``rank R OK quorum``."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

import fastps
import numpy as np

ELEMS = 40000  # float64: 320 KB, several parts over every server


def pushed(rank: int, step: int, elems: int = ELEMS) -> np.ndarray:
    """What `rank` pushes at `step`: 2**rank * (step+1) * (1 + i % 7) at element i."""
    return (2.0**rank) * (step + 1) * (1 + np.arange(elems) % 7).astype(np.float64)


def counted_masks(result: np.ndarray, step: int, n: int, k: int) -> set:
    """The masks of counted workers that reproduce `result` bit for bit, element by element
    (each as (mask, elements it explains))."""
    base = pushed(0, step, result.size)
    found = set()
    # The server scales a round that closed with k of n in by n/k, in float64 (kernels/sum.h).
    for m in range(1, 1 << n):
        c = bin(m).count("1")
        if c < k:
            continue
        s = m * base
        want = s * (n / c) if c < n else s
        hit = result == want
        if hit.any():
            found.add((m, int(hit.sum())))
    return found


def step_line(out: np.ndarray, step: int, took: float, n: int, k: int) -> str:
    """The ``STEP`` line tests/integration/test_quorum.py (and the plugins' quorum tests) read."""
    masks = counted_masks(out, step, n, k)
    record = {
        "step": step,
        "took": took,
        "digest": hashlib.sha256(out.tobytes()).hexdigest(),
        "masks": sorted(m for m, _ in masks),
        "covered": sum(c for _, c in masks),
    }
    return "STEP " + json.dumps(record)


def run_steps(push_pull, rank: int, n: int, argv: list) -> None:
    """Runs the steps with ``push_pull(array, step) -> array`` (a plugin's sum)."""
    steps, slow, at = int(argv[0]), int(argv[1]), int(argv[2])
    delay, pace = float(argv[3]), float(argv[4])
    elems = int(argv[5]) if len(argv) > 5 else ELEMS
    k = int(os.environ["FASTPS_ROUND_QUORUM"])
    for step in range(steps):
        if rank == slow and step == at:
            time.sleep(delay)
        x = pushed(rank, step, elems)
        t0 = time.monotonic()
        out = np.asarray(push_pull(x, step), dtype=np.float64)
        print(step_line(out, step, time.monotonic() - t0, n, k), flush=True)
        time.sleep(pace)


def check_job(
    outputs: dict, steps: int, n: int, k: int, slow: int, at: int, delay: float, elems: int
) -> list:
    """Problems in a quorum job's outputs (rank -> its stdout), none when the rounds were
    exact: every worker got the same bytes, each the exact sum over >= k workers scaled by
    n/k, the slow worker's late round did not count it, and no other worker waited."""
    problems = []
    steps_of = {}
    for r, out in outputs.items():
        steps_of[r] = [json.loads(x[5:]) for x in out.splitlines() if x.startswith("STEP ")]
        if len(steps_of[r]) != steps:
            return [f"rank {r} printed {len(steps_of[r])} of {steps} steps"]
    for s in range(steps):
        if len({steps_of[r][s]["digest"] for r in range(n)}) != 1:
            problems.append(f"step {s}: workers got different results")
        rec = steps_of[0][s]
        if rec["covered"] != elems or not all(bin(m).count("1") >= k for m in rec["masks"]):
            problems.append(f"step {s}: not every element is a sum over >= {k} workers: {rec}")
    if any(m & (1 << slow) for m in steps_of[0][at]["masks"]):
        problems.append(f"step {at}: the late worker was counted: {steps_of[0][at]}")
    for r in range(n):
        if r != slow:
            took = max(rec["took"] for rec in steps_of[r])
            if took >= 0.6 * delay:
                problems.append(f"rank {r} waited {took:.3f} s in a step (delay {delay} s)")
    return problems


def exact_sum_line(rank: int, n: int, slow: int, delay: float) -> str:
    """A sum that is not a gradient's (no ``quorum=True``) waits for every worker, the late
    one included, under FASTPS_ROUND_QUORUM: a metric or a count must never be summed over
    a sample of the workers. Prints ``EXACT ok`` or what came back."""
    if rank == slow:
        time.sleep(delay)
    out = fastps.push_pull(np.full(8, 2.0**rank), average=False, name="metric.count")
    want = float(2**n - 1)
    return "EXACT ok" if np.all(out == want) else f"EXACT wrong: {out.tolist()}, want {want}"


def main() -> None:
    fastps.init()
    rank, n = fastps.rank(), fastps.size()
    run_steps(
        lambda x, _: fastps.push_pull(x, average=False, name="grad", quorum=True),
        rank,
        n,
        sys.argv[1:],
    )
    print(exact_sum_line(rank, n, int(sys.argv[2]), float(sys.argv[4])), flush=True)
    fastps.barrier()
    print(f"rank {rank} OK quorum", flush=True)
    fastps.shutdown()


if __name__ == "__main__":
    main()
