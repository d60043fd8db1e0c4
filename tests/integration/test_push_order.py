"""Push scheduling across workers that submit in different orders.

Each worker keeps at most FASTPS_WINDOW_BYTES of unanswered parts (more urgent than its next
one) per server, and a server answers a part only when every worker pushed it. Workers that
start with different parts must not wait on each other forever: with a window of one byte,
8 KiB parts, three servers and shuffled submission orders, every job finishes with exact sums.
"""

from __future__ import annotations

import os
import re
from typing import List

import pytest
from jobs import WORKERS, Job

ORDER_WORKER = os.path.join(WORKERS, "order_worker.py")


@pytest.mark.parametrize("mode", ["priority", "equal"])
@pytest.mark.parametrize("window", ["1", "64K"])
def test_shuffled_orders_finish_with_exact_sums(mode: str, window: str) -> None:
    env = {
        "FASTPS_WINDOW_BYTES": window,
        "FASTPS_PARTITION_BYTES": "8K",
        "FASTPS_CREDIT_BYTES": "8K",
        "FASTPS_OP_TIMEOUT": "60",
    }
    with Job(
        3,
        3,
        [ORDER_WORKER, mode],
        worker_hosts=["a", "b", "c"],
        server_hosts=["a", "b", "c"],
        env=env,
    ) as job:
        job.wait(120, job.workers())
        for w in job.workers():
            assert w.popen.returncode == 0 and "ORDER-OK" in w.output, job.dump()


def _nudged_per_worker(job: Job) -> List[int]:
    """Waits for the order workers; each must end with exact sums and say how often it was
    nudged."""
    job.wait(120, job.workers())
    nudged = []
    for w in job.workers():
        m = re.search(r"ORDER-OK rank \d+ nudged (\d+)", w.output)
        assert w.popen.returncode == 0 and m, job.dump()
        nudged.append(int(m.group(1)))
    return nudged


@pytest.mark.parametrize(
    "nudge, min_wait, nudged_some", [("1", "0", True), ("1", "60", False), ("0", "0", False)]
)
def test_servers_nudge_the_last_pusher(nudge: str, min_wait: str, nudged_some: bool) -> None:
    # Three workers in shuffled, skewed orders, one server each: parts wait for one worker
    # while the other two copies are in, so servers nudge it (FASTPS_NUDGE, on by default)
    # and it pushes them early; sums stay exact either way. FASTPS_NUDGE=0 sends none, and
    # with FASTPS_NUDGE_MIN_WAIT=60 no queued part has waited long enough to move.
    env = {
        "FASTPS_PARTITION_BYTES": "8K",
        "FASTPS_CREDIT_BYTES": "8K",
        "FASTPS_OP_TIMEOUT": "60",
        "FASTPS_NUDGE": nudge,
        "FASTPS_NUDGE_MIN_WAIT": min_wait,
    }
    with Job(
        3,
        3,
        [ORDER_WORKER, "priority"],
        worker_hosts=["a", "b", "c"],
        server_hosts=["a", "b", "c"],
        env=env,
    ) as job:
        nudged = _nudged_per_worker(job)
        if nudged_some:
            assert sum(nudged) > 0, (nudged, job.dump())
        else:
            assert sum(nudged) == 0, (nudged, job.dump())


def test_four_workers_nudged_for_every_skipped_part_keep_exact_sums() -> None:
    # Four workers in shuffled orders on four hosts: with FASTPS_NUDGE_OVERDUE=0 a worker is
    # nudged about every part half in without it as soon as it pushes another one there, so
    # nudges cross pushes all the time; every sum must stay exact and every job finish.
    env = {
        "FASTPS_PARTITION_BYTES": "8K",
        "FASTPS_CREDIT_BYTES": "8K",
        "FASTPS_OP_TIMEOUT": "60",
        "FASTPS_NUDGE_OVERDUE": "0",
    }
    hosts = ["a", "b", "c", "d"]
    with Job(
        4, 4, [ORDER_WORKER, "priority"], worker_hosts=hosts, server_hosts=hosts, env=env
    ) as job:
        nudged = _nudged_per_worker(job)
        assert sum(nudged) > 0, (nudged, job.dump())


@pytest.mark.parametrize("mode", ["large-equal", "large-priority"])
def test_large_tensors_in_opposite_orders_finish(mode: str) -> None:
    # Two emulated hosts, TCP pushes with the default window and 256 KiB parts: each
    # ~3 MiB tensor is a dozen parts, and the workers start at opposite ends of the list.
    env = {"FASTPS_OP_TIMEOUT": "90"}
    with Job(
        2, 2, [ORDER_WORKER, mode], worker_hosts=["a", "b"], server_hosts=["a", "b"], env=env
    ) as job:
        job.wait(120, job.workers())
        for w in job.workers():
            assert w.popen.returncode == 0 and "ORDER-OK" in w.output, job.dump()


def test_different_priorities_for_one_tensor_abort_naming_both() -> None:
    with Job(2, 1, [ORDER_WORKER, "priority-mismatch"]) as job:
        job.wait(90, job.workers())
        for w in job.workers():
            m = re.search(r"CAUGHT (\w+): (.*)", w.output)
            assert m and w.popen.returncode == 3, job.dump()
            assert m.group(1) == "FastPSAbort", m.group(0)
            assert "tensor 'conv1.weight' priority mismatch" in m.group(2), m.group(0)
            assert "priority 3" in m.group(2) and "priority 8" in m.group(2), m.group(0)
