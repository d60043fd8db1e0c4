"""What each task of ``fastps.spark.run``'s barrier stage does.

The tasks form the job among themselves, with Spark's barrier ``allGather`` as the only
channel: every task shares its host, rank 0 starts the scheduler (a thread of its own
process) and shares its address, the job's id and a fresh token, and the first rank on each
host starts that host's summation server as its child. Then every task runs the user's
function with the job's ``FASTPS_*`` variables in its environment (``hvd.init()`` joins),
leaves the job, waits for what it started, and puts its environment back: Spark reuses its
Python workers, and nothing of the job may stay in them.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import secrets
import socket
import sys
import time
import traceback
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    TextIO,
    Tuple,
)

from fastps import config as _config
from fastps.errors import FastPSError
from fastps.launch.server_process import spawn_server, stop_server

__all__ = ["run_task", "FAILURE_MARK"]

FAILURE_MARK = "fastps.spark task failure:"  # the driver finds the failed rank by this
EXIT_WAIT = 60.0  # s rank 0 keeps the scheduler, and an owner its server, for the others


def _address(env: Mapping[str, str], driver_host: Optional[str]) -> str:
    """What this task's scheduler or server advertises: FASTPS_HOST, FASTPS_IFACE's
    address, else the local address that routes to the driver."""
    host = _config.stated_host(env)
    if host:
        return host
    iface = _config.network_interface(env)
    if iface:
        from fastps.control.netif import interface_address

        return interface_address(iface)
    return _config.default_advertised_host(driver_host)


def _start_scheduler(
    size: int, num_servers: int, timeout: float, me: str
) -> Tuple[Any, Dict[str, Any]]:
    from fastps.config import Config
    from fastps.control.scheduler import Scheduler

    base = Config.from_env({**os.environ, "FASTPS_ROLE": "scheduler"})
    job_id = f"spark-{secrets.token_hex(4)}"
    token = secrets.token_hex(16)
    scheduler = Scheduler(
        num_workers=size,
        num_servers=num_servers,
        job_id=job_id,
        token=token,
        host=me,
        port=0,
        timeout=timeout,
        heartbeat_timeout=base.heartbeat_timeout,
        auth_timeout=base.handshake_timeout,
        elastic_servers=base.elastic_servers,
    )
    scheduler.start()
    return scheduler, {"scheduler": scheduler.address_text, "job_id": job_id, "token": token}


Lines = List[Tuple[float, str]]  # (time the line was completed, its text)


class _Tee(io.TextIOBase):
    """Passes what is written on to ``original`` (the executor's log) and keeps its lines."""

    def __init__(self, original: TextIO) -> None:
        self.original = original
        self.lines: Lines = []
        self._partial = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.original.write(text)
        *done, self._partial = (self._partial + text).split("\n")
        now = time.time()
        self.lines.extend((now, line) for line in done)
        return len(text)

    def flush(self) -> None:
        self.original.flush()

    def captured(self) -> Lines:
        tail = [(time.time(), self._partial)] if self._partial else []
        return self.lines + tail


@contextlib.contextmanager
def _capturing(streams: Sequence[str]) -> Iterator[Dict[str, _Tee]]:
    """While the block runs, ``sys.stdout``/``sys.stderr`` (those named) also keep lines."""
    tees = {name: _Tee(getattr(sys, name)) for name in streams}
    saved = {name: getattr(sys, name) for name in tees}
    for name, tee in tees.items():
        setattr(sys, name, tee)
    try:
        yield tees
    finally:
        for name, original in saved.items():
            setattr(sys, name, original)


def run_task(
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    env: Mapping[str, str],
    timeout: float,
    driver_host: Optional[str],
    capture: Sequence[str],
    _partition: Iterable[Any],
) -> Iterator[Tuple[int, Any, Dict[str, Lines]]]:
    """The body of one barrier task: yields ``(rank, fn(*args, **kwargs), output)``, where
    output holds the lines ``fn`` wrote to each stream named in ``capture`` ("stdout",
    "stderr"; they also reach the executor's log as usual)."""
    from pyspark import BarrierTaskContext

    ctx = BarrierTaskContext.get()
    rank = ctx.partitionId()
    size = len(ctx.getTaskInfos())
    saved = dict(os.environ)
    os.environ.update(env)
    scheduler: Any = None
    server: Any = None
    wait = EXIT_WAIT  # a failed rank does not wait for the others: Spark stops them
    try:
        me = _address(os.environ, driver_host)
        hostname = socket.gethostname()
        peers = [json.loads(x) for x in ctx.allGather(json.dumps([hostname, me]))]
        hosts: List[str] = []
        for h, _ in peers:
            if h not in hosts:
                hosts.append(h)
        job: Dict[str, Any] = {}
        if rank == 0:
            try:
                scheduler, job = _start_scheduler(size, len(hosts), timeout, me)
            except Exception as exc:  # noqa: BLE001 - every rank must hear it, not only 0
                job = {"error": f"{type(exc).__name__}: {exc}"}
        job = json.loads(ctx.allGather(json.dumps(job))[0])
        if "error" in job:
            raise FastPSError(f"rank 0 could not start the job's scheduler: {job['error']}")
        job_env = {
            "FASTPS_SCHEDULER_ADDR": job["scheduler"],
            "FASTPS_JOB_ID": job["job_id"],
            "FASTPS_TOKEN": job["token"],
            "FASTPS_NUM_WORKERS": str(size),
            "FASTPS_NUM_SERVERS": str(len(hosts)),
            "FASTPS_TIMEOUT": f"{timeout:g}",
        }
        if [h for h, _ in peers].index(hostname) == rank:
            server = spawn_server(hosts.index(hostname), job_env, me)
        os.environ.update(job_env, FASTPS_ROLE="worker", FASTPS_RANK=str(rank), FASTPS_HOST=me)
        with _capturing(capture) as tees:
            result = fn(*args, **kwargs)
        output = {name: tee.captured() for name, tee in tees.items()}
    except BaseException as exc:
        wait = 0.0
        detail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        raise RuntimeError(
            f"{FAILURE_MARK} rank {rank} of {size}: {type(exc).__name__}: {exc}\n{detail}"
        ) from None
    finally:
        _leave()
        if scheduler is not None:
            scheduler.join(wait)  # until every worker left
            scheduler.stop()
        if server is not None:
            stop_server(server, wait=wait)
        os.environ.clear()
        os.environ.update(saved)
    yield rank, result, output


def _leave() -> None:
    """Leaves the fastps job if this process is in one (idempotent)."""
    from fastps.worker.api import shutdown

    shutdown()
