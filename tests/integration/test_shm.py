"""Shared-memory data path (BytePS §6.2): parts to colocated servers stay in shared memory,
and no segment outlives the job, whatever way it ends."""

from __future__ import annotations

import glob
import json
import os
import re
import time

import pytest
from jobs import WORKERS, Job

SHM_WORKER = os.path.join(WORKERS, "shm_worker.py")


def leftovers(job: Job) -> list:
    return glob.glob(f"/dev/shm/fastps-{job.job_id}-*")


def stats(out: str) -> dict:
    m = re.search(r"STATS (.*)", out)
    assert m, out
    return json.loads(m.group(1))


def wait_gone(job: Job, seconds: float = 10) -> list:
    deadline = time.monotonic() + seconds
    while leftovers(job) and time.monotonic() < deadline:
        time.sleep(0.1)
    return leftovers(job)


@pytest.mark.parametrize("shm", ["1", "0"])
def test_colocated_server_gets_parts_through_shared_memory(shm: str) -> None:
    # Two emulated machines, one worker and one server each: each worker's own server is
    # reached through shared memory, the other one over TCP.
    with Job(
        2,
        2,
        [SHM_WORKER, "sum"],
        worker_hosts=["a", "b"],
        server_hosts=["a", "b"],
        env={"FASTPS_SHM": shm, "FASTPS_PARTITION_BYTES": "256K"},
    ) as job:
        job.wait(90, job.workers())
        for w in job.workers():
            assert w.popen.returncode == 0 and "SHM-OK" in w.output, job.dump()
            s = stats(w.output)
            assert not s["local_reduce"]
            if shm == "1":
                assert s["pushed_shm"] > 0 and s["pushed_socket"] > 0, s
                assert "SHM-FILES-AFTER-INIT 0" in w.output  # unlinked once mapped
            else:
                assert s["pushed_shm"] == 0, s
        job.wait(30)
        assert wait_gone(job) == []


def test_segments_gone_after_error_exit() -> None:
    with Job(2, 1, [SHM_WORKER, "error-exit"]) as job:
        job.wait(60, job.workers())
        assert any(w.popen.returncode != 0 for w in job.workers()), job.dump()
        job.wait(30)
        assert wait_gone(job) == [], job.dump()


def test_segments_gone_after_sigkill_of_a_worker() -> None:
    with Job(3, 1, [SHM_WORKER, "kill"]) as job:
        job.wait(60, job.workers())
        assert job.proc("worker", 1).popen.returncode == -9
        for r in (0, 2):
            out = job.proc("worker", r).output
            m = re.search(r"ERROR-SEEN ([\d.]+) (.*)", out)
            assert m and float(m.group(1)) < 30 and "worker 1" in m.group(2), job.dump()
        job.wait(30)
        assert wait_gone(job) == [], job.dump()


def test_launcher_leaves_no_segments(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import subprocess
    import sys

    job_id = "shmlaunch" + str(os.getpid())
    cmd = [
        sys.executable,
        "-m",
        "fastps.launcher",
        "-np",
        "2",
        "--num-servers",
        "1",
        "--job-id",
        job_id,
        sys.executable,
        SHM_WORKER,
        "sum",
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert p.stdout.count("SHM-OK") == 2
    assert glob.glob(f"/dev/shm/fastps-{job_id}-*") == []
