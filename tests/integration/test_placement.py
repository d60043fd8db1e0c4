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


def _pacing_job(nbytes: int, rounds: int, env: dict) -> tuple:
    """Two emulated hosts on loopback, a worker and a server on each: every worker's elapsed
    time and data-path stats, and the servers' output."""
    with Job(
        2,
        2,
        [os.path.join(WORKERS, "pacing_worker.py"), str(nbytes), str(rounds)],
        env=env,
        worker_hosts=["w0", "w1"],
        server_hosts=["w0", "w1"],
    ) as job:
        job.wait(60, job.workers())
        times, stats = [], []
        for wp in job.workers():
            assert wp.popen.returncode == 0, job.dump()
            times.append(float(re.search(r"ELAPSED (\S+)", wp.output).group(1)))
            stats.append(json.loads(re.search(r"STATS (.*)", wp.output).group(1)))
        job.wait(30)
        servers = [p.output for p in job.procs if p.role == "server"]
    return times, stats, servers


@pytest.mark.parametrize("link,burst", [("40", "0"), ("40", "1M"), ("0", "1M")])
def test_paced_flows_are_capped_and_sums_exact(link: str, burst: str) -> None:
    """At a stated 40 Mbit/s link each flow is capped at its share (2.5 MB/s here), so 4 MiB
    (2 MiB each way per host) takes at least ~0.8 s when every byte is paced
    (FASTPS_PACING_BURST_BYTES=0); with the burst rule (the default, 1 MiB) a worker's pushes
    leave the caps only for the last MiB of each round and take them up again for the next
    round's 4 MiB; with no stated link the same transfer is not held back."""
    nbytes = 4 << 20
    env = {"FASTPS_LINK_MBIT": link, "FASTPS_PACING_BURST_BYTES": burst}
    times, stats, _ = _pacing_job(nbytes, 1, env)
    # Each host pushes half the tensor to the other host's server at 1/2 of its link.
    floor = (nbytes / 2) / (40e6 / 8 / 2)
    switches = [s["pacing_switches"] for s in stats]
    if link == "0":
        assert max(times) < floor, times
        assert switches == [0, 0], stats
    elif burst == "0":
        assert min(times) > 0.7 * floor, times
        assert switches == [0, 0], stats
    else:
        # Two rounds (the warm-up and the timed one): the caps when the first round's 4 MiB
        # are queued, the link rate at each round's tail, the caps again for the next round.
        assert all(n >= 3 for n in switches), stats
        # At least the first MiB of the remote half went at the capped rate.
        assert min(times) > 0.7 * (nbytes / 2 - (1 << 20)) / (40e6 / 8 / 2), times


@pytest.mark.parametrize("burst", ["0", "1M"])
def test_short_rounds_leave_the_caps_on_both_sides(burst: str) -> None:
    """Rounds of 128 KiB (64 KiB to each host's server): below FASTPS_PACING_BURST_BYTES the
    workers' pushes and the servers' answers are not held to their share of the link (never
    paced while no backlog is large); at 0 they keep the caps. Sums are exact either way
    (the worker checks them)."""
    env = {
        "FASTPS_LINK_MBIT": "40",
        "FASTPS_PACING_BURST_BYTES": burst,
        "FASTPS_LOG_LEVEL": "DEBUG",
    }
    times, stats, servers = _pacing_job(128 << 10, 20, env)
    switched = [int(m) for out in servers for m in re.findall(r"pacing switched (\d+) times", out)]
    assert len(switched) == 2, servers
    if burst == "0":
        assert [s["pacing_switches"] for s in stats] == [0, 0], stats
        assert switched == [0, 0], servers
        # 20 rounds of 64 KiB pushed to the other host at 2.5 MB/s, answers after them.
        assert min(times) > 0.7 * 20 * (64 << 10) / (40e6 / 8 / 2), times
    else:
        # No round is large: the connections are never paced (a socket Linux paces once stays
        # paced), so nothing switches and the rounds are not held to the caps.
        assert [s["pacing_switches"] for s in stats] == [0, 0], stats
        assert switched == [0, 0], servers
        assert max(times) < 20 * (64 << 10) / (40e6 / 8 / 2), times
