"""The Ray actors of a fastps job: the scheduler, one summation server per node (and one on
each CPU-only node the executor was asked for), the workers.

They are plain classes here; the executor makes them actors (``ray.remote``) with the
resources and placement it chose. Each is owned by the driver that created it, so Ray ends
them when the driver exits; a server's own process (``python -m fastps.server``) is the
actor's child and gets the death signal of its parent (``FASTPS_PARENT_PID``).
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from fastps.config import Config

__all__ = ["SchedulerActor", "ServerActor", "WorkerActor", "node_address", "placement"]

STOP_GRACE = 5.0  # s a server gets after SIGTERM before SIGKILL


def node_address() -> str:
    """The address of the Ray node this process runs on (what its peers reach it by)."""
    import ray

    return str(ray.util.get_node_ip_address())


def placement() -> Dict[str, str]:
    """Where this actor runs: Ray's node id, the host name and the node's address."""
    import ray

    return {
        "node_id": str(ray.get_runtime_context().get_node_id()),
        "hostname": socket.gethostname(),
        "ip": node_address(),
    }


class SchedulerActor:
    """Runs fastps's scheduler (a thread of this actor) for one job at a time."""

    def __init__(self, env: Mapping[str, str]) -> None:
        os.environ.update(env)
        self._scheduler: Any = None

    def start_job(self, num_workers: int, num_servers: int, timeout: float) -> Dict[str, Any]:
        """Starts a scheduler for a new job (after stopping the last one); returns the job's
        address, id and token for the servers' and workers' environment."""
        from fastps.control.scheduler import Scheduler

        self.stop()
        base = Config.from_env({**os.environ, "FASTPS_ROLE": "scheduler"})
        job_id = f"ray-{secrets.token_hex(4)}"
        token = secrets.token_hex(16)
        scheduler = Scheduler(
            num_workers=num_workers,
            num_servers=num_servers,
            job_id=job_id,
            token=token,
            host=node_address(),
            port=0,
            timeout=float(timeout),
            heartbeat_timeout=base.heartbeat_timeout,
            auth_timeout=base.handshake_timeout,
            elastic_servers=base.elastic_servers,
        )
        scheduler.start()
        self._scheduler = scheduler
        return {"scheduler": scheduler.address_text, "job_id": job_id, "token": token}

    def finished(self) -> Optional[str]:
        """None while the job runs; else why it ended ("" when every worker left)."""
        s = self._scheduler
        if s is None:
            return ""
        if not s.finished:
            return None
        return s.abort_reason or ""

    def stop(self) -> None:
        if self._scheduler is not None:
            self._scheduler.stop()
            self._scheduler.join(STOP_GRACE)
            self._scheduler = None


class ServerActor:
    """Keeps one summation server process (``python -m fastps.server``) for the job."""

    def __init__(self, env: Mapping[str, str]) -> None:
        os.environ.update(env)
        self._proc: Optional[subprocess.Popen] = None

    def start(self, server_id: int, job_env: Mapping[str, str]) -> int:
        """Starts the server of a new job (after stopping the last one's); returns its pid."""
        from fastps.launch.server_process import spawn_server

        self.stop()
        self._proc = spawn_server(server_id, job_env, node_address())
        return int(self._proc.pid)

    def returncode(self) -> Optional[int]:
        return None if self._proc is None else self._proc.poll()

    def placement(self) -> Dict[str, str]:
        """Where this server runs (its node id, host name, address); also a readiness
        probe: it answers once Ray has placed and started the actor."""
        return placement()

    def stop(self, wait: float = 0.0) -> None:
        """Stops this actor's server, after ``wait`` s for it to finish on its own."""
        from fastps.launch.server_process import stop_server

        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            stop_server(proc, wait=wait, grace=STOP_GRACE)


class WorkerActor:
    """One rank of the job: runs the user's functions with the job's ``FASTPS_*`` variables
    in its environment, so ``hvd.init()`` inside them joins the job. Horovod's
    ``BaseHorovodWorker`` methods, for code that drives the actors itself."""

    executable: Any = None

    def __init__(self, env: Optional[Mapping[str, str]] = None) -> None:
        if env:
            self.update_env_vars(env)

    def node_id(self) -> str:
        import ray

        return str(ray.get_runtime_context().get_node_id())

    def hostname(self) -> str:
        return socket.gethostname()

    def placement(self) -> Dict[str, str]:
        """Where this actor runs: Ray's node id, the host name and the node's address."""
        return placement()

    def get_gpu_ids(self) -> List[int]:
        import ray

        return [int(i) for i in ray.get_gpu_ids()]

    def update_env_vars(self, env_vars: Mapping[str, Any]) -> None:
        os.environ.update({str(k): str(v) for k, v in env_vars.items()})

    def env_vars(self) -> Dict[str, str]:
        return dict(os.environ)

    def start_executable(
        self,
        executable_cls: Optional[type] = None,
        executable_args: Optional[Sequence[Any]] = None,
        executable_kwargs: Optional[Mapping[str, Any]] = None,
    ) -> None:
        if executable_cls is not None:
            self.executable = executable_cls(*(executable_args or ()), **(executable_kwargs or {}))

    def execute(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(executable)``: the object ``start(executable_cls=...)`` created, or None."""
        return fn(self.executable)

    def run(
        self,
        fn: Callable[..., Any],
        args: Optional[Sequence[Any]] = None,
        kwargs: Optional[Mapping[str, Any]] = None,
    ) -> Any:
        return fn(*(args or ()), **(kwargs or {}))

    def leave(self) -> None:
        """Leaves the fastps job if this process is in one (before the actor ends)."""
        from fastps.worker.api import shutdown

        shutdown()

    def initialized(self) -> bool:
        """Whether this process is in a fastps job now (``hvd.init()`` ran, no shutdown)."""
        from fastps.worker.api import is_initialized

        return is_initialized()
