"""Joining a job through the key-value store another launcher set up, without fastpsrun.

torchrun, Lightning, Ray Train and Spark's TorchDistributor all start the training processes
themselves and give them a store (torch's ``TCPStore`` at ``MASTER_ADDR:MASTER_PORT``). A
fastps job needs a scheduler, summation servers, and the job's address, id and token in
every worker; here the store carries them:

* every rank writes its host name (``fastps/host/<rank>``);
* rank 0 reads them all, starts the scheduler in its own process (a thread), and writes the
  job (``fastps/job``: the scheduler's address, the job id and token, the servers);
* the first rank on each host starts that host's servers (``FASTPS_SERVERS_PER_HOST``,
  default 1) as child processes that die with it;
* servers on CPU-only machines (``FASTPS_CPU_SERVERS``) join with
  ``python -m fastps.server --join MASTER_ADDR:MASTER_PORT``: they find the job under the
  store's root (``fastps/cpu/job``) and draw their ids from a counter.

Everything a rank starts ends with it: the scheduler is a thread of rank 0, the servers get
the parent's death signal (``FASTPS_PARENT_PID``, ``fastps.control.server``). At exit, rank
0 keeps the scheduler until every worker left, and a rank that started servers waits for
them to finish (both bounded), so that the last rank's last op is not cut short.

The store is duck-typed (``set``, ``get``, ``wait``, ``check`` with torch's signatures), so
this module imports no framework; :func:`join_from_env` borrows torch's env:// rendezvous.
"""

from __future__ import annotations

import atexit
import datetime
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence

from fastps import config as _config
from fastps.config import Config, format_addr
from fastps.errors import FastPSError

__all__ = [
    "join",
    "join_from_env",
    "cpu_server_config",
    "started",
    "root_store",
    "wait_for",
    "text_of",
    "JOB_KEY",
    "CPU_JOB_KEY",
]

log = logging.getLogger("fastps.rendezvous")

KEY_PREFIX = "fastps/"
JOB_KEY = KEY_PREFIX + "job"
CPU_JOB_KEY = KEY_PREFIX + "cpu/job"  # under the store's root: what --join reads
CPU_SEQ_KEY = KEY_PREFIX + "cpu/next"
EXIT_WAIT = 60.0  # s the scheduler's and servers' owner waits at exit for the others


class _Started:
    """What this process started for the job: the scheduler (rank 0), servers, or neither."""

    def __init__(self) -> None:
        self.scheduler: Any = None
        self.servers: List[subprocess.Popen] = []
        self.job: Dict[str, Any] = {}
        self.lock = threading.Lock()


_started: Optional[_Started] = None


def started() -> Optional[Dict[str, Any]]:
    """The job this process joined through a store (its description), or None."""
    return None if _started is None else dict(_started.job)


def root_store(store: Any) -> Any:
    """The store under any ``PrefixStore`` wrappers (where ``--join`` finds the job)."""
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    return store


def wait_for(store: Any, keys: Sequence[str], timeout: float, what: str) -> None:
    try:
        store.wait(list(keys), datetime.timedelta(seconds=timeout))
    except Exception as exc:  # noqa: BLE001 - the store's own error type varies
        missing = [k for k in keys if not _has(store, k)]
        raise FastPSError(
            f"rendezvous through the store: {what} did not arrive within {timeout:g} s "
            f"(missing: {', '.join(missing[:8]) or '?'}{' ...' if len(missing) > 8 else ''}; "
            f"{type(exc).__name__}: {exc})"
        ) from None


def _has(store: Any, key: str) -> bool:
    try:
        return bool(store.check([key]))
    except Exception:  # noqa: BLE001
        return False


def text_of(value: Any) -> str:
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)


def _advertised(env: Mapping[str, str], toward: Optional[str]) -> str:
    """The address this process's scheduler or servers advertise: FASTPS_HOST, else
    FASTPS_IFACE's address, else the local address that routes to ``toward``."""
    host = _config.stated_host(env)
    if host:
        return host
    iface = _config.network_interface(env)
    if iface:
        from fastps.control.netif import interface_address

        return interface_address(iface)
    return _config.default_advertised_host(toward)


def join(
    store: Any,
    rank: int,
    size: int,
    timeout: float,
    master_addr: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
) -> Config:
    """Rendezvous of worker ``rank`` of ``size`` through ``store``; returns the worker's
    configuration for ``fastps.init``. ``master_addr``: the store's host (the route to it
    picks the address to advertise on a multi-homed machine). Starts the scheduler (rank 0)
    and this host's servers (its first rank)."""
    global _started
    env = dict(os.environ if env is None else env)
    base = Config.from_env(env)  # bad FASTPS_* settings fail here, before anyone waits
    hostname = base.hostname
    me = _advertised(env, master_addr)
    store.set(f"{KEY_PREFIX}host/{rank}", hostname)
    own = _Started()
    # The exit hook goes in before fastps.init's own (atexit runs them in reverse): this
    # worker leaves the job first, then the scheduler and servers it owns are waited for.
    atexit.register(_at_exit, own)
    if rank == 0:
        _start_job(store, own, size, timeout, hostname, me, base, env)
    wait_for(store, [JOB_KEY], timeout, "the job's description from rank 0")
    job = json.loads(text_of(store.get(JOB_KEY)))
    own.job = job
    hosts_of = job["host_of_rank"]
    if len(hosts_of) != size or hosts_of[rank] != hostname:
        raise FastPSError(
            f"rank {rank}: the store holds a job of {len(hosts_of)} workers with this rank on "
            f"{hosts_of[rank] if rank < len(hosts_of) else '?'!r}; this process has "
            f"world size {size} on {hostname!r} (a stale store from an earlier job?)"
        )
    hosts = job["hosts"]
    first_rank = hosts_of.index(hostname)
    if first_rank == rank and job["servers_per_host"] > 0:
        index = hosts.index(hostname)
        per = job["servers_per_host"]
        for sid in range(index * per, (index + 1) * per):
            own.servers.append(_spawn_server(sid, job, size, me, env))
    _started = own
    worker_env = {
        **env,
        "FASTPS_ROLE": "worker",
        "FASTPS_SCHEDULER_ADDR": job["scheduler"],
        "FASTPS_JOB_ID": job["job_id"],
        "FASTPS_TOKEN": job["token"],
        "FASTPS_NUM_WORKERS": str(size),
        "FASTPS_NUM_SERVERS": str(job["num_servers"]),
        "FASTPS_RANK": str(rank),
        "FASTPS_HOST": me,
        "FASTPS_HOSTNAME": hostname,
    }
    return Config.from_env(worker_env).replace(op_timeout=float(timeout))


def _start_job(
    store: Any,
    own: _Started,
    size: int,
    timeout: float,
    hostname: str,
    me: str,
    base: Config,
    env: Mapping[str, str],
) -> None:
    from fastps.control.scheduler import Scheduler

    keys = [f"{KEY_PREFIX}host/{r}" for r in range(size)]
    wait_for(store, keys, timeout, "every rank's host name")
    host_of_rank = [text_of(store.get(k)) for k in keys]
    hosts: List[str] = []
    for h in host_of_rank:
        if h not in hosts:
            hosts.append(h)
    per = _config.servers_per_host(env)
    cpu = _config.cpu_servers(env)
    num_servers = len(hosts) * per + cpu
    if num_servers == 0:
        raise FastPSError(
            "FASTPS_SERVERS_PER_HOST=0 and FASTPS_CPU_SERVERS=0: the job would have no "
            "summation server"
        )
    job_id = _config.stated_job_id(env) or f"torch-{secrets.token_hex(4)}"
    token = _config.job_token(env) or secrets.token_hex(16)
    scheduler = Scheduler(
        num_workers=size,
        num_servers=num_servers,
        job_id=job_id,
        token=token,
        host=me,
        port=0,
        timeout=max(base.timeout, float(timeout)),
        heartbeat_timeout=base.heartbeat_timeout,
        auth_timeout=base.handshake_timeout,
        elastic_servers=base.elastic_servers,
    )
    scheduler.start()
    own.scheduler = scheduler
    job = {
        "scheduler": scheduler.address_text,
        "job_id": job_id,
        "token": token,
        "num_servers": num_servers,
        "servers_per_host": per,
        "cpu_servers": cpu,
        "hosts": hosts,
        "host_of_rank": host_of_rank,
        "num_workers": size,
    }
    log.info(
        "job %s: scheduler on %s, %d workers on %d hosts, %d servers (%d per host, %d on "
        "CPU machines)",
        job_id,
        scheduler.address_text,
        size,
        len(hosts),
        num_servers,
        per,
        cpu,
    )
    text = json.dumps(job)
    if cpu:
        root_store(store).set(CPU_JOB_KEY, text)
    store.set(JOB_KEY, text)


def _server_env(
    sid: int, job: Mapping[str, Any], me: str, env: Mapping[str, str]
) -> Dict[str, str]:
    out = dict(env)
    for var in ("FASTPS_RANK", "FASTPS_SERVER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE"):
        out.pop(var, None)
    out.update(
        FASTPS_ROLE="server",
        FASTPS_SCHEDULER_ADDR=str(job["scheduler"]),
        FASTPS_JOB_ID=str(job["job_id"]),
        FASTPS_TOKEN=str(job["token"]),
        FASTPS_NUM_WORKERS=str(job["num_workers"]),
        FASTPS_NUM_SERVERS=str(job["num_servers"]),
        FASTPS_SERVER_ID=str(sid),
        FASTPS_HOST=me,
        FASTPS_PARENT_PID=str(os.getpid()),
    )
    out.setdefault("PYTHONUNBUFFERED", "1")
    return out


def _spawn_server(
    sid: int, job: Mapping[str, Any], size: int, me: str, env: Mapping[str, str]
) -> subprocess.Popen:
    from fastps.launch.job import pump, stderr_bytes, stdout_bytes

    proc = subprocess.Popen(
        [sys.executable, "-m", "fastps.server"],
        env=_server_env(sid, job, me, env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    prefix = f"[server {sid}] ".encode()
    for stream, sink in ((proc.stdout, stdout_bytes()), (proc.stderr, stderr_bytes())):
        assert stream is not None
        threading.Thread(
            target=pump, args=(stream, prefix, sink), name=f"fastps-server{sid}", daemon=True
        ).start()
    log.debug("started server %d (pid %d)", sid, proc.pid)
    return proc


def _at_exit(own: _Started) -> None:
    """After this worker left: keep the scheduler until every worker left, and the servers
    until the scheduler let them go; both bounded by EXIT_WAIT."""
    deadline = time.monotonic() + EXIT_WAIT
    if own.scheduler is not None:
        if not own.scheduler.join(EXIT_WAIT):
            log.warning(
                "the scheduler (in rank 0) still had workers after %g s at exit; stopping it",
                EXIT_WAIT,
            )
        own.scheduler.stop()
    for proc in own.servers:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def join_from_env(env: Optional[Mapping[str, str]] = None) -> Config:
    """``fastps.init()`` in a process torchrun (or any launcher setting MASTER_ADDR,
    MASTER_PORT, RANK and WORLD_SIZE) started. The store is torch's (its env:// rendezvous,
    shared with a later ``init_process_group``) where torch imports; elsewhere (TensorFlow
    or MXNet without torch) rank 0 serves ``fastps.launch.kv_store`` at MASTER_ADDR:MASTER_PORT."""
    env = dict(os.environ if env is None else env)
    timeout = Config.from_env(env).timeout  # FASTPS_TIMEOUT: how long ranks wait for each other
    master, port, rank, size = _config.torch_launch_settings(env)
    store: Any
    try:
        import torch.distributed as dist

        have_torch = True
    except ImportError:
        have_torch = False
    if have_torch:
        td = datetime.timedelta(seconds=timeout)
        # Rank and size in the URL: under mpirun or srun they come from OMPI_COMM_WORLD_* or
        # SLURM_* (config.torch_launch_settings), and env:// alone would insist on RANK.
        url = f"env://?rank={rank}&world_size={size}"
        store, rank, size = next(dist.rendezvous(url, timeout=td))
        store.set_timeout(td)
    else:
        from fastps.launch.kv_store import StoreClient, StoreServer

        if rank == 0:
            _kv_servers.append(StoreServer("0.0.0.0", port))
        store = StoreClient(master, port, timeout)
    return join(store, rank, size, timeout, master, env)


_kv_servers: List[Any] = []  # rank 0's store without torch: served as long as the process


def cpu_server_config(addr: str, timeout: float = _config.DEFAULT_STORE_TIMEOUT) -> Config:
    """``python -m fastps.server --join HOST:PORT``: the configuration of a server on a
    CPU-only machine joining the job whose store listens at ``addr`` (the workers'
    MASTER_ADDR:MASTER_PORT); it takes the next server id. The store client is torch's where
    torch imports, else fastps's own (``fastps.launch.kv_store``, as the workers chose)."""
    from fastps.config import parse_addr

    host, port = parse_addr(addr, "--join")
    try:
        import torch.distributed as dist

        store: Any = dist.TCPStore(
            host, port, is_master=False, timeout=datetime.timedelta(seconds=timeout)
        )
    except ImportError:
        from fastps.launch.kv_store import StoreClient

        store = StoreClient(host, port, timeout)
    wait_for(store, [CPU_JOB_KEY], timeout, "the job (rank 0 writes it once every rank came)")
    job = json.loads(text_of(store.get(CPU_JOB_KEY)))
    seq = int(store.add(f"{CPU_SEQ_KEY}/{job['job_id']}", 1)) - 1  # per job: restarts count anew
    if seq >= int(job["cpu_servers"]):
        raise FastPSError(
            f"the job at {format_addr(host, port)} wants {job['cpu_servers']} CPU servers and "
            f"has them all (this would be number {seq + 1}); raise FASTPS_CPU_SERVERS"
        )
    sid = len(job["hosts"]) * int(job["servers_per_host"]) + seq
    env = _server_env(sid, job, _advertised(os.environ, host), os.environ)
    env.pop("FASTPS_PARENT_PID", None)
    return Config.from_env(env)
