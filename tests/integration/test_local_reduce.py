"""Local reduce (BytePS §4.2): the workers of one host sum each part through shared memory
first, one local owner per part pushes it, and the result is shared back locally."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import defaultdict

import pytest
from jobs import WORKERS, Job

SHM_WORKER = os.path.join(WORKERS, "shm_worker.py")


def stats(out: str) -> dict:
    m = re.search(r"STATS (.*)", out)
    assert m, out
    return json.loads(m.group(1))


@pytest.mark.parametrize("hosts,local,cpu", [(1, 2, 0), (1, 4, 0), (2, 2, 1), (2, 3, 0)])
def test_each_part_leaves_its_host_once(hosts: int, local: int, cpu: int) -> None:
    worker_hosts = [f"h{i // local}" for i in range(hosts * local)]
    server_hosts = [f"h{i}" for i in range(hosts)] + [f"c{j}" for j in range(cpu)]
    with Job(
        hosts * local,
        hosts + cpu,
        [SHM_WORKER, "sum"],
        worker_hosts=worker_hosts,
        server_hosts=server_hosts,
        env={"FASTPS_PARTITION_BYTES": "128K"},
    ) as job:
        job.wait(120, job.workers())
        per_host = defaultdict(lambda: defaultdict(int))
        for w in job.workers():
            assert w.popen.returncode == 0 and "SHM-OK" in w.output, job.dump()
            s = stats(w.output)
            assert s["local_reduce"], s
            assert s["contributed_socket"] == 0, s  # every contribution fit in shared memory
            for k, v in s.items():
                per_host[worker_hosts[w.index]][k] += int(v)
        counts = list(per_host.values())
        for c in counts:
            # Every part was reduced by exactly one local owner, which pushed it once; with
            # one host the local sum is the total and goes to nobody.
            pushed = c["pushed_shm"] + c["pushed_socket"]
            assert c["reduced_locally"] > 0, c
            assert pushed == (c["reduced_locally"] if hosts > 1 else 0), c
            assert c["contributed_shm"] == (local - 1) * c["reduced_locally"], c
        assert len({c["reduced_locally"] for c in counts}) == 1  # same parts on every host


def test_uneven_hosts_agree_on_pushes_per_part() -> None:
    # Two workers share h0 and reduce locally; the third is alone on h1 and pushes its parts
    # itself. Every host pushes each part once, so the servers wait for two pushes a part
    # from all three workers alike (a lone worker once counted workers instead of hosts).
    worker_hosts = ["h0", "h0", "h1"]
    with Job(
        3,
        2,
        [SHM_WORKER, "sum"],
        worker_hosts=worker_hosts,
        server_hosts=["h0", "h1"],
        env={"FASTPS_PARTITION_BYTES": "128K"},
    ) as job:
        job.wait(120, job.workers())
        for w in job.workers():
            assert w.popen.returncode == 0 and "SHM-OK" in w.output, job.dump()
            s = stats(w.output)
            assert s["local_reduce"] == (worker_hosts[w.index] == "h0"), s


def test_local_shape_mismatch_is_named_not_hung() -> None:
    with Job(2, 1, [SHM_WORKER, "mismatch"]) as job:
        job.wait(40, job.workers())
        for w in job.workers():
            m = re.search(r"ERROR-SEEN ([\d.]+) (.*)", w.output)
            assert m, job.dump()
            assert float(m.group(1)) < 15, m.group(0)
            assert "fc.weight" in m.group(2), m.group(0)


def test_fastpsrun_four_local_workers_reduce_locally() -> None:
    cmd = [
        sys.executable,
        "-m",
        "fastps.launcher",
        "-np",
        "4",
        "--num-servers",
        "2",
        "--partition-bytes",
        "64K",
        sys.executable,
        SHM_WORKER,
        "sum",
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert p.stdout.count("SHM-OK") == 4
    total = defaultdict(int)
    for line in p.stdout.splitlines():
        if "STATS " in line:
            for k, v in json.loads(line.split("STATS ", 1)[1]).items():
                total[k] += int(v)
    # One host: the owners' local sums are the totals; no part goes to a server.
    assert total["local_reduce"] == 4 and total["pushed_socket"] == 0, total
    assert total["pushed_shm"] == 0 and total["reduced_locally"] > 0, total
