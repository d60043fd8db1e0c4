"""fastps under a real Open MPI ``mpirun`` (Debian's openmpi-bin; tests/envs/openmpi.sh):
the ranks take their numbers from OMPI_COMM_WORLD_RANK / _SIZE.

* the documented route (docs/guide/multi-node.md, "mpirun"): scheduler and server started by
  hand with ``python -m fastps``, the job's FASTPS_* variables passed with ``-x``;
* no role by hand: ``-x MASTER_ADDR -x MASTER_PORT``, and the ranks form the job through the
  store (rank 0 runs the scheduler, the first rank on the host a server);
* a rank that fails ends the run with a non-zero exit and no process of the job left.

Skipped when mpirun is missing (tests/envs/openmpi.sh installs it). Run as root: mpirun gets
``--allow-run-as-root`` when this process is root."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Dict, List

import pytest

ROOT = Path(__file__).resolve().parents[3]
DIGITS = "examples/torch/train_digits.py"
FAIL_RANK = str(Path(__file__).resolve().parent / "workers" / "fail_rank.py")
EPOCHS = "10"
RUN_WAIT_S = 180.0  # four ranks of digits on a busy 2-core machine
TAG_VAR = "FASTPS_OPENMPI_TEST_TAG"  # marks every process a test starts (found in /proc)

pytestmark = [
    pytest.mark.skipif(
        shutil.which("mpirun") is None,
        reason="Open MPI is not installed (no mpirun; tests/envs/openmpi.sh installs it)",
    ),
    pytest.mark.timeout(300),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _base_env(tag: str) -> Dict[str, str]:
    """This interpreter's python first on PATH, no variable of another job leaking in, and
    the tag that finds this test's processes."""
    drop = ("FASTPS_", "SLURM_", "OMPI_", "PMIX_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    for var in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(var, None)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONUNBUFFERED"] = "1"
    env["OMP_NUM_THREADS"] = "1"
    env[TAG_VAR] = tag
    return env


def _mpirun(np: int, exported: List[str], argv: List[str]) -> List[str]:
    cmd = ["mpirun", "--oversubscribe", "-np", str(np)]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    for var in ["PATH", "PYTHONUNBUFFERED", "OMP_NUM_THREADS", TAG_VAR, *exported]:
        cmd += ["-x", var]
    return cmd + ["python", *argv]


def _tagged(tag: str) -> Dict[int, str]:
    """Live processes (pid -> command line) with ``TAG_VAR=tag`` in their environment."""
    found: Dict[int, str] = {}
    mark = f"{TAG_VAR}={tag}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                if fh.read().rsplit(b")", 1)[-1].split()[0] == b"Z":
                    continue
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if mark not in fh.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        found[int(entry)] = cmd
    return found


def _no_process_left(tag: str, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    left = _tagged(tag)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = _tagged(tag)
    assert not left, f"processes left {within:g} s after the run: " + "; ".join(
        f"{pid}: {cmd[:160]}" for pid, cmd in sorted(left.items())
    )


def _run(cmd: List[str], env: Dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(
            cmd,
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
            start_new_session=True,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else ""
        pytest.fail(f"{' '.join(cmd[:6])} ... ran past {timeout:g} s:\n{out[-3000:]}")


def _accuracy(text: str, workers: int) -> float:
    m = re.search(
        rf"test accuracy: ([0-9.]+) \(\d+/450\) after {EPOCHS} epochs on {workers} ", text
    )
    assert m is not None, f"no accuracy line for {workers} workers in the output:\n{text[-3000:]}"
    return float(m.group(1))


def _stop(procs: List[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_mpirun_with_scheduler_and_server_started_by_hand() -> None:
    """docs/guide/multi-node.md "mpirun", on one machine: the scheduler and one server from
    ``python -m fastps``, four ranks from mpirun; scheduler and server exit 0 after."""
    tag = uuid.uuid4().hex
    env = _base_env(tag)
    job = {
        "FASTPS_JOB_ID": f"mpi{tag[:8]}",
        "FASTPS_NUM_WORKERS": "4",
        "FASTPS_NUM_SERVERS": "1",
        "FASTPS_SCHEDULER_ADDR": f"127.0.0.1:{_free_port()}",
        "FASTPS_TOKEN": secrets.token_hex(16),
    }
    env.update(job)
    roles = [
        subprocess.Popen(
            [sys.executable, "-m", "fastps"],
            env={**env, **extra},
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for extra in (
            {"FASTPS_ROLE": "scheduler"},
            {"FASTPS_ROLE": "server", "FASTPS_SERVER_ID": "0"},
        )
    ]
    try:
        res = _run(_mpirun(4, list(job), [DIGITS, "--epochs", EPOCHS]), env, RUN_WAIT_S)
        assert res.returncode == 0, f"mpirun exited {res.returncode}:\n{res.stdout[-3000:]}"
        assert _accuracy(res.stdout, 4) >= 0.95
        for proc, name in zip(roles, ("scheduler", "server")):
            out, _ = proc.communicate(timeout=60)
            assert proc.returncode == 0, f"the {name} exited {proc.returncode}:\n{out[-2000:]}"
    finally:
        _stop(roles)
    _no_process_left(tag)


def test_mpirun_forms_the_job_through_master_addr() -> None:
    """``mpirun -x MASTER_ADDR -x MASTER_PORT -np 2 python train.py``: nothing by hand (two
    ranks, not four, to keep the tier in CI's time on two cores)."""
    tag = uuid.uuid4().hex
    env = _base_env(tag)
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    cmd = _mpirun(2, ["MASTER_ADDR", "MASTER_PORT"], [DIGITS, "--epochs", EPOCHS])
    res = _run(cmd, env, RUN_WAIT_S)
    assert res.returncode == 0, f"mpirun exited {res.returncode}:\n{res.stdout[-3000:]}"
    assert _accuracy(res.stdout, 2) >= 0.95
    _no_process_left(tag)


def test_a_failing_rank_ends_the_run() -> None:
    """Rank 1 of 2 exits with 3 mid-job: mpirun ends rank 0 and exits non-zero; rank 0's
    scheduler and the server it started go with it."""
    tag = uuid.uuid4().hex
    env = _base_env(tag)
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    cmd = _mpirun(2, ["MASTER_ADDR", "MASTER_PORT"], [FAIL_RANK, "--fail-rank", "1"])
    started = time.monotonic()
    res = _run(cmd, env, RUN_WAIT_S)
    took = time.monotonic() - started
    assert "rank 0: first step done" in res.stdout, res.stdout[-3000:]  # the job had formed
    assert "rank 1: failing on purpose" in res.stdout, res.stdout[-3000:]
    assert res.returncode != 0, f"mpirun exited 0 although rank 1 failed:\n{res.stdout[-3000:]}"
    assert took < 120, f"the run took {took:.0f} s to end after rank 1 failed"
    _no_process_left(tag)
