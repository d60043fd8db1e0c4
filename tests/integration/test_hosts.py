"""Whole ``fastpsrun -H`` / SLURM jobs through stand-in ``ssh`` and ``srun`` clients that
start the remote side on this machine (the real thing over sshd is
tests/rack/test_multihost.py; host lists, placement, SLURM allocations and the ssh/srun
command lines as pure functions: tests/unit/test_host_lists.py).

Addresses 127.0.0.2/127.0.0.3 are not this machine's interface addresses, so fastpsrun
treats them as other machines and goes through the transport; the stand-in ``ssh`` runs the
remote command with ``sh -c`` here, as sshd would there, and records its arguments.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Dict, List

import pytest

# ------------------------------------------------------------------ parsing and placement


# ------------------------------------------------------------------ whole jobs, stand-ins

FAKE_SSH = r"""#!/bin/sh
# Stand-in for ssh: records its arguments, then runs the remote command here.
printf '%s\n' "$*" >> "$FAKE_LOG"
while [ $# -gt 0 ]; do
  case "$1" in
    -o|-p|-i|-l) shift 2 ;;
    --) shift; break ;;
    -*) shift ;;
    *) break ;;
  esac
done
host=$1; shift
if [ "$host" = "127.0.0.9" ]; then
  echo "ssh: connect to host $host port 22: Connection refused" >&2; exit 255
fi
export SSH_CONNECTION="127.0.0.1 40000 $host 22"
exec sh -c "$*"
"""

FAKE_SRUN = r"""#!/bin/sh
# Stand-in for srun: records its arguments, drops its options, runs the task here.
printf '%s\n' "$*" >> "$FAKE_LOG"
while [ $# -gt 0 ]; do case "$1" in --*) shift ;; *) break ;; esac; done
exec "$@"
"""

WORKER = textwrap.dedent("""
    import os, subprocess, sys, time
    import numpy as np
    import fastps
    fastps.init()
    r, n = fastps.rank(), fastps.size()
    x = np.full(1000, r + 1, dtype=np.float32)
    x = fastps.push_pull(x, average=False, name="x")
    assert np.all(x == n * (n + 1) / 2), x[:4]
    print(f"rank {r} ok var={os.environ.get('FAKE_JOB_VAR')}", flush=True)
    if len(sys.argv) > 1:
        subprocess.Popen(["sleep", "300"], start_new_session=True)  # a stray
        print(f"ready {r}", flush=True)
        if r == int(sys.argv[1]):
            time.sleep(0.5)
            sys.exit(4)
        time.sleep(300)
    fastps.shutdown()
""")


@pytest.fixture
def fake_bin(tmp_path: Path, subprocess_env: Dict[str, str]) -> Dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("ssh", FAKE_SSH), ("srun", FAKE_SRUN)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = dict(subprocess_env)
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        FAKE_LOG=str(tmp_path / "client.log"),
        FAKE_JOB_VAR="forwarded",
        OMP_WAIT_POLICY="PASSIVE",
    )
    return env


def _fastpsrun(args: List[str], env: Dict[str, str], timeout: float = 120):
    return subprocess.run(
        [sys.executable, "-m", "fastps.launcher", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )


def _job_processes(job_id: str) -> List[int]:
    mark = f"FASTPS_JOB_ID={job_id}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                if mark in fh.read().split(b"\0"):
                    found.append(int(name))
        except OSError:
            pass
    return found


@pytest.mark.timeout(180)
def test_job_over_ssh_stand_in(fake_bin: Dict[str, str]) -> None:
    res = _fastpsrun(
        [
            "-np",
            "3",
            "-H",
            "localhost:1,127.0.0.2:1,127.0.0.3:1",
            "--job-id",
            "hoststest1",
            sys.executable,
            "-c",
            WORKER,
        ],
        fake_bin,
    )
    assert res.returncode == 0, res.stdout
    out = res.stdout
    assert (
        "scheduler at 127.0.0.1; localhost: worker 0, server 0; 127.0.0.2: worker 1, "
        "server 1; 127.0.0.3: worker 2, server 2" in out
    ), out
    for rank, host in ((0, "localhost"), (1, "127.0.0.2"), (2, "127.0.0.3")):
        assert f"[worker {rank}@{host}] rank {rank} ok var=forwarded" in out, out
    calls = Path(fake_bin["FAKE_LOG"]).read_text()
    # Checks, 2 workers + 2 servers, sweeps: only the two remote hosts, never the token.
    assert calls.count("127.0.0.2 exec") == 4 and calls.count("127.0.0.3 exec") == 4, calls
    assert "FASTPS_TOKEN" not in calls and not re.search(r"[0-9a-f]{32}", calls), calls


@pytest.mark.timeout(180)
def test_failure_over_ssh_stand_in_leaves_nothing(fake_bin: Dict[str, str]) -> None:
    t0 = time.monotonic()
    hostfile = Path(fake_bin["FAKE_LOG"]).with_name("hostfile")
    hostfile.write_text("localhost slots=1\n127.0.0.2 slots=2  # MPI's format\n")
    res = _fastpsrun(
        [
            "-np",
            "3",
            "--hostfile",
            str(hostfile),
            "--job-id",
            "hoststest2",
            sys.executable,
            "-c",
            WORKER,
            "2",
        ],
        fake_bin,
    )
    assert res.returncode == 4, res.stdout
    assert "fastpsrun: worker 2@127.0.0.2" in res.stdout and "exited with code 4" in res.stdout, (
        res.stdout
    )
    assert time.monotonic() - t0 < 90
    # Strays that left their process groups are gone too (the sweep by job id).
    assert _job_processes("hoststest2") == []


def test_cli_refuses_contradictions(subprocess_env: Dict[str, str]) -> None:
    for args, words in (
        (["-H", "a:1", "--hostfile", "f"], "give -H or --hostfile, not both"),
        (["--server-hosts", "c1"], "--server-hosts needs -H, --hostfile"),
        (["-H", "a:1,b:1", "-np", "3"], "-np 3 needs 3 slots"),
    ):
        np_args = [] if "-np" in args else ["-np", "1"]
        res = _fastpsrun([*np_args, *args, "true"], subprocess_env, timeout=30)
        assert res.returncode == 2 and words in res.stdout, res.stdout


@pytest.mark.timeout(60)
def test_unreachable_host_stand_in(fake_bin: Dict[str, str]) -> None:
    res = _fastpsrun(
        ["-np", "2", "-H", "localhost:1,127.0.0.9:1", sys.executable, "-c", "pass"], fake_bin
    )
    assert res.returncode == 1, res.stdout
    assert (
        "host 127.0.0.9: ssh failed: ssh: connect to host 127.0.0.9 port 22: Connection "
        "refused" in res.stdout
    ), res.stdout


@pytest.mark.timeout(180)
def test_job_in_slurm_allocation_through_srun_stand_in(fake_bin: Dict[str, str]) -> None:
    env = dict(
        fake_bin, SLURM_JOB_NODELIST="node[1-2]", SLURM_TASKS_PER_NODE="2,1", SLURM_JOB_ID="77"
    )
    res = _fastpsrun(
        [
            "-np",
            "3",
            "--network-interface",
            "lo",
            "--job-id",
            "hoststest3",
            sys.executable,
            "-c",
            WORKER,
        ],
        env,
    )
    assert res.returncode == 0, res.stdout
    assert "node1: workers 0-1, server 0; node2: worker 2, server 1" in res.stdout, res.stdout
    for rank, host in ((0, "node1"), (1, "node1"), (2, "node2")):
        assert f"[worker {rank}@{host}] rank {rank} ok var=forwarded" in res.stdout
    calls = Path(env["FAKE_LOG"]).read_text().splitlines()
    # Every process is a one-task srun step on its node, sharing the node's CPUs.
    steps = [c for c in calls if "--nodelist=node1" in c]
    assert steps and all("--nodes=1 --ntasks=1" in c and "--overlap" in c for c in steps)
    assert not any("FASTPS_TOKEN" in c for c in calls)
    assert _job_processes("hoststest3") == []
