"""``hvd.init()`` of fastps.mxnet started by a launcher that sets only MASTER_ADDR,
MASTER_PORT, RANK and WORLD_SIZE (a SLURM script, a Kubernetes job): no fastpsrun, and no
torch in this environment, so rank 0 serves fastps's own rendezvous store. Two real
processes; the allreduce is checked exactly."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from mxnet_jobs import require_mxnet

require_mxnet()

WORKER = r"""
import mxnet as mx
import fastps.mxnet as hvd
hvd.init()
r, n = hvd.rank(), hvd.size()
out = hvd.allreduce(mx.nd.array([r + 1.0, 2.0 * r]), average=False, name="x")
assert out.asnumpy().tolist() == [3.0, 2.0], out
print(f"ok rank {r} of {n}", flush=True)
hvd.shutdown()
"""


def test_mxnet_init_from_master_variables() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(2):
        env = dict(os.environ)
        env.pop("FASTPS_SCHEDULER_ADDR", None)
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), WORLD_SIZE="2")
        env.update(FASTPS_TIMEOUT="60", PYTHONUNBUFFERED="1")
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", WORKER],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    for r, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        assert p.returncode == 0, f"rank {r}:\n{out[-3000:]}"
        assert f"ok rank {r} of 2" in out, out
