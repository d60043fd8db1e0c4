"""Grouped push_pull and submission batches across real worker and server processes.

A group's parts enter the push queues in one step (one call into the core), all or none:
checked for exact sums over TCP, over shared memory with local reduce, and for the error
cases (a name twice, a name in flight, an exception inside the block).
"""

from __future__ import annotations

import os

import pytest
from jobs import WORKERS, Job

GROUP_WORKER = os.path.join(WORKERS, "group_worker.py")


@pytest.mark.parametrize(
    "layout",
    [
        pytest.param(
            dict(workers=2, servers=2, worker_hosts=["a", "b"], server_hosts=["a", "b"]),
            id="2hosts-tcp",
        ),
        pytest.param(
            dict(
                workers=4,
                servers=3,
                worker_hosts=["a", "a", "b", "b"],
                server_hosts=["a", "b", "c"],
            ),
            id="2x2-local-reduce-cpu-server",
        ),
        pytest.param(
            dict(workers=1, servers=1, worker_hosts=None, server_hosts=None), id="1worker"
        ),
    ],
)
def test_grouped_push_pull(layout: dict) -> None:
    env = {"FASTPS_PARTITION_BYTES": "16K", "FASTPS_OP_TIMEOUT": "60"}
    with Job(
        layout["workers"],
        layout["servers"],
        [GROUP_WORKER],
        env=env,
        worker_hosts=layout["worker_hosts"],
        server_hosts=layout["server_hosts"],
    ) as job:
        job.wait(120, job.workers())
        for w in job.workers():
            assert w.popen.returncode == 0 and "GROUP-OK" in w.output, job.dump()
