"""Two jobs with the same job id on one host (the standalone default job id is
job<scheduler port>, so two schedulers on the same port on different machines give the
same id): the second job must fail at start with an error naming the clash, never sum
with the first job's shared memory."""

from __future__ import annotations

import glob
import os
import re
import time

from jobs import WORKERS, Job

STARTUP_WORKER = os.path.join(WORKERS, "startup_worker.py")


def _wait_for(job: Job, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(text in w.output for w in job.workers()):
            return
        time.sleep(0.05)
    raise AssertionError(f"workers did not print {text!r}:\n{job.dump()}")


def test_second_job_with_the_same_id_fails_at_start_naming_the_clash() -> None:
    job_id = f"job{os.getpid() % 60000}"  # what two schedulers on one port would use
    with Job(2, 1, [STARTUP_WORKER, "6"], job_id=job_id) as first:
        _wait_for(first, "SUM-OK", 60)
        with Job(2, 1, [STARTUP_WORKER], job_id=job_id) as second:
            second.wait(60, second.workers())
            for w in second.workers():
                assert w.popen.returncode != 0, second.dump()
                assert "WRONG-SUM" not in w.output and "SUM-OK" not in w.output, second.dump()
            clash = [
                w
                for w in second.workers()
                if re.search(rf"job id '{job_id}' is already in use on this host", w.output)
            ]
            assert clash, second.dump()
        first.wait(60, first.workers())
        for w in first.workers():
            assert w.popen.returncode == 0, first.dump()
    assert not glob.glob(f"/dev/shm/fastps-{job_id}-*")


def test_jobs_with_the_same_id_one_after_the_other_both_succeed() -> None:
    job_id = f"seq{os.getpid() % 60000}"
    for _ in range(2):
        with Job(2, 1, [STARTUP_WORKER], job_id=job_id) as job:
            job.wait(60, job.workers())
            for w in job.workers():
                assert w.popen.returncode == 0 and "SUM-OK" in w.output, job.dump()
    assert not glob.glob(f"/dev/shm/fastps-{job_id}-*")
