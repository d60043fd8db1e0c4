"""``fastps.run(fn, args, kwargs, np=...)``: run a Python function on the workers of a new job
and get back what each rank returned, in rank order (Horovod's ``horovod.run``).

The job is the one ``fastpsrun`` would start — scheduler in this process, summation
servers, ``np`` workers on this machine or on ``hosts`` — with
``python -m fastps.launch.function_task`` as the workers' command. The function travels to
them, and their results back, through a small store this call serves for the job's
duration (``kv_store``), signed with a secret only the job's processes hold. The function
calls ``hvd.init()`` itself, as it would under Horovod.

If a rank raises, the call raises ``RuntimeError`` naming the rank, with the rank's own
exception chained and its traceback in the message; if a process dies or the job is stopped
without a result, the error names it too.
"""

from __future__ import annotations

import secrets
import sys
from typing import Any, Callable, List, Mapping, Optional, Sequence, Tuple

from fastps.config import default_advertised_host, format_addr
from fastps.errors import FastPSError

__all__ = ["run"]

COMMAND_MODULE = "fastps.launch.function_task"


def _refuse(name: str, value: Any, why: str) -> None:
    if value not in (None, False):
        raise ValueError(f"fastps.run: {name}={value!r}: {why}")


def _launcher(
    command: List[str],
    np: int,
    hosts: Optional[str],
    hostfile: Optional[str],
    num_servers: Optional[int],
    timeout: Optional[float],
    multihost: Mapping[str, Any],
) -> Any:
    from fastps.launch.cluster_cli import cluster_launcher_from_cli
    from fastps.launch.job import Launcher

    if hosts or hostfile:
        opts = {"hosts": hosts, "hostfile": hostfile, "slurm": False, **multihost}
        return cluster_launcher_from_cli(command, np, num_servers, opts, timeout=timeout)
    for name, value in multihost.items():
        _refuse(name, value, "needs hosts= or hostfile=")
    return Launcher(
        command,
        num_workers=np,
        num_servers=1 if num_servers is None else num_servers,
        timeout=timeout,
    )


def _collect(store: Any, np: int, secret: str) -> Tuple[List[Any], List[str]]:
    """Every rank's result; raises RuntimeError naming the lowest rank that failed."""
    from fastps.launch.function_task import result_key, unpack

    results: List[Any] = []
    missing: List[str] = []
    for rank in range(np):
        key = result_key(rank)
        if not store.check([key]):
            missing.append(f"rank {rank}")
            results.append(None)
            continue
        ok, value, trace = unpack(store.get(key).decode(), secret, f"rank {rank}'s result")
        if not ok:
            raise RuntimeError(
                f"fastps.run: rank {rank} raised {type(value).__name__}: {value}\n{trace.rstrip()}"
            ) from value
        results.append(value)
    return results, missing


def run(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: Optional[Mapping[str, Any]] = None,
    np: int = 1,
    hosts: Optional[str] = None,
    hostfile: Optional[str] = None,
    num_servers: Optional[int] = None,
    start_timeout: Optional[float] = None,
    ssh_port: Optional[int] = None,
    ssh_identity_file: Optional[str] = None,
    output_filename: Optional[str] = None,
    verbose: Optional[bool] = None,
    network_interface: Optional[str] = None,
    executable: Optional[str] = None,
    disable_cache: Optional[bool] = None,
    use_gloo: Optional[bool] = None,
    use_mpi: Optional[bool] = None,
    mpi_args: Optional[str] = None,
    min_np: Optional[int] = None,
    max_np: Optional[int] = None,
    slots: Optional[int] = None,
    reset_limit: Optional[int] = None,
) -> List[Any]:
    """Runs ``fn(*args, **kwargs)`` on ``np`` workers of a new fastps job and returns each
    rank's return value, in rank order.

    ``hosts`` ("a:2,b:2") or ``hostfile`` place the workers on other machines (over ssh, as
    ``fastpsrun -H``); ``start_timeout`` bounds registration (FASTPS_TIMEOUT);
    ``output_filename`` and ``verbose`` are fastpsrun's ``--output-filename`` and
    ``--verbose``; ``executable`` is the Python the workers run (default: this one).
    ``use_gloo`` and ``disable_cache`` are accepted for Horovod's sake and change nothing
    (fastps has its own transport and no response cache); MPI and the elastic arguments are
    refused.
    """
    _refuse("use_mpi", use_mpi, "fastps does not run over MPI (its own transport is used)")
    _refuse("mpi_args", mpi_args, "fastps does not run over MPI")
    for name, value in (("min_np", min_np), ("max_np", max_np), ("slots", slots)):
        _refuse(name, value, "elastic jobs are not supported by fastps.run() yet: use fastpsrun")
    _refuse("reset_limit", reset_limit, "elastic jobs are not supported by fastps.run() yet")
    if not callable(fn):
        raise TypeError(f"fastps.run: fn must be callable, got {type(fn).__name__}")
    if isinstance(np, bool) or not isinstance(np, int) or np < 1:
        raise ValueError(f"fastps.run: np must be an integer >= 1, got {np!r}")

    from fastps.launch.function_task import FUNCTION_KEY, pack
    from fastps.launch.kv_store import StoreClient, StoreServer

    remote = bool(hosts or hostfile)
    # Workers on other machines reach this one at its address on the route to them; local
    # workers over loopback.
    bind = "0.0.0.0" if remote else "127.0.0.1"
    secret = secrets.token_hex(32)
    try:
        payload = pack((fn, tuple(args), dict(kwargs or {})), secret)
    except Exception as exc:
        raise FastPSError(
            f"fastps.run: cannot send {getattr(fn, '__name__', fn)!r} to the workers: {exc} "
            "(install cloudpickle to send functions defined in __main__ or a notebook)"
        ) from exc
    server = StoreServer(bind, 0)
    try:
        advertised = default_advertised_host(_first_host(hosts, hostfile)) if remote else bind
        store = StoreClient("127.0.0.1", server.port, 10.0)
        store.set(FUNCTION_KEY, payload)
        command = [executable or sys.executable, "-m", "fastps.launch.function_task"]
        multihost = {
            "ssh_port": ssh_port,
            "ssh_identity_file": ssh_identity_file,
            "network_interface": network_interface,
        }
        launcher = _launcher(command, np, hosts, hostfile, num_servers, start_timeout, multihost)
        # Only the job's processes get the store's address and the secret.
        launcher.base_env.update(
            FASTPS_RUN_ADDR=format_addr(advertised, server.port), FASTPS_RUN_SECRET=secret
        )
        launcher.set_output(output_filename, bool(verbose))
        code = launcher.run()
        results, missing = _collect(store, np, secret)
    finally:
        server.close()
    if code != 0 or missing:
        lost = f": no result from {', '.join(missing)}" if missing else ""
        raise RuntimeError(f"fastps.run: the job failed (exit code {code}){lost}")
    return results


def _first_host(hosts: Optional[str], hostfile: Optional[str]) -> Optional[str]:
    from fastps.launch.hosts import parse_host_list, parse_hostfile, split_user

    parsed = parse_host_list(hosts) if hosts else parse_hostfile(hostfile) if hostfile else []
    return split_user(parsed[0].name)[1].strip("[]") if parsed else None
