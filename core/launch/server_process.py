"""A summation server as a child process of the process that owns it (``python -m
fastps.server``), for the launchers whose own processes belong to a cluster engine (Ray's
server actors, Spark's first task on each host). The server gets its parent's death signal
(``FASTPS_PARENT_PID``), so it never outlives its owner; its lines come out prefixed
``[server N] `` on the owner's stdout and stderr, where the engine collects them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from typing import Dict, Mapping, Optional

__all__ = ["spawn_server", "stop_server", "JOB_VARS"]

# What a job's servers and workers share: fastps.config reads these.
JOB_VARS = (
    "FASTPS_SCHEDULER_ADDR",
    "FASTPS_JOB_ID",
    "FASTPS_TOKEN",
    "FASTPS_NUM_WORKERS",
    "FASTPS_NUM_SERVERS",
)
# A worker's own variables, which must not leak into a server it starts.
_NOT_FOR_SERVERS = ("FASTPS_RANK", "FASTPS_SERVER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE")


def spawn_server(
    server_id: int,
    job_env: Mapping[str, str],
    host: str,
    base_env: Optional[Mapping[str, str]] = None,
) -> subprocess.Popen:
    """Starts server ``server_id`` of the job in ``job_env`` (the :data:`JOB_VARS`),
    advertising ``host``; it ends with this process."""
    from fastps.launch.job import pump, stderr_bytes, stdout_bytes

    env: Dict[str, str] = dict(os.environ if base_env is None else base_env)
    for var in _NOT_FOR_SERVERS:
        env.pop(var, None)
    env.update(job_env)
    env.update(
        FASTPS_ROLE="server",
        FASTPS_SERVER_ID=str(server_id),
        FASTPS_HOST=host,
        FASTPS_PARENT_PID=str(os.getpid()),
        PYTHONUNBUFFERED="1",
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "fastps.server"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    prefix = f"[server {server_id}] ".encode()
    for stream, sink in ((proc.stdout, stdout_bytes()), (proc.stderr, stderr_bytes())):
        assert stream is not None
        threading.Thread(
            target=pump, args=(stream, prefix, sink), name=f"fastps-server{server_id}", daemon=True
        ).start()
    return proc


def stop_server(proc: subprocess.Popen, wait: float, grace: float = 5.0) -> Optional[int]:
    """Waits up to ``wait`` s for the server to finish (it does once every worker left),
    then SIGTERM, then SIGKILL after ``grace`` s; returns its exit code."""
    try:
        return proc.wait(max(0.0, wait))
    except subprocess.TimeoutExpired:
        pass
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()
