"""Runs a digits example (examples/<framework>/) as its users launch it, with or without
quorum rounds (FASTPS_ROUND_QUORUM, docs/guide/async.md), on one of tests/jobs.py's data paths;
returns rank 0's test accuracy. Shared by the torch, TensorFlow and MXNet quorum tests,
which check that a fixed-length training loop, the loop every Horovod script has, trains
under quorum rounds as it does without them (a worker that caught up on rounds used to end
its loop with rounds nobody else pushed, and the job hung)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from jobs import DATA_PATHS, Job

REPO = Path(__file__).resolve().parent.parent
ACCURACY = re.compile(r"test accuracy: ([0-9.]+)")


def run_digits(
    script: str,
    args: Sequence[str],
    path: str,
    n: int,
    quorum: Optional[int],
    servers: int = 1,
    timeout: float = 240.0,
    env: Optional[Dict[str, str]] = None,
) -> Tuple[float, str]:
    """Trains ``examples/<script>`` on ``n`` workers and ``servers`` servers over ``path``
    (``quorum``: FASTPS_ROUND_QUORUM, None for plain rounds); returns rank 0's test accuracy
    and the job's output. Fails the calling test when a process fails or it times out."""
    shm, worker_hosts, server_hosts = DATA_PATHS[path](n, servers)
    full_env = {"FASTPS_SHM": shm, "FASTPS_STALL_WARNING_S": "20", **(env or {})}
    if quorum is not None:
        full_env["FASTPS_ROUND_QUORUM"] = str(quorum)
    argv: List[str] = [str(REPO / "examples" / script), *args]
    with Job(
        n, servers, argv, env=full_env, worker_hosts=worker_hosts, server_hosts=server_hosts
    ) as job:
        job.wait(timeout, job.workers())
        for w in job.workers():
            assert w.popen.returncode == 0, f"worker {w.index} failed:\n{job.dump()[-6000:]}"
        out = job.proc("worker", 0).output
    found = ACCURACY.search(out)
    assert found, f"rank 0 printed no test accuracy:\n{out[-3000:]}"
    return float(found.group(1)), out
