"""Silent or slow peers that never authenticate must not delay a legitimate job: handshakes
run side by side with per-connection deadlines, and when too many are under way the oldest
is turned away with a 'busy' answer that clients retry."""

from __future__ import annotations

import os
import re
import secrets
import socket
import threading
import time
from typing import List

from fastps.control.protocol import ControlClient
from fastps.control.scheduler import MAX_UNAUTHENTICATED, Scheduler
from jobs import WORKERS, Job

STARTUP_WORKER = os.path.join(WORKERS, "startup_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _open_idle(addr, count: int, deadline: float) -> List[socket.socket]:
    socks: List[socket.socket] = []
    while len(socks) < count and time.monotonic() < deadline:
        try:
            socks.append(socket.create_connection(addr, timeout=1.0))
        except OSError:
            time.sleep(0.01)
    return socks


def test_scheduler_serves_a_job_past_hundreds_of_idle_connections() -> None:
    sched = Scheduler(
        2, 0, "idle" + secrets.token_hex(2), secrets.token_hex(8), timeout=30.0, auth_timeout=30.0
    )
    sched.start()
    idle = _open_idle(sched.address, MAX_UNAUTHENTICATED + 50, time.monotonic() + 20)
    try:
        assert len(idle) == MAX_UNAUTHENTICATED + 50
        took: List[float] = []

        def worker(rank: int) -> None:
            t0 = time.monotonic()
            with ControlClient(sched.address, sched.job_id, sched._token, timeout=20.0) as c:
                c.register("worker", rank, "127.0.0.1", "h", num_workers=2, num_servers=0)
                took.append(time.monotonic() - t0)

        threads = [threading.Thread(target=worker, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(took) == 2, "a legitimate worker did not register"
        assert max(took) < 3.0, took
        # The oldest idle connections were told why they were dropped.
        first = idle[0]
        first.settimeout(5)
        assert b"busy" in first.recv(4096)
    finally:
        for s in idle:
            s.close()
        sched.stop()


def test_server_handshakes_do_not_wait_for_idle_connections() -> None:
    port = _free_port()
    idle: List[socket.socket] = []
    stop = threading.Event()

    def flood() -> None:
        # Hold 100 silent connections to the server from the moment it listens.
        while not stop.is_set() and len(idle) < 100:
            idle.extend(_open_idle(("127.0.0.1", port), 100 - len(idle), time.monotonic() + 0.2))

    t = threading.Thread(target=flood, daemon=True)
    t.start()
    try:
        with Job(2, 1, [STARTUP_WORKER], env={"FASTPS_SERVER_PORT": str(port)}) as job:
            job.wait(60, job.workers())
            for w in job.workers():
                assert w.popen.returncode == 0, job.dump()
                assert "SUM-OK" in w.output, job.dump()
                m = re.search(r"INIT-SECONDS ([\d.]+)", w.output)
                assert m and float(m.group(1)) < 5.0, job.dump()
            assert len(idle) >= 64, len(idle)
    finally:
        stop.set()
        t.join(5)
        for s in idle:
            s.close()
