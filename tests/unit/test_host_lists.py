"""Host lists, hostfiles, placement of ranks on hosts, local-host detection, SLURM allocations
and the ssh/srun command lines (core/launch/), as pure functions. Whole fastpsrun -H and
SLURM jobs through stand-in ssh and srun clients: tests/integration/test_hosts.py."""

from __future__ import annotations

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
