"""The placement plan in real jobs on emulated machines: sums exact with the servers' shares
of BytePS Eq. 1, 2, local reduce on hosts of several workers, paced flows capped at their
share of the stated link. The plan alone: tests/unit/test_placement_plan.py."""

from __future__ import annotations

import json
import os
import re

import pytest
from fastps.control.placement import ServerSpot, server_weights
from jobs import WORKERS, Job


def layout(n: int, k: int):
    workers = [f"w{i}" for i in range(n)]
    servers = [ServerSpot(i, f"w{i}") for i in range(n)]
    servers += [ServerSpot(n + j, f"c{j}") for j in range(k)]
    return workers, servers


CASES = [(n, k, local) for n in (1, 2, 4) for k in (0, 1, 2, 4, 5) for local in (1, 2)]
FAST = {(1, 0, 1), (2, 1, 2), (2, 2, 1), (4, 1, 1), (4, 4, 1), (2, 5, 2)}


@pytest.mark.parametrize(
    "n,k,local",
    [pytest.param(*c, marks=() if c in FAST else pytest.mark.slow) for c in CASES],
)
def test_sums_correct_on_emulated_machines(n: int, k: int, local: int) -> None:
    worker_hosts = [f"w{i // local}" for i in range(n * local)]
    server_hosts = [f"w{i}" for i in range(n)] + [f"c{j}" for j in range(k)]
    with Job(
        n * local,
        n + k,
        [os.path.join(WORKERS, "placement_worker.py")],
        worker_hosts=worker_hosts,
        server_hosts=server_hosts,
    ) as job:
        job.wait(120, job.workers())
        for wp in job.workers():
            assert wp.popen.returncode == 0 and "PLACEMENT-OK" in wp.output, job.dump()
        out = job.proc("worker", 0).output
        weights = json.loads(re.search(r"WEIGHTS (.*)", out).group(1))
        assert weights == pytest.approx(server_weights(*layout(n, k)))
        found = re.search(r"LOCAL (\d+) (\d+) (\d+) (\d+)", out)
        lr, ls, cr, cs = map(int, found.group(1, 2, 3, 4))
        assert (lr, ls, cr, cs) == (0, local, 0, n)
        # Several workers per host reduce locally through shared memory first; a worker's
        # colocated server (when it sums a share) is reached through shared memory.
        w0 = server_weights(*layout(n, k))[0]
        shm_pushes = {h: 0 for h in worker_hosts}
        for wp in job.workers():
            st = json.loads(re.search(r"STATS (.*)", wp.output).group(1))
            assert st["local_reduce"] == (local > 1), st
            if local > 1:
                assert st["reduced_locally"] > 0 and st["contributed_socket"] == 0, st
            shm_pushes[worker_hosts[wp.index]] += st["pushed_shm"]
        if n == 1 and local > 1:
            # One host with a local reduce: the local sum is the total, no server is asked.
            assert all(v == 0 for v in shm_pushes.values()), shm_pushes
        elif w0 > 0:
            assert all(v > 0 for v in shm_pushes.values()), shm_pushes


@pytest.mark.parametrize("link", ["40", "0"])
def test_paced_flows_are_capped_and_sums_exact(link: str) -> None:
    """Two emulated hosts on loopback: at a stated 40 Mbit/s link each flow is capped at its
    share (2.5 MB/s here), so 4 MiB (2 MiB each way per host) takes at least ~0.8 s; with
    no stated link the same transfer is not held back."""
    nbytes = 4 << 20
    with Job(
        2,
        2,
        [os.path.join(WORKERS, "pacing_worker.py"), str(nbytes)],
        env={"FASTPS_LINK_MBIT": link},
        worker_hosts=["w0", "w1"],
        server_hosts=["w0", "w1"],
    ) as job:
        job.wait(60, job.workers())
        times = []
        for wp in job.workers():
            assert wp.popen.returncode == 0, job.dump()
            times.append(float(re.search(r"ELAPSED (\S+)", wp.output).group(1)))
    # Each host pushes half the tensor to the other host's server at 1/2 of its link.
    floor = (nbytes / 2) / (40e6 / 8 / 2)
    if link == "0":
        assert max(times) < floor, times
    else:
        assert min(times) > 0.7 * floor, times
