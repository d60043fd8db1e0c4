"""Starts fastps jobs for tests the way an external launcher would: the scheduler in this
process, servers and workers as subprocesses configured only by FASTPS_* variables.

Unlike fastpsrun, nothing here stops the other processes when one dies, so tests see what
fastps itself does about a dead or misbehaving peer.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from fastps.control.scheduler import Scheduler

HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS = os.path.join(HERE, "workers")

# The data paths a part can take (docs/design/architecture.md), each laid out with emulated hosts
# (FASTPS_HOSTNAME per process): path -> f(n workers, k servers) = (FASTPS_SHM, worker
# hosts, server hosts). Tests parameterised over them run their matrix on every path.
DATA_PATHS: Dict[str, Callable[[int, int], Tuple[str, List[str], List[str]]]] = {
    # Every worker and server on one host, shared memory off: every part crosses TCP and
    # every server sums n copies.
    "tcp": lambda n, k: ("0", ["h"] * n, ["h"] * k),
    # One worker per host, servers beside workers: a worker reaches the server on its host
    # through shared memory, the others over TCP.
    "shm": lambda n, k: ("1", [f"h{i}" for i in range(n)], [f"h{s % n}" for s in range(k)]),
    # Everything on one host: the workers sum each part locally first (with one worker,
    # its pushes reach the servers through shared memory).
    "local": lambda n, k: ("1", ["h"] * n, ["h"] * k),
    # One worker per host and the servers on hosts of their own (CPU machines): every push
    # crosses TCP from another host.
    "hosts": lambda n, k: ("1", [f"h{i}" for i in range(n)], [f"cpu{s}" for s in range(k)]),
}


@dataclass
class Proc:
    role: str
    index: int
    popen: subprocess.Popen
    lines: List[str] = field(default_factory=list)
    exited_at: Optional[float] = None

    @property
    def output(self) -> str:
        return "".join(self.lines)


class Job:
    def __init__(
        self,
        num_workers: int,
        num_servers: int,
        argv: List[str],
        env: Optional[Dict[str, str]] = None,
        heartbeat_timeout: float = 5.0,
        worker_hosts: Optional[List[str]] = None,
        server_hosts: Optional[List[str]] = None,
        job_id: Optional[str] = None,
        custom: Optional[Dict[Tuple[str, int], List[str]]] = None,
        worker_racks: Optional[List[str]] = None,
        server_racks: Optional[List[str]] = None,
        registration_timeout: float = 30.0,
    ) -> None:
        """worker_hosts/server_hosts: FASTPS_HOSTNAME of each process, to emulate machines;
        worker_racks/server_racks: their FASTPS_RACK (rack-level hierarchy).
        custom: python arguments of particular processes, by (role, index).
        registration_timeout: how long the scheduler waits for every process to register."""
        custom = custom or {}
        self.job_id = job_id or "t" + secrets.token_hex(3)
        self.token = secrets.token_hex(16)
        self.scheduler = Scheduler(
            num_workers,
            num_servers,
            self.job_id,
            self.token,
            timeout=registration_timeout,
            heartbeat_timeout=heartbeat_timeout,
        )
        self.scheduler.start()
        base = {k: v for k, v in os.environ.items() if not k.startswith("FASTPS_")}
        base.update(env or {})
        # Every worker runs on this machine, even those that emulate machines of their own
        # (worker_hosts): each one sizing its thread pool to the cores, as on a machine of
        # its own, oversubscribes them (spinning OpenMP threads made the digits example 10x
        # slower on emulated hosts). The examples honour an explicit OMP_NUM_THREADS.
        base.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // num_workers)))
        base.update(
            {
                "FASTPS_SCHEDULER_ADDR": self.scheduler.address_text,
                "FASTPS_JOB_ID": self.job_id,
                "FASTPS_TOKEN": self.token,
                "FASTPS_NUM_WORKERS": str(num_workers),
                "FASTPS_NUM_SERVERS": str(num_servers),
                "FASTPS_HEARTBEAT_TIMEOUT": str(heartbeat_timeout),
                "FASTPS_HOST": "127.0.0.1",
                "PYTHONUNBUFFERED": "1",
            }
        )
        self.procs: List[Proc] = []
        for s in range(num_servers):
            env_s = dict(base, FASTPS_ROLE="server", FASTPS_SERVER_ID=str(s))
            if server_hosts:
                env_s["FASTPS_HOSTNAME"] = server_hosts[s]
            if server_racks:
                env_s["FASTPS_RACK"] = server_racks[s]
            args = custom.get(("server", s), ["-m", "fastps.server"])
            self._spawn("server", s, [sys.executable, *args], env_s)
        for r in range(num_workers):
            env_w = dict(base, FASTPS_ROLE="worker", FASTPS_RANK=str(r))
            if worker_hosts:
                env_w["FASTPS_HOSTNAME"] = worker_hosts[r]
            if worker_racks:
                env_w["FASTPS_RACK"] = worker_racks[r]
            self._spawn("worker", r, [sys.executable, *custom.get(("worker", r), argv)], env_w)

    def _spawn(self, role: str, index: int, argv: List[str], env: Dict[str, str]) -> None:
        p = subprocess.Popen(
            argv,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        proc = Proc(role, index, p)
        self.procs.append(proc)

        def pump() -> None:
            assert p.stdout is not None
            for line in p.stdout:
                proc.lines.append(line)
            p.wait()
            proc.exited_at = time.monotonic()

        threading.Thread(target=pump, daemon=True).start()

    def proc(self, role: str, index: int) -> Proc:
        return next(p for p in self.procs if p.role == role and p.index == index)

    def workers(self) -> List[Proc]:
        return [p for p in self.procs if p.role == "worker"]

    def wait(self, timeout: float, procs: Optional[List[Proc]] = None) -> None:
        """Waits for the given processes (default: all) to exit; kills all on timeout."""
        deadline = time.monotonic() + timeout
        for p in procs if procs is not None else self.procs:
            while p.exited_at is None and time.monotonic() < deadline:
                time.sleep(0.05)
            if p.exited_at is None:
                self.close()
                raise AssertionError(
                    f"{p.role} {p.index} still running after {timeout} s:\n" + self.dump()
                )
        time.sleep(0.05)  # let the output pumps finish

    def dump(self) -> str:
        return "\n".join(
            f"--- {p.role} {p.index} (rc {p.popen.returncode}) ---\n{p.output}" for p in self.procs
        )

    def close(self) -> None:
        for p in self.procs:
            if p.popen.poll() is None:
                try:
                    os.killpg(p.popen.pid, 9)
                except ProcessLookupError:
                    pass
                p.popen.wait(timeout=10)
        self.scheduler.stop()

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
