"""The shared multi-tenant server host (core/control/shared_server.py): several jobs on one
long-running host, each authenticated and isolated, joining and leaving while it runs,
with a per-job memory quota."""

from __future__ import annotations

import hashlib
import hmac
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, Tuple

import pytest
from fastps.control.shared_server import JobSpec, admit, read_state
from jobs import WORKERS, Job

TENANT = os.path.join(WORKERS, "tenant_worker.py")
STARTUP = os.path.join(WORKERS, "startup_worker.py")


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Tuple[subprocess.Popen, str]]:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPS_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "fastps.shared_server", "--jobs", str(jobs), "--quota-mb", "512"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        yield proc, str(jobs)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def shared_job(
    jobs_dir: str,
    argv: list,
    quota_mb: float = 0.0,
    workers: int = 2,
    tcp: bool = False,
    registration_timeout: float = 30.0,
) -> Job:
    """A job whose one server is the shared host's (the Job's own server slot runs nothing).
    ``tcp``: shared memory off, so every part lands in the server's own memory."""
    env = {"FASTPS_SHM": "0"} if tcp else None
    job = Job(
        workers,
        1,
        argv,
        env=env,
        custom={("server", 0): ["-c", "pass"]},
        registration_timeout=registration_timeout,
    )
    admit(
        jobs_dir,
        JobSpec(job.job_id, job.token, job.scheduler.address_text, workers, 1, 0, quota_mb),
    )
    return job


def wait_state(jobs_dir: str, job_id: str, states: Tuple[str, ...], timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = read_state(jobs_dir, job_id)
        if st is not None and st["state"] in states:
            return st
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} never reached {states}: {read_state(jobs_dir, job_id)}")


def server_addr(job: Job, timeout: float = 60) -> Tuple[str, int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        servers = getattr(job.scheduler, "_servers", {})
        if 0 in servers and servers[0].info.get("data_addr"):
            h, p = servers[0].info["data_addr"].rsplit(":", 1)
            return h, int(p)
        time.sleep(0.05)
    raise AssertionError(f"job {job.job_id}'s server never registered")


def hello(addr: Tuple[str, int], job_id: str, token: str, rank: int = 0, conn: int = 0) -> bytes:
    """Runs the worker side of the data handshake with the given credentials; returns what
    the server answered (b"\\x01": accepted, b"": turned away)."""
    with socket.create_connection(addr, timeout=10) as s:
        challenge = b""
        while len(challenge) < 36:
            chunk = s.recv(36 - len(challenge))
            if not chunk:
                return b""
            challenge += chunk
        nonce = challenge[4:]
        mac = hmac.new(
            token.encode(), nonce + job_id.encode() + struct.pack("<I", rank), hashlib.sha256
        ).digest()
        s.sendall(struct.pack("<III", 0x48535046, rank, conn) + mac)
        try:
            return s.recv(1)
        except (ConnectionResetError, socket.timeout):
            return b""


def test_jobs_share_one_host_isolated_and_join_while_it_runs(
    host: Tuple[subprocess.Popen, str],
) -> None:
    proc, jobs_dir = host
    a = shared_job(jobs_dir, [TENANT, "1", "100000", "6"])
    b = shared_job(jobs_dir, [TENANT, "2", "100000", "6"])
    with a, b:
        addr_a, addr_b = server_addr(a), server_addr(b)
        assert addr_a != addr_b
        # Intruders at job A's server while both jobs run: job B's credentials, A's job id
        # with B's token (wrong token), A's token with B's job id (wrong job id).
        assert hello(addr_a, b.job_id, b.token) == b""
        assert hello(addr_a, a.job_id, b.token) == b""
        assert hello(addr_a, b.job_id, a.token) == b""
        a.wait(90)
        b.wait(90)
        for job in (a, b):
            for w in job.workers():
                assert w.popen.returncode == 0, job.dump()
                assert "TENANT-ROUNDS" in w.output, job.dump()
    for job in (a, b):
        assert wait_state(jobs_dir, job.job_id, ("done", "failed"), 30)["state"] == "done"
    # A job that joins afterwards, on the same host process; a control connection with
    # the job's own credentials is accepted (what the intruders lacked).
    c = shared_job(jobs_dir, [STARTUP, "4"])
    with c:
        assert hello(server_addr(c), c.job_id, c.token, rank=1, conn=7) == b"\x01"
        c.wait(90)
    assert proc.poll() is None, "the shared host must outlive its jobs"
    assert wait_state(jobs_dir, c.job_id, ("done", "failed"), 30)


def test_memory_quota_fails_only_the_job_over_it(host: Tuple[subprocess.Popen, str]) -> None:
    """A job's server memory is capped by its quota (RLIMIT_DATA of its server process).
    Pushed tensors cost a server only its credit window of parts (a 256 MB tensor peaks at
    about the idle ~65 MB), so a quota below the working set is what trips it here: that
    job fails alone, its state names the quota, the other job finishes."""
    proc, jobs_dir = host
    # Its server is stopped at the quota before it registers: the workers end at their
    # registration timeout (15 s, not the default 30: nothing else waits on it).
    big = shared_job(
        jobs_dir,
        [TENANT, "3", str(16 * 1024 * 1024), "2r"],
        quota_mb=40,
        tcp=True,
        registration_timeout=15,
    )
    small = shared_job(jobs_dir, [TENANT, "4", "100000", "8"])
    with big, small:
        st = wait_state(jobs_dir, big.job_id, ("failed", "done"), 120)
        assert st["state"] == "failed", st
        assert "memory quota of 40 MiB" in st["why"], st
        small.wait(120)
        for w in small.workers():
            assert w.popen.returncode == 0 and "TENANT-ROUNDS" in w.output, small.dump()
        big.wait(120)
        for w in big.workers():
            assert w.popen.returncode != 0 and "TENANT-ROUNDS" not in w.output, big.dump()
    assert proc.poll() is None


def test_bad_job_files_are_rejected(host: Tuple[subprocess.Popen, str]) -> None:
    _, jobs_dir = host
    loose = Path(jobs_dir) / "loose.job"
    loose.write_text('{"job_id": "loose"}')
    loose.chmod(0o644)
    st = wait_state(jobs_dir, "loose", ("rejected",), 20)
    assert "must be 0600" in st["why"]
    spec = JobSpec("short", "tok", "127.0.0.1:1", 2, 1, 0)
    admit(jobs_dir, spec)
    st = wait_state(jobs_dir, "short", ("rejected",), 20)
    assert "token shorter than 16" in st["why"]
