"""Workers for test_backend_faults.py.

``fault_worker.py suicide VICTIM``: a few all_reduces, then rank VICTIM SIGKILLs itself
while the others wait in their next all_reduce, which they time (they ignore torchrun's
SIGTERM so that the op's own error, not torchrun, ends them). Each survivor prints
``SURVIVOR rank R: <error type> after S s: <message>``.

``fault_worker.py forever DIR``: writes ``DIR/rank<R>.json`` (its pid, the job id, the pids
of the servers it started) and runs
all_reduces until killed (at most 180 s).

``fault_worker.py normal DIR``: writes the same file, a few all_reduces, exits 0.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from common import apply_data_path


def record(directory: str) -> None:
    from fastps.launch import store_rendezvous

    job = store_rendezvous.started()
    assert job is not None and store_rendezvous._started is not None
    servers = [p.pid for p in store_rendezvous._started.servers]
    r = dist.get_rank()
    info = {"pid": os.getpid(), "job_id": job["job_id"], "rank": r, "servers": servers}
    tmp = Path(directory) / f".rank{r}.json"
    tmp.write_text(json.dumps(info))
    tmp.rename(Path(directory) / f"rank{r}.json")


def main() -> int:
    apply_data_path()
    mode = sys.argv[1]
    dist.init_process_group("fastps", timeout=datetime.timedelta(seconds=60))
    r, n = dist.get_rank(), dist.get_world_size()
    for _ in range(3):
        x = torch.ones(1000)
        dist.all_reduce(x)
        assert torch.all(x == n), x
    if mode == "suicide":
        victim = int(sys.argv[2])
        dist.barrier()
        if r == victim:
            time.sleep(1.0)  # the others are waiting in their all_reduce by now
            print(f"rank {r}: SIGKILL to myself", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # let the op's error end this rank
        t0 = time.monotonic()
        try:
            x = torch.ones(1000)
            dist.all_reduce(x)
        except Exception as exc:  # noqa: BLE001 - reported to the test
            took = time.monotonic() - t0
            msg = " ".join(str(exc).split())
            print(f"SURVIVOR rank {r}: {type(exc).__name__} after {took:.1f} s: {msg}", flush=True)
            return 3  # a normal exit: rank 0 keeps the scheduler until the others left
        print(f"rank {r}: all_reduce after the victim died returned {x[:3].tolist()}", flush=True)
        return 4
    record(sys.argv[2])
    if mode == "normal":
        dist.barrier()
        dist.destroy_process_group()
        print(f"rank {r}: normal exit", flush=True)
        return 0
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        x = torch.ones(100)
        dist.all_reduce(x)
        time.sleep(0.2)
    return 5


if __name__ == "__main__":
    sys.exit(main())
