"""The routed data-plane modes (forward / want-only pushes) behind allgather, broadcast,
alltoall, reducescatter and Min/Max allreduce, on every data path: exact results with
uneven sizes, bytes per op within 1.1x of the minimum on each worker's sockets, and the
refusals (tests/workers/routed_worker.py does the checking)."""

from __future__ import annotations

import json
import os

import pytest
from jobs import DATA_PATHS, WORKERS, Job

ROUTED_WORKER = os.path.join(WORKERS, "routed_worker.py")


def run_routed(path: str, n: int, k: int, *args: str) -> None:
    shm, worker_hosts, server_hosts = DATA_PATHS[path](n, k)
    env = {"FASTPS_SHM": shm, "FASTPS_PARTITION_BYTES": "64K"}
    with Job(
        n, k, [ROUTED_WORKER, *args], worker_hosts=worker_hosts, server_hosts=server_hosts, env=env
    ) as job:
        job.wait(240, job.workers())
        for w in job.workers():
            assert w.popen.returncode == 0 and f"rank {w.index} OK routed" in w.output, job.dump()
            stats = json.loads(
                next(line for line in w.output.splitlines() if line.startswith("STATS "))[6:]
            )
            # Routed parts never ride the local reduce or a staging slot: they are counted
            # apart from the shared-memory and plain socket pushes.
            assert stats["pushed_routed"] > 0, stats
        job.wait(30)


@pytest.mark.parametrize("path", list(DATA_PATHS))
def test_routed_collectives_on_every_path(path: str) -> None:
    run_routed(path, 2, 1)


@pytest.mark.parametrize(
    "n,k,path",
    [(3, 2, "hosts"), pytest.param(4, 2, "local", marks=pytest.mark.slow)],
)
def test_routed_collectives_uneven_layouts(n: int, k: int, path: str) -> None:
    run_routed(path, n, k)


def test_routed_refusals_leave_the_job_usable() -> None:
    run_routed("tcp", 2, 2, "refusals")
