"""fastps under a real SLURM (Debian's slurm-wlm: slurmctld and slurmd on this machine, one
node with its cores, started by tests/envs/slurm.sh): ``sbatch`` and ``salloc`` with
``fastpsrun`` inside the allocation (every process an ``srun`` step, SrunTransport),
``srun -n 2`` steps forming the job themselves through MASTER_ADDR/MASTER_PORT, and
``scancel`` of a running job leaving no process of it behind. Skipped when SLURM is not
installed or its node does not answer (run tests/envs/slurm.sh first; tests/run.sh does)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Callable, Dict, List, Optional, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[3]
DIGITS = "examples/torch/train_digits.py"
EPOCHS = "10"
JOB_WAIT_S = 150.0  # a whole digits job through SLURM, on a busy 2-core machine


def _cluster_state() -> Tuple[bool, str]:
    if shutil.which("sinfo") is None:
        return False, "SLURM is not installed (no sinfo; tests/envs/slurm.sh installs it)"
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%t"], capture_output=True, text=True, timeout=15
        )
    except subprocess.TimeoutExpired:
        return False, "sinfo did not answer within 15 s (slurmctld down?)"
    states = out.stdout.split()
    if out.returncode != 0 or not any(s in ("idle", "mix", "alloc") for s in states):
        why = (out.stderr.strip().splitlines() or [f"node states {states}"])[-1]
        return False, f"no SLURM node takes jobs (run tests/envs/slurm.sh): {why}"
    return True, ""


_OK, _WHY = _cluster_state()
pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(not _OK, reason=_WHY),
    pytest.mark.timeout(300),
]


def _job_env() -> Dict[str, str]:
    """The environment sbatch/salloc pass on (--export=ALL): this interpreter's python and
    fastpsrun first on PATH, no variable of another job leaking in."""
    drop = ("FASTPS_", "SLURM_", "OMPI_", "PMIX_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    for var in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(var, None)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bindir, env.get("PATH", "")])
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _fastpsrun() -> str:
    path = Path(sys.executable).parent / "fastpsrun"
    if not path.exists():
        pytest.fail(f"no fastpsrun next to {sys.executable} (pip install -e . first)")
    return str(path)


def _name() -> str:
    return f"fastps-test-{uuid.uuid4().hex[:8]}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _squeue(*args: str) -> List[str]:
    out = subprocess.run(["squeue", "-h", *args], capture_output=True, text=True, timeout=15)
    return out.stdout.split()


def _job_id(name: str, deadline: float) -> str:
    """The id of the job named ``name`` once slurmctld lists it."""
    while time.monotonic() < deadline:
        ids = _squeue("-n", name, "-o", "%i")
        if ids:
            return ids[0]
        time.sleep(0.2)
    pytest.fail(f"SLURM job {name} never appeared in squeue")


def _steps(job_id: str) -> Set[str]:
    """The job's running srun steps (``<job>.<n>``)."""
    return {s for s in _squeue("-s", "-j", job_id, "-o", "%i") if re.fullmatch(r"\d+\.\d+", s)}


def _job_fields(job_id: str) -> Dict[str, str]:
    """``scontrol show job``'s Key=Value fields (kept MinJobAge s after the end)."""
    out = subprocess.run(
        ["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, timeout=15
    )
    return dict(f.split("=", 1) for f in out.stdout.split() if "=" in f)


def _processes_with(var: str, value: str) -> Dict[int, str]:
    """Live processes (pid -> command line) whose environment has ``var=value``."""
    found: Dict[int, str] = {}
    mark = f"{var}={value}".encode()
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
            continue  # gone meanwhile, or a kernel thread
        found[int(entry)] = cmd
    return found


def _job_processes(job_id: str) -> Dict[int, str]:
    """Live processes started for SLURM job ``job_id``: every step's processes and what
    they start carry SLURM_JOB_ID in their environment."""
    return _processes_with("SLURM_JOB_ID", job_id)


def _fastps_job_ids(pids: Set[int]) -> Set[str]:
    """The FASTPS_JOB_ID values in these processes' environments."""
    ids: Set[str] = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                for item in fh.read().split(b"\0"):
                    if item.startswith(b"FASTPS_JOB_ID="):
                        ids.add(item.split(b"=", 1)[1].decode())
        except OSError:
            continue
    return ids


def _no_process_left(job_id: str, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    left = _job_processes(job_id)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = _job_processes(job_id)
    assert not left, f"SLURM job {job_id} left processes running after {within:g} s: " + "; ".join(
        f"{pid}: {cmd[:160]}" for pid, cmd in sorted(left.items())
    )


def _wait_job(job_id: str, timeout: float, steps: Optional[Set[str]] = None) -> Dict[str, str]:
    """Waits until job ``job_id`` left the queue (recording its srun steps in ``steps``);
    returns its final fields. Cancels it and fails when it runs past ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if steps is not None:
            steps |= _steps(job_id)
        fields = _job_fields(job_id)
        if fields.get("JobState") not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            return fields
        time.sleep(0.3)
    subprocess.run(["scancel", job_id], timeout=15)
    pytest.fail(f"SLURM job {job_id} still running after {timeout:g} s (cancelled)")


def _accuracy(text: str, workers: int) -> float:
    m = re.search(
        rf"test accuracy: ([0-9.]+) \(\d+/450\) after {EPOCHS} epochs on {workers} ", text
    )
    assert m is not None, f"no accuracy line for {workers} workers in the output:\n{text[-3000:]}"
    return float(m.group(1))


def _sbatch(tmp_path: Path, name: str, body: str, ntasks: int = 2) -> Tuple[str, Path]:
    out = tmp_path / f"{name}.out"
    script = tmp_path / f"{name}.sh"
    script.write_text(
        "#!/bin/bash\n"
        f"#SBATCH --job-name={name}\n#SBATCH --ntasks={ntasks}\n#SBATCH --time=5\n"
        f"#SBATCH --output={out}\n"
        f"cd {ROOT}\n{body}\n"
    )
    res = subprocess.run(
        ["sbatch", "--parsable", str(script)],
        capture_output=True,
        text=True,
        env=_job_env(),
        timeout=30,
    )
    assert res.returncode == 0, f"sbatch failed: {res.stderr}"
    return res.stdout.strip().split(";")[0], out


def _wait_for_output(job_id: str, out: Path, seen: Callable[[str], bool], what: str) -> None:
    """Waits until the job's output shows ``seen``; fails (cancelling the job) if it ended
    first or did not get there within JOB_WAIT_S, saying it did not ``what``."""
    deadline = time.monotonic() + JOB_WAIT_S
    while not seen(out.read_text() if out.exists() else ""):
        state = _job_fields(job_id).get("JobState")
        if state not in ("PENDING", "RUNNING", "CONFIGURING"):
            pytest.fail(f"job {job_id} ended ({state}) before it did {what}:\n{out.read_text()}")
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job_id], timeout=15)
            pytest.fail(f"job {job_id} did not {what} within {JOB_WAIT_S:g} s")
        time.sleep(0.3)


def _scancel_leaves_nothing(job_id: str, fastps_jobs: Set[str]) -> None:
    """scancel: the job ends CANCELLED and no process of it is left, nor any process of
    its fastps jobs that lost SLURM's variables (a stray)."""
    subprocess.run(["scancel", job_id], check=True, timeout=15)
    fields = _wait_job(job_id, 60.0)
    assert fields.get("JobState") == "CANCELLED", f"job {job_id}: {fields}"
    _no_process_left(job_id, within=30.0)
    for fastps_job in fastps_jobs:
        left = _processes_with("FASTPS_JOB_ID", fastps_job)
        assert not left, f"fastps job {fastps_job} left processes: {left}"


def test_sbatch_fastpsrun_uses_the_allocation(tmp_path: Path) -> None:
    """A batch script runs ``fastpsrun -np 2``: it takes the allocation's node and slots
    and starts its processes as srun steps of the job; the job completes with exit 0."""
    name = _name()
    job_id, out = _sbatch(tmp_path, name, f"{_fastpsrun()} -np 2 python {DIGITS} --epochs {EPOCHS}")
    steps: Set[str] = set()
    fields = _wait_job(job_id, JOB_WAIT_S, steps)
    text = out.read_text() if out.exists() else ""
    assert fields.get("JobState") == "COMPLETED", f"job {job_id}: {fields}\n{text[-3000:]}"
    assert fields.get("ExitCode") == "0:0", f"job {job_id}: {fields}\n{text[-3000:]}"
    assert _accuracy(text, 2) >= 0.95
    # fastpsrun started every process (a preflight check, workers, server) as srun steps.
    assert steps, f"no srun step of job {job_id} was seen while it ran:\n{text[-3000:]}"
    _no_process_left(job_id)


def test_salloc_fastpsrun(tmp_path: Path) -> None:
    name = _name()
    cmd = ["salloc", "-n", "2", "-J", name, "-t", "5"]
    cmd += [_fastpsrun(), "-np", "2", "python", DIGITS, "--epochs", EPOCHS]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=_job_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        job_id = _job_id(name, time.monotonic() + 60)
        steps: Set[str] = set()
        _wait_job(job_id, JOB_WAIT_S, steps)
        text, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert f"Granted job allocation {job_id}" in text, text[-3000:]
    assert proc.returncode == 0, f"salloc exited {proc.returncode}:\n{text[-3000:]}"
    assert _accuracy(text, 2) >= 0.95
    assert steps, f"no srun step of job {job_id} was seen while it ran:\n{text[-3000:]}"
    _no_process_left(job_id)


def test_srun_steps_form_the_job_without_fastpsrun(tmp_path: Path) -> None:
    """``srun -n 2 python train.py`` with MASTER_ADDR/MASTER_PORT: ranks from SLURM_PROCID and
    SLURM_NTASKS, rank 0 runs the scheduler, the first rank on the node a server
    (fastps.launch.store_rendezvous); no role started by hand."""
    name = _name()
    port = _free_port()
    step = (
        f"MASTER_ADDR=127.0.0.1 MASTER_PORT={port} srun -n 2 --kill-on-bad-exit=1 "
        f"python {DIGITS} --epochs {EPOCHS}"
    )
    job_id, out = _sbatch(tmp_path, name, step)
    fields = _wait_job(job_id, JOB_WAIT_S)
    text = out.read_text() if out.exists() else ""
    assert fields.get("JobState") == "COMPLETED", f"job {job_id}: {fields}\n{text[-3000:]}"
    assert fields.get("ExitCode") == "0:0", f"job {job_id}: {fields}\n{text[-3000:]}"
    assert _accuracy(text, 2) >= 0.95
    _no_process_left(job_id)


def test_scancel_leaves_nothing_running(tmp_path: Path) -> None:
    """A job cancelled while fastpsrun trains in it: slurmd signals every step; no scheduler,
    server, worker or agent of it is left."""
    name = _name()
    job_id, out = _sbatch(
        tmp_path, name, f"{_fastpsrun()} -np 2 python {DIGITS} --epochs 100000 --min-accuracy 0"
    )
    # Training runs (rank 0 printed an epoch), so every process of the job is up.
    _wait_for_output(job_id, out, lambda text: "train loss" in text, "start training")
    running = _job_processes(job_id)
    kinds = " ".join(running.values())
    # The /proc scan sees the job: workers (the script), and the agents srun started.
    assert DIGITS in kinds and "fastps" in kinds, f"job {job_id}'s processes: {running}"
    assert len(running) >= 4, f"job {job_id}'s processes: {running}"
    fastps_jobs = _fastps_job_ids(set(running))
    assert fastps_jobs, f"no FASTPS_JOB_ID in job {job_id}'s processes: {running}"
    _scancel_leaves_nothing(job_id, fastps_jobs)
