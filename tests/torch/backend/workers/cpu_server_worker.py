"""``cpu_server_worker.py SERVERS``: a job whose servers include one started apart with
``python -m fastps.server --join MASTER_ADDR:MASTER_PORT`` (FASTPS_CPU_SERVERS=1): the
scheduler's membership has SERVERS servers and all_reduces (small, and large enough to be
spread over every server) are exact. Prints ``CPU OK rank R`` last."""

from __future__ import annotations

import datetime
import sys

import torch
import torch.distributed as dist
from common import apply_data_path


def main() -> int:
    apply_data_path()
    want_servers = int(sys.argv[1])
    dist.init_process_group("fastps", timeout=datetime.timedelta(seconds=90))
    from fastps.launch import store_rendezvous
    from fastps.worker import api

    r, n = dist.get_rank(), dist.get_world_size()
    job = store_rendezvous.started()
    assert job is not None and job["cpu_servers"] == 1, job
    assert job["num_servers"] == want_servers, job
    assert api.num_servers() == want_servers, f"the scheduler has {api.num_servers()} servers"
    for size in (7, 1 << 20):
        x = torch.arange(size, dtype=torch.float32) % 97 + r
        dist.all_reduce(x)
        want = n * (torch.arange(size, dtype=torch.float32) % 97) + n * (n - 1) / 2
        assert torch.equal(x, want), f"all_reduce of {size}: {x[:5]} != {want[:5]}"
    y = torch.full((3,), float(r))
    dist.all_reduce(y, op=dist.ReduceOp.MAX)
    assert torch.all(y == n - 1), y
    dist.destroy_process_group()
    print(f"CPU OK rank {r}: {api.num_servers()} servers", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
