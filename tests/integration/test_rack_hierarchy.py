"""Rack-level hierarchy (PHub §3.4): workers on several racks (FASTPS_RACK) push each part
to a server in their rack, which sums the rack's pushes and relays one copy to the part's
owner; the owner answers once per rack and the relay fans the answer out."""

from __future__ import annotations

import os
import re
import signal
import time
from typing import Dict

import pytest
from jobs import WORKERS, Job

RACK_WORKER = os.path.join(WORKERS, "rack_worker.py")
LATE_ROUTE_SERVER = os.path.join(WORKERS, "late_route_server.py")

# name -> (FASTPS_SHM, worker hosts, worker racks, server hosts, server racks)
LAYOUTS = {
    # Two racks of two workers, one server beside each worker, every push over TCP.
    "tcp": (
        "0",
        ["h0", "h1", "h2", "h3"],
        ["a", "a", "b", "b"],
        ["h0", "h1", "h2", "h3"],
        ["a", "a", "b", "b"],
    ),
    # Local reduce first: h0's two workers push each part once, into their rack's server.
    "local": (
        "1",
        ["h0", "h0", "h1", "h2"],
        ["a", "a", "b", "b"],
        ["h0", "h1", "h2"],
        ["a", "b", "b"],
    ),
    # Three racks, one without a server: its worker pushes straight to the owners, which
    # wait for it besides one relay per other rack; racks with unequal server counts.
    "serverless": (
        "0",
        ["h0", "h1", "h2", "h3"],
        ["a", "a", "b", "c"],
        ["h0", "h1", "h2"],
        ["a", "a", "b"],
    ),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_hierarchical_sums_are_exact(layout: str) -> None:
    shm, whosts, wracks, shosts, sracks = LAYOUTS[layout]
    with Job(
        len(whosts),
        len(shosts),
        [RACK_WORKER, "sum"],
        # A stated link paces every flow by the hierarchy's bytes (placement.rack_pacing_plan);
        # at 10 Gbit/s that holds nothing back on loopback.
        env={
            "FASTPS_SHM": shm,
            "FASTPS_PARTITION_BYTES": "64K",
            "FASTPS_LOG_LEVEL": "info",
            "FASTPS_LINK_MBIT": "10000",
        },
        worker_hosts=whosts,
        server_hosts=shosts,
        worker_racks=wracks,
        server_racks=sracks,
    ) as job:
        job.wait(180)
        for p in job.procs:
            assert p.popen.returncode == 0, job.dump()
        for w in job.workers():
            assert "RACK-OK" in w.output, job.dump()
        # Every rack with a server relayed through it, as the lowest rank of its rack.
        relay_ranks = {"a": 0, "b": 2}
        for s, rack in enumerate(sracks):
            out = job.proc("server", s).output
            assert (
                f"rack '{rack}' relays to {len(shosts)} owners as worker {relay_ranks[rack]}"
                in (out.replace('"', "'"))
            ), job.dump()
        # Every owner answers the other racks' relays, and each rack relays its sums up,
        # all paced by their bytes.
        paced = {}
        for s, rack in enumerate(sracks):
            out = job.proc("server", s).output
            m = re.search(r"at 10000 Mbit/s: sums up (.+), answers to relays (.+) Mbit", out)
            assert m and m.group(2) != "none", job.dump()
            paced[rack] = paced.get(rack, False) or m.group(1) != "none"
        assert all(paced.values()), (paced, job.dump())


def _late_route_job(mode: str, env: Dict[str, str]) -> Job:
    """The "tcp" layout with rack b's servers (2 and 3, relaying as worker 2) setting their
    route late (workers/late_route_server.py)."""
    _, whosts, wracks, shosts, sracks = LAYOUTS["tcp"]
    return Job(
        len(whosts),
        len(shosts),
        [RACK_WORKER, "sum"],
        env={"FASTPS_SHM": "0", "FASTPS_PARTITION_BYTES": "64K", **env},
        worker_hosts=whosts,
        server_hosts=shosts,
        worker_racks=wracks,
        server_racks=sracks,
        custom={("server", s): [LATE_ROUTE_SERVER, mode] for s in (2, 3)},
    )


def test_rack_sums_before_the_route_wait_for_it() -> None:
    # Rack b's first sums are summed before its servers have their route: they go up once
    # the route comes, as the route's relay rank (2), and the owners take them.
    with _late_route_job("after-sum", {}) as job:
        job.wait(180)
        for p in job.procs:
            assert p.popen.returncode == 0, job.dump()
        for s in (2, 3):
            assert "ROUTE-LATE" in job.proc("server", s).output, job.dump()
        for w in job.workers():
            assert "RACK-OK" in w.output, job.dump()


def test_a_route_that_never_comes_fails_by_server_and_part() -> None:
    with _late_route_job("never", {"FASTPS_HANDSHAKE_TIMEOUT": "3"}) as job:
        job.wait(120)
        assert all(w.popen.returncode != 0 for w in job.workers()), job.dump()
        assert re.search(
            r"rack server [23] could not relay part \d+ of tensor id \d+ to its owner, server "
            r"[01]: no route to owner server [01]: this server was given no rack route within "
            r"3 s",
            job.dump(),
        ), job.dump()


def test_a_process_without_a_rack_is_refused_by_name() -> None:
    with Job(
        2,
        2,
        [RACK_WORKER, "sum"],
        env={"FASTPS_SHM": "0"},
        worker_racks=["a", ""],
        server_racks=["a", "b"],
    ) as job:
        job.wait(90)
        assert any(w.popen.returncode != 0 for w in job.workers()), job.dump()
        assert "worker 1 names no rack (FASTPS_RACK) while others do" in job.dump()


def test_killed_rack_server_is_reported_by_name() -> None:
    with Job(
        4,
        2,
        [RACK_WORKER, "until-abort"],
        env={"FASTPS_SHM": "0", "FASTPS_PARTITION_BYTES": "64K"},
        worker_hosts=["h0", "h1", "h2", "h3"],
        server_hosts=["h0", "h2"],
        worker_racks=["a", "a", "b", "b"],
        server_racks=["a", "b"],
        heartbeat_timeout=3.0,
    ) as job:
        deadline = time.monotonic() + 120
        while not all("READY" in w.output for w in job.workers()):
            assert time.monotonic() < deadline, job.dump()
            assert all(p.exited_at is None for p in job.procs), job.dump()
            time.sleep(0.05)
        # Server 1 is rack b's relay for server 0's parts and the owner of its own.
        os.killpg(job.proc("server", 1).popen.pid, signal.SIGKILL)
        job.wait(60, job.workers())
        for w in job.workers():
            assert w.popen.returncode != 0, job.dump()
            assert "ABORTED" in w.output and "server 1" in w.output, job.dump()
        # Server 0 names server 1 in the role it lost: rack b's relay into server 0's parts,
        # or the owner server 0's own rack sums were relayed to (whichever connection
        # noticed first; the scheduler's abort may also reach server 0 before either).
        out = job.proc("server", 0).output
        assert (
            "rack server 1 (relaying as worker 2" in out
            or "lost its uplink to owner server 1" in out
            or "server 1 (pid" in out
            and "died" in out
        ), job.dump()
