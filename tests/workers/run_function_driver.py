"""Calls ``fastps.run()`` the way a notebook or a driver program does (the functions live in
``__main__``, so they travel by value) and prints one JSON line with what came back.

Usage: run_function_driver.py SCENARIO   (happy | raises | dies | refused)
"""

from __future__ import annotations

import json
import os
import sys
import time

import fastps


def gather_ranks(a: int, b: int, c: int = 0) -> object:
    import numpy as np

    fastps.init()
    rank, size = fastps.rank(), fastps.size()
    total = fastps.push_pull(np.array([float(rank), float(a + b + c)]), average=False, name="x")
    fastps.shutdown()
    # Rank 0 returns the job's sums, the others something of their own.
    return [size, total.tolist()] if rank == 0 else {"rank": rank, "pid": os.getpid()}


def raises_on_rank_1() -> None:
    fastps.init()
    if fastps.rank() == 1:
        raise KeyError("no such key on rank 1")
    time.sleep(120)  # the launcher must stop this rank long before


def dies_on_rank_1() -> None:
    fastps.init()
    if fastps.rank() == 1:
        os._exit(7)  # no result, no exception: the process is just gone
    time.sleep(120)


def main() -> None:
    scenario = sys.argv[1]
    started = time.monotonic()
    out: dict = {}
    try:
        if scenario == "happy":
            out["results"] = fastps.run(gather_ranks, (1, 20), {"c": 300}, np=3)
        elif scenario == "raises":
            fastps.run(raises_on_rank_1, np=2)
        elif scenario == "dies":
            fastps.run(dies_on_rank_1, np=2)
        elif scenario == "refused":
            fastps.run(gather_ranks, (1, 2), np=2, use_mpi=True)
    except Exception as exc:  # reported to the test
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["cause"] = repr(exc.__cause__)
    out["seconds"] = time.monotonic() - started
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
