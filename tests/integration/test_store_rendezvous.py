"""Jobs that form without fastpsrun from the variables other launchers set (MASTER_ADDR,
MASTER_PORT, RANK, WORLD_SIZE), in processes where torch cannot be imported: rank 0 serves
fastps's own rendezvous store (``fastps.launch.kv_store``), starts the scheduler, and the
first rank of each host starts its server. Real processes, real sockets; the sums are
checked exactly. (With torch, torch's store is used: tests/torch/backend.)"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from typing import Dict, List

import pytest

WORKER = r"""
import sys
sys.modules["torch"] = None  # this process has no torch
import numpy as np, fastps
fastps.init()
r, n = fastps.rank(), fastps.size()
out = fastps.push_pull(np.full(5, r + 1.0, dtype=np.float64), average=False)
assert out.tolist() == [n * (n + 1) / 2] * 5, out
print(f"ok rank {r} of {n} local {fastps.local_rank()}/{fastps.local_size()} "
      f"servers {fastps.num_servers()}", flush=True)
fastps.shutdown()
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(n: int, extra: Dict[str, str], hosts: bool = False) -> List[subprocess.Popen]:
    port = _port()
    procs = []
    for r in range(n):
        env = dict(os.environ)
        env.pop("FASTPS_SCHEDULER_ADDR", None)
        env.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(r),
            WORLD_SIZE=str(n),
            FASTPS_TIMEOUT="30",
            PYTHONUNBUFFERED="1",
        )
        env.update(extra)
        if hosts:
            env["FASTPS_HOSTNAME"] = f"host{r}"
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", WORKER],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    return procs


def _finish(procs: List[subprocess.Popen], timeout: float = 90) -> List[str]:
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        outs.append(out)
    return outs


@pytest.mark.parametrize(
    "n,paths",
    [(2, {}), (3, {"FASTPS_SHM": "0"}), (3, "hosts")],
    ids=["2-shm", "3-tcp", "3-hosts"],
)
def test_job_forms_without_torch_and_sums_exactly(n: int, paths: object) -> None:
    """Every rank gets the exact sum; one host: one server, local ranks 0..n-1; every rank
    on its own emulated host: one server per host."""
    hosts = paths == "hosts"
    procs = _start(n, {} if hosts else dict(paths), hosts=hosts)  # type: ignore[arg-type]
    outs = _finish(procs)
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"rank {r}:\n{out[-3000:]}"
        assert f"ok rank {r} of {n}" in out, out
        assert f"servers {n if hosts else 1}" in out, out
        assert f"local {0 if hosts else r}/{1 if hosts else n}" in out, out


def test_bad_master_port_is_named() -> None:
    procs = _start(1, {"MASTER_PORT": "99999"})
    (out,) = _finish(procs, 30)
    assert procs[0].returncode != 0
    assert "MASTER_PORT" in out and "99999" in out, out


def test_missing_rank_times_out_naming_it() -> None:
    """WORLD_SIZE=2 but only rank 0 comes: rank 0 fails within FASTPS_TIMEOUT naming the
    rank whose host name never arrived (no hang)."""
    procs = _start(2, {"FASTPS_TIMEOUT": "3"})
    procs[1].kill()
    out0, _ = procs[0].communicate(timeout=60)
    procs[1].wait()
    assert procs[0].returncode != 0
    assert "fastps/host/1" in out0 and "did not arrive within 3 s" in out0, out0
