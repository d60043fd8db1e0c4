"""Host lists, placement, SLURM allocations and the ssh/srun command lines (pure functions),
plus whole ``fastpsrun -H`` / SLURM jobs through stand-in ``ssh`` and ``srun`` clients that
start the remote side on this machine (the real thing over sshd is tests/test_multihost.py).

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
from fastps.errors import FastPSError
from fastps.launch.hosts import (
    HostSlots,
    is_local_host,
    parse_host_list,
    parse_hostfile_text,
    parse_server_hosts,
    place,
)
from fastps.launch.remote import BOOTSTRAP, SrunTransport, SshTransport, forwarded_env
from fastps.launch.slurm import allocation_from_env, expand_nodelist, expand_tasks_per_node

# ------------------------------------------------------------------ parsing and placement


def test_host_list_and_hostfile_formats() -> None:
    assert parse_host_list("a:4,b:2,c") == [HostSlots("a", 4), HostSlots("b", 2), HostSlots("c", 1)]
    assert parse_host_list("alice@n1:2,10.0.0.5:1,[fe80::1]:3") == [
        HostSlots("alice@n1", 2),
        HostSlots("10.0.0.5", 1),
        HostSlots("[fe80::1]", 3),
    ]
    text = "# cluster\nnode1 slots=4 max_slots=8\nnode2:2\n\nnode3   # one slot\n"
    assert parse_hostfile_text(text, "hf") == [
        HostSlots("node1", 4),
        HostSlots("node2", 2),
        HostSlots("node3", 1),
    ]
    for bad, words in (
        ("a:0", "0 slots"),
        ("a:x", "slots 'x'"),
        ("a,,b", "empty host"),
        ("a:2,a:1", "listed twice"),
    ):
        with pytest.raises(FastPSError, match=words):
            parse_host_list(bad)
    with pytest.raises(FastPSError, match="hf line 2: unknown field 'cpus=4'"):
        parse_hostfile_text("a slots=1\nb cpus=4\n", "hf")
    with pytest.raises(FastPSError, match="no hosts"):
        parse_hostfile_text("# nothing\n", "hf")


def test_placement_follows_byteps() -> None:
    hosts = parse_host_list("h0:1,h1:1,h2:1,h3:1")
    p = place(hosts, 4, parse_server_hosts("h4,h5"))
    assert p.workers == ("h0", "h1", "h2", "h3")
    assert p.servers == ("h0", "h1", "h2", "h3", "h4", "h5")  # colocated + CPU-only
    # Slots fill in order; hosts past -np are not used at all.
    p = place(parse_host_list("a:2,b:2,c:2"), 3)
    assert p.workers == ("a", "a", "b") and p.servers == ("a", "b") and p.hosts == ("a", "b")
    assert p.describe() == "a: workers 0-1, server 0; b: worker 2, server 1"
    # --num-servers K: exactly K, over the server hosts if given, else the worker hosts.
    assert place(parse_host_list("a:2,b:2"), 4, num_servers=3).servers == ("a", "b", "a")
    assert place(
        parse_host_list("a:2,b:2"), 4, parse_server_hosts("c,d"), num_servers=2
    ).servers == ("c", "d")
    # A server host with :N runs N servers; one that also has workers keeps its colocated one.
    assert place(parse_host_list("a:1"), 1, parse_server_hosts("a:2,c:2")).servers == (
        "a",
        "a",
        "c",
        "c",
    )
    with pytest.raises(
        FastPSError,
        match=r"-np 5 needs 5 slots but the host list has 4 "
        r"\(a:2, b:2\)",
    ):
        place(parse_host_list("a:2,b:2"), 5)


def test_local_host_detection() -> None:
    import socket

    assert is_local_host("localhost") and is_local_host("127.0.0.1")
    assert is_local_host(socket.gethostname())
    assert not is_local_host("127.0.0.2")  # loopback, but no interface has it
    assert not is_local_host("nobody-here@localhost")


def test_slurm_allocation() -> None:
    assert expand_nodelist("node[01-03,07],gpu-a[1-2],login") == [
        "node01",
        "node02",
        "node03",
        "node07",
        "gpu-a1",
        "gpu-a2",
        "login",
    ]
    assert expand_nodelist("r[1-2]-n[8-9]") == ["r1-n8", "r1-n9", "r2-n8", "r2-n9"]
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    env = {"SLURM_JOB_NODELIST": "n[1-4]", "SLURM_TASKS_PER_NODE": "2(x3),1"}
    assert allocation_from_env(env) == [
        HostSlots("n1", 2),
        HostSlots("n2", 2),
        HostSlots("n3", 2),
        HostSlots("n4", 1),
    ]
    env = {"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NTASKS_PER_NODE": "4"}
    assert allocation_from_env(env) == [HostSlots("n1", 4), HostSlots("n2", 4)]
    for bad, words in (
        ({"SLURM_JOB_NODELIST": "n[1-3"}, "unbalanced"),
        ({"SLURM_JOB_NODELIST": "n[3-1]"}, "backwards"),
        (
            {"SLURM_JOB_NODELIST": "n[1-3]", "SLURM_TASKS_PER_NODE": "2(x2)"},
            "3 nodes .* task counts for 2",
        ),
        ({"SLURM_JOB_NODELIST": "n1", "SLURM_TASKS_PER_NODE": "2x"}, "not N or N\\(xM\\)"),
        ({}, "SLURM_JOB_NODELIST is not set"),
    ):
        with pytest.raises(FastPSError, match=words):
            allocation_from_env(bad)


def test_transport_command_lines() -> None:
    argv = SshTransport(port=2222, identity_file="/k/id", connect_timeout=4).argv(
        "alice@node1", "/opt/py/bin/python3"
    )
    assert argv[0] == "ssh" and "-T" in argv and "BatchMode=yes" in argv
    assert argv[argv.index("-p") + 1] == "2222" and argv[argv.index("-i") + 1] == "/k/id"
    assert argv[argv.index("-l") + 1] == "alice" and "ConnectTimeout=4" in argv
    assert argv[-2:] == ["node1", f"exec /opt/py/bin/python3 -c '{BOOTSTRAP}'"]
    assert SshTransport().argv("[fe80::1]", "py")[-2] == "fe80::1"
    assert SrunTransport().argv("n3", "/py") == [
        "srun",
        "--nodes=1",
        "--ntasks=1",
        "--nodelist=n3",
        "--overlap",
        "--kill-on-bad-exit=1",
        "--input=all",
        "--quiet",
        "/py",
        "-c",
        BOOTSTRAP,
    ]
    env = forwarded_env(
        {
            "PATH": "/b",
            "HOME": "/root",
            "FASTPS_HOST": "1.2.3.4",
            "SSH_CONNECTION": "x",
            "SLURM_JOB_ID": "5",
            "FASTPS_TOKEN": "t",
            "PYTHONPATH": "/p",
        }
    )
    assert env == {"PATH": "/b", "FASTPS_TOKEN": "t", "PYTHONPATH": "/p"}


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


def test_network_interface_sets_advertised_address() -> None:
    from fastps.config import Config

    cfg = Config.from_env({"FASTPS_IFACE": "lo", "FASTPS_SCHEDULER_ADDR": "198.18.0.1:9"})
    assert cfg.host == "127.0.0.1"  # lo's address, not the route to the scheduler
    # FASTPS_HOST still wins over the interface.
    assert Config.from_env({"FASTPS_IFACE": "lo", "FASTPS_HOST": "198.18.0.7"}).host == "198.18.0.7"
    with pytest.raises(
        FastPSError,
        match=r"FASTPS_IFACE=nosuch0: no such network interface "
        r"on .* \(interfaces: .*lo",
    ):
        Config.from_env({"FASTPS_IFACE": "nosuch0"})
