"""fastpsrun with real processes: output, environment, failures, signals, cleanup."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import pytest

FASTPSRUN = [sys.executable, "-m", "fastps.launcher"]


def fastpsrun(
    args: List[str], env: Dict[str, str], timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*FASTPSRUN, *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def wait_gone(pids: List[int], timeout: float = 5.0) -> List[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def read_pids(folder: Path) -> List[int]:
    pids: List[int] = []
    for f in folder.glob("*.pids"):
        pids += [int(x) for x in f.read_text().split()]
    return pids


def core_available() -> bool:
    try:
        from fastps import _core  # type: ignore[attr-defined]  # noqa: F401
    except ImportError:
        return False
    return True


# A worker that uses the control plane the way the worker API does, from the env alone.
CONTROL_WORKER = r"""
from fastps.config import Config
from fastps.control import ControlClient
cfg = Config.from_env()
c = ControlClient(cfg.require_scheduler_addr(), cfg.job_id, cfg.token, cfg.timeout,
                  cfg.heartbeat_interval, cfg.heartbeat_timeout)
m = c.register("worker", cfg.rank, cfg.host, cfg.hostname, num_workers=cfg.num_workers,
               num_servers=cfg.num_servers)
c.barrier("start")
me = m.worker(cfg.rank)
print(f"rank={cfg.rank} size={len(m.workers)} local={me.local_rank}/{me.local_size} "
      f"servers={len(m.servers)} job={cfg.job_id}")
c.close()
"""

# Registers, records its pid and a grandchild's pid, then sleeps (rank 1 may fail).
SLEEPY_WORKER = r"""
import os, subprocess, sys, time
from fastps.config import Config
from fastps.control import ControlClient
cfg = Config.from_env()
c = ControlClient(cfg.require_scheduler_addr(), cfg.job_id, cfg.token, cfg.timeout,
                  cfg.heartbeat_interval, cfg.heartbeat_timeout)
c.register("worker", cfg.rank, cfg.host, cfg.hostname)
grandchild = subprocess.Popen(["sleep", "60"])
with open(os.path.join(sys.argv[1], f"{cfg.rank}.pids"), "w") as f:
    f.write(f"{os.getpid()} {grandchild.pid}")
c.barrier("pids-written")
print("ready", flush=True)
mode = sys.argv[2]
if mode == "fail" and cfg.rank == 1:
    sys.exit(3)
if mode == "kill" and cfg.rank == 1:
    os.kill(os.getpid(), 9)
time.sleep(60)
"""


def test_output_is_prefixed_and_env_is_set(subprocess_env: Dict[str, str]) -> None:
    script = (
        "import os, sys; r = os.environ['FASTPS_RANK']; print('hello from', r); "
        "print('hvd', *(os.environ['HOROVOD_' + k] for k in ('RANK', 'SIZE', 'LOCAL_RANK', "
        "'LOCAL_SIZE', 'CROSS_RANK', 'CROSS_SIZE'))); "
        "print('warn', r, file=sys.stderr); sys.stdout.write('no newline ' + r)"
    )
    args = ["-np", "2", "--num-servers", "0", sys.executable, "-c", script]
    proc = fastpsrun(args, subprocess_env)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    for r in (0, 1):
        assert f"[worker {r}] hello from {r}" in out
        assert f"[worker {r}] hvd {r} 2 {r} 2 0 1" in out  # Horovod's variables too
        assert f"[worker {r}] no newline {r}" in out
        assert f"[worker {r}] warn {r}" in proc.stderr.splitlines()


def test_workers_rendezvous_through_embedded_scheduler(subprocess_env: Dict[str, str]) -> None:
    proc = fastpsrun(
        ["-np", "3", "--num-servers", "0", "--job-id", "jtest"]
        + [sys.executable, "-c", CONTROL_WORKER],
        subprocess_env,
    )
    assert proc.returncode == 0, proc.stderr
    for r in range(3):
        assert f"[worker {r}] rank={r} size=3 local={r}/3 servers=0 job=jtest" in proc.stdout


def test_command_arguments_pass_through(subprocess_env: Dict[str, str]) -> None:
    proc = fastpsrun(
        ["-np", "1", "--num-servers", "0", sys.executable, "-c", "import sys; print(sys.argv[1:])",
         "-np", "--lr", "0.1"],
        subprocess_env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "[worker 0] ['-np', '--lr', '0.1']" in proc.stdout


@pytest.mark.parametrize(
    ("mode", "message", "code"),
    [("fail", "exited with code 3", 3), ("kill", "killed by SIGKILL", 137)],
)
def test_failing_worker_stops_the_job(
    subprocess_env: Dict[str, str], tmp_path: Path, mode: str, message: str, code: int
) -> None:
    t0 = time.monotonic()
    proc = fastpsrun(
        ["-np", "3", "--num-servers", "0"]
        + [sys.executable, "-c", SLEEPY_WORKER, str(tmp_path), mode],
        subprocess_env,
    )
    assert time.monotonic() - t0 < 20
    assert proc.returncode == code, proc.stderr
    pid1 = int((tmp_path / "1.pids").read_text().split()[0])
    assert f"fastpsrun: worker 1 (pid {pid1}) {message}" in proc.stderr
    pids = read_pids(tmp_path)
    assert len(pids) == 6
    assert wait_gone(pids) == []


def test_ctrl_c_leaves_nothing_behind(subprocess_env: Dict[str, str], tmp_path: Path) -> None:
    job = f"ctrlc{os.getpid()}"
    shm = Path(f"/dev/shm/fastps-{job}-test")
    proc = subprocess.Popen(
        [*FASTPSRUN, "-np", "2", "--num-servers", "0", "--job-id", job,
         sys.executable, "-c", SLEEPY_WORKER, str(tmp_path), "sleep"],
        env=subprocess_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        for _ in range(2):
            assert proc.stdout.readline().startswith("[worker ")  # "ready" after the barrier
        if shm.parent.is_dir():
            shm.write_bytes(b"x")
        pids = read_pids(tmp_path)
        assert len(pids) == 4 and all(alive(p) for p in pids)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
        assert proc.returncode == 130, err
        assert "fastpsrun: received SIGINT" in err
        assert wait_gone(pids) == []
        assert not shm.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_bad_command_and_bad_options(subprocess_env: Dict[str, str]) -> None:
    proc = fastpsrun(["-np", "2", "--num-servers", "0", "/nonexistent/cmd"], subprocess_env)
    assert proc.returncode == 127
    assert "cannot start" in proc.stderr
    proc = fastpsrun(["-np", "0", "true"], subprocess_env)
    assert proc.returncode == 2
    proc = fastpsrun(["-np", "1", "--job-id", "a/b", "true"], subprocess_env)
    assert proc.returncode == 2 and "--job-id" in proc.stderr


@pytest.mark.skipif(not core_available(), reason="C++ core fastps._core not built")
def test_servers_start_and_shut_down(subprocess_env: Dict[str, str]) -> None:
    proc = fastpsrun(
        ["-np", "2", "--num-servers", "2", sys.executable, "-c", CONTROL_WORKER], subprocess_env
    )
    assert proc.returncode == 0, proc.stderr
    assert "servers=2" in proc.stdout


@pytest.mark.skipif(not core_available(), reason="C++ core fastps._core not built")
def test_killed_server_stops_the_job(subprocess_env: Dict[str, str], tmp_path: Path) -> None:
    script = SLEEPY_WORKER.replace(
        'c.register("worker", cfg.rank, cfg.host, cfg.hostname)',
        'm = c.register("worker", cfg.rank, cfg.host, cfg.hostname)\n'
        "if cfg.rank == 0:\n"
        "    os.kill(m.servers[0].pid, 9)",
    )
    proc = fastpsrun(
        ["-np", "2", "--num-servers", "1", sys.executable, "-c", script, str(tmp_path), "sleep"],
        subprocess_env,
    )
    assert proc.returncode == 137
    assert "fastpsrun: server 0 (pid" in proc.stderr and "killed by SIGKILL" in proc.stderr
    assert wait_gone(read_pids(tmp_path)) == []


def test_process_ignoring_sigterm_is_killed(subprocess_env: Dict[str, str], tmp_path: Path) -> None:
    script = (
        f'trap "" TERM; echo $$ > {tmp_path}/w$FASTPS_RANK.pids; '
        'if [ "$FASTPS_RANK" = 1 ]; then sleep 0.5; exit 3; fi; exec sleep 60'
    )
    t0 = time.monotonic()
    proc = fastpsrun(["-np", "2", "--num-servers", "0", "sh", "-c", script], subprocess_env)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 3, proc.stderr
    assert "worker 1 (pid" in proc.stderr and "exited with code 3" in proc.stderr
    assert 4.5 < elapsed < 15  # SIGTERM ignored: SIGKILL after the 5 s grace
    assert wait_gone(read_pids(tmp_path)) == []
