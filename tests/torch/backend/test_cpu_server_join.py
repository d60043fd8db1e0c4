"""A server on a CPU-only machine joins a torchrun job: workers with FASTPS_CPU_SERVERS=1,
the server started apart with ``python -m fastps.server --join MASTER_ADDR:MASTER_PORT``
(``fastps.launch.store_rendezvous.serve_cpu_server``). Worker:
``workers/cpu_server_worker.py``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from torchrun import REPO, WORKERS, free_port, kill_tree, path_env, start_torchrun

WORKER = WORKERS / "cpu_server_worker.py"


@pytest.mark.parametrize(
    ("per_host", "servers"),
    [("1", 2), ("0", 1)],
    ids=["with-host-server", "cpu-server-only"],
)
def test_cpu_server_joins_through_the_store(tmp_path: Path, per_host: str, servers: int) -> None:
    """The joined server is one of the job's servers (the scheduler counts it; with
    FASTPS_SERVERS_PER_HOST=0 it is the only one, so every sum goes through it), the sums
    are exact, and it exits 0 when the job ends."""
    port = free_port()
    log = tmp_path / "torchrun.log"
    env = path_env("shm", FASTPS_CPU_SERVERS="1", FASTPS_SERVERS_PER_HOST=per_host)
    job = start_torchrun(WORKER, str(servers), nproc=2, env=env, log=log, port=port)
    server_env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPS_")}
    server_env["PYTHONUNBUFFERED"] = "1"
    server = subprocess.Popen(
        [sys.executable, "-m", "fastps.server", "--join", f"127.0.0.1:{port}"],
        env=server_env,
        cwd=str(REPO),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        rc = job.wait(240)
        server_out, _ = server.communicate(timeout=90)
        out = log.read_text()
        assert rc == 0, f"torchrun exit {rc}\n{out[-5000:]}\n--- server:\n{server_out[-3000:]}"
        assert out.count(f"{servers} servers") == 2 and out.count("CPU OK rank") == 2, out[-4000:]
        assert server.returncode == 0, (
            f"joined server exit {server.returncode}:\n{server_out[-3000:]}"
        )
    finally:
        kill_tree(job)
        if server.poll() is None:
            server.kill()
            server.wait(10)
