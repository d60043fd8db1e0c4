"""A worker of tests/rack/test_elastic_servers_cut.py: sums a float64 ledger round after round
while one summation server's host is cut off and healed.

Each round every rank pushes integers that depend on the round and the rank, and checks the
sum element by element (integers in float64 are exact, so a lost, doubled or stale part
shows). It records when each round ended and the server epoch it ended in, and stops when
the test writes ``$RESULT_DIR/stop`` (rank 0 decides, the others follow through a sum), or
after MAX_ROUNDS rounds or MAX_SECONDS seconds. Any error of a push_pull is recorded and
ends the worker: with elastic servers a lost server must cost no error and no redone round.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any, Dict, List

import fastps
import fastps.worker.api as api
import numpy as np

MAX_ROUNDS = 20000
MAX_SECONDS = 120.0
COUNT = 65536 + 17  # 512 KiB of float64 and a bit: parts on every server
PAUSE = 0.02  # between rounds: leaves the shared cores to the others


def main() -> int:
    out_dir = os.environ["RESULT_DIR"]
    fastps.init()
    rank, n = fastps.rank(), fastps.size()
    worker = api._st().worker
    base = np.arange(COUNT, dtype=np.float64)
    ends: List[float] = []
    epochs: List[int] = []
    bad = rounds = 0
    error = ""
    layouts: Dict[int, List[int]] = {}
    start = time.monotonic()
    try:
        while rounds < MAX_ROUNDS and time.monotonic() - start < MAX_SECONDS:
            x = base * (rank + 1) + rounds * 1000 + rank
            fastps.push_pull(x, average=False, name="ledger", out=x)
            want = base * (n * (n + 1) / 2) + n * rounds * 1000 + n * (n - 1) / 2
            bad += int(np.count_nonzero(x != want))
            ends.append(time.time())
            epoch = int(worker.server_epoch())
            epochs.append(epoch)
            if epoch not in layouts:
                # which servers hold the ledger's parts in this epoch
                layouts[epoch] = sorted(
                    {s for _, _, s in worker.part_layout("ledger", COUNT * 8, 8)}
                )
            rounds += 1
            if rounds % 25 == 0:
                print(f"ROUND {rounds} epoch={epoch} t={ends[-1]:.3f}", flush=True)
            stop = os.path.exists(os.path.join(out_dir, "stop"))
            flag = np.array([1.0 if (rank == 0 and stop) else 0.0])
            fastps.push_pull(flag, average=False, name="stop", out=flag)
            if flag[0] > 0:
                break
            time.sleep(PAUSE)
    except Exception:  # noqa: BLE001 - recorded: the test names it
        error = traceback.format_exc()
        print(f"rank {rank}: push_pull failed in round {rounds}:\n{error}", flush=True)
    result: Dict[str, Any] = {
        "bad": bad,
        "rounds": rounds,
        "ends": ends,
        "epochs": epochs,
        "layouts": {str(k): v for k, v in layouts.items()},
        "changes": list(worker.changes),
        "error": error,
    }
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
        json.dump(result, fh)
    if not error:
        fastps.barrier()
    fastps.shutdown()
    return 1 if (bad or error) else 0


if __name__ == "__main__":
    sys.exit(main())
