"""Multi-process tests of the core: real scheduler, servers, workers and sockets."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from jobs import DATA_PATHS, WORKERS, Job

CORE_WORKER = os.path.join(WORKERS, "core_worker.py")
FAULT_WORKER = os.path.join(WORKERS, "fault_worker.py")


def fastpsrun(n: int, k: int, *args: str, partition: str = "64K", timeout: float = 240):
    cmd = [
        sys.executable,
        "-m",
        "fastps.launcher",
        "-np",
        str(n),
        "--num-servers",
        str(k),
        "--partition-bytes",
        partition,
        sys.executable,
        CORE_WORKER,
        *args,
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    assert p.stdout.count(" OK ") == n, p.stdout[-4000:]
    return p


LAYOUTS = [(1, 1), (2, 1), (2, 2), (4, 1), (4, 2)]
# The default suite runs every path on three layouts; the rest are marked slow.
FAST_LAYOUTS = {(1, 1), (2, 2), (4, 2)}


def _path_stats(out: str) -> dict:
    m = re.search(r"STATS (.*)", out)
    assert m, out
    return json.loads(m.group(1))


def _check_path_taken(path: str, rank: int, n: int, server_hosts: list, me: str, s: dict) -> None:
    """Fails unless worker ``rank``'s parts went the way ``path`` says."""
    pushed = s["pushed_shm"] + s["pushed_socket"]
    if path == "local" and n > 1:
        # One host: the local sum is the total, nothing goes to a server.
        assert s["local_reduce"] and pushed == 0, (path, rank, s)
        assert s["reduced_locally"] > 0 and s["contributed_shm"] > 0, (path, rank, s)
        return
    assert not s["local_reduce"] and s["reduced_locally"] == 0, (path, rank, s)
    colocated = me in server_hosts
    if path == "tcp" or not colocated:
        assert s["pushed_shm"] == 0 and s["pushed_socket"] > 0, (path, rank, s)
    elif all(h == me for h in server_hosts):
        assert s["pushed_shm"] > 0 and s["pushed_socket"] == 0, (path, rank, s)
    else:
        assert s["pushed_shm"] > 0 and s["pushed_socket"] > 0, (path, rank, s)


@pytest.mark.parametrize("path", list(DATA_PATHS))
@pytest.mark.parametrize(
    "n,k",
    [
        pytest.param(n, k, marks=[] if (n, k) in FAST_LAYOUTS else [pytest.mark.slow])
        for n, k in LAYOUTS
    ],
)
def test_every_dtype_and_size(n: int, k: int, path: str) -> None:
    run_on_path(path, n, k, "matrix", "2")


def run_on_path(path: str, n: int, k: int, *args: str) -> None:
    """Runs core_worker.py ``args`` with n workers and k servers laid out for ``path``;
    checks every worker's sums and that its parts took that path."""
    shm, worker_hosts, server_hosts = DATA_PATHS[path](n, k)
    env = {"FASTPS_SHM": shm, "FASTPS_PARTITION_BYTES": "64K"}
    with Job(
        n, k, [CORE_WORKER, *args], worker_hosts=worker_hosts, server_hosts=server_hosts, env=env
    ) as job:
        job.wait(180, job.workers())
        for w in job.workers():
            assert w.popen.returncode == 0 and f" OK {args[0]}" in w.output, job.dump()
            _check_path_taken(
                path, w.index, n, server_hosts, worker_hosts[w.index], _path_stats(w.output)
            )
        job.wait(30)


def test_one_hundred_iterations_changing_values() -> None:
    fastpsrun(2, 2, "matrix", "100")


def test_thousand_tensors_per_iteration() -> None:
    fastpsrun(2, 2, "many", "5", "1000", partition="4M")


@pytest.mark.parametrize(
    "n,k,path",
    [(2, 1, path) for path in DATA_PATHS] + [pytest.param(4, 2, "local", marks=pytest.mark.slow)],
)
def test_async_handles_out_of_order_and_broadcast(n: int, k: int, path: str) -> None:
    run_on_path(path, n, k, "order")


@pytest.mark.parametrize("n,k", [(2, 1), (2, 2)])
def test_name_reused_with_a_different_number_of_parts(n: int, k: int) -> None:
    fastpsrun(n, k, "regrow", partition="1M")


def _errors(job: Job):
    seen = {}
    for w in job.workers():
        m = re.search(r"ERROR-SEEN ([\d.]+) (.*)", w.output)
        assert m, f"worker {w.index} did not report an error:\n" + job.dump()
        seen[w.index] = (float(m.group(1)), m.group(2))
    return seen


def test_shape_mismatch_names_tensor_and_both_shapes() -> None:
    with Job(2, 1, [FAULT_WORKER, "shape"]) as job:
        job.wait(30, job.workers())
        for rank, (secs, msg) in _errors(job).items():
            assert secs < 10, (rank, secs, msg)
            assert msg.startswith("FastPSAbort: "), msg
            assert "fc.weight" in msg and "[10, 3]" in msg and "[10, 4]" in msg, msg


def test_dtype_mismatch_names_tensor_and_both_dtypes() -> None:
    with Job(2, 2, [FAULT_WORKER, "dtype"]) as job:
        job.wait(30, job.workers())
        for rank, (secs, msg) in _errors(job).items():
            assert secs < 10, (rank, secs, msg)
            assert msg.startswith("FastPSAbort: "), msg
            assert "bias" in msg and "float32" in msg and "float64" in msg, msg


def test_killed_worker_is_named_by_every_survivor() -> None:
    with Job(3, 2, [FAULT_WORKER, "kill-worker"]) as job:
        job.wait(45, [job.proc("worker", 0), job.proc("worker", 2)])
        for rank in (0, 2):
            out = job.proc("worker", rank).output
            m = re.search(r"ERROR-SEEN ([\d.]+) (.*)", out)
            assert m, job.dump()
            assert float(m.group(1)) < 30 and "worker 1" in m.group(2), m.group(0)
            assert m.group(2).startswith("FastPSAbort: "), m.group(0)
        job.wait(30)  # servers exit too
        for s in (0, 1):
            assert job.proc("server", s).popen.returncode != 0


def test_killed_server_is_named_by_every_worker() -> None:
    with Job(2, 2, [FAULT_WORKER, "kill-server"]) as job:
        job.wait(45, job.workers())
        for rank, (secs, msg) in _errors(job).items():
            assert secs < 30 and "server 0" in msg, (rank, secs, msg)
            assert msg.startswith("FastPSAbort: "), msg
        job.wait(30)


def test_operation_timeout_is_a_timeout_error_naming_the_tensor() -> None:
    with Job(2, 1, [FAULT_WORKER, "op-timeout"]) as job:
        job.wait(45, job.workers())
        out = job.proc("worker", 0).output
        m = re.search(r"ERROR-SEEN ([\d.]+) (.*)", out)
        assert m, job.dump()
        msg = m.group(2)
        assert msg.startswith("FastPSTimeoutError: "), msg
        assert "'lonely'" in msg and "did not complete within 1.5 s" in msg, msg


def test_bad_token_and_garbage_are_refused_and_the_job_goes_on() -> None:
    with Job(2, 1, [FAULT_WORKER, "hostile"]) as job:
        job.wait(60)
        for w in job.workers():
            assert w.popen.returncode == 0 and "HOSTILE-OK" in w.output, job.dump()
        server_log = job.proc("server", 0).output
        assert server_log.count("refused connection") >= 2, server_log
