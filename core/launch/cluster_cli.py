"""fastpsrun's options for jobs over several machines, and the launcher they select.

Kept apart from launcher.py so that the local launcher's command line stays as it was: these
options only add ``-H``, ``--hostfile``, ``--server-hosts``, the ssh settings,
``--network-interface`` and ``--slurm``.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

import click
from fastps.errors import FastPSError

__all__ = ["multihost_options", "cluster_launcher_from_cli"]


def multihost_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    opts = [
        click.option(
            "-H",
            "--hosts",
            "hosts",
            default=None,
            metavar="HOST:SLOTS,...",
            help="Machines and how many workers each runs, e.g. a:4,b:4 (user@host "
            "for another ssh user); this machine's entries start without ssh.",
        ),
        click.option(
            "--hostfile",
            default=None,
            type=click.Path(dir_okay=False),
            help="File of 'host:slots' (Horovod) or 'host slots=N' (MPI) lines.",
        ),
        click.option(
            "--server-hosts",
            default=None,
            metavar="HOST[:N],...",
            help="CPU-only machines that each run a server (N servers with :N), "
            "besides one server per worker machine.",
        ),
        click.option(
            "--ssh-port",
            type=click.IntRange(1, 65535),
            default=None,
            help="ssh port of every remote machine [default: ssh's own].",
        ),
        click.option(
            "--ssh-identity-file",
            type=click.Path(dir_okay=False),
            default=None,
            help="Private key ssh uses [default: ssh's own].",
        ),
        click.option(
            "--ssh-connect-timeout",
            type=click.FloatRange(min=1),
            default=5.0,
            show_default=True,
            help="Seconds ssh waits for a machine to answer.",
        ),
        click.option(
            "--network-interface",
            default=None,
            metavar="IFACE",
            help="Every process advertises this interface's address on its machine "
            "[default: FASTPS_IFACE, else the address that routes to the scheduler].",
        ),
        click.option(
            "--slurm/--no-slurm",
            "slurm",
            default=None,
            help="Start the processes with srun on the nodes of the SLURM allocation "
            "[default: when SLURM_JOB_NODELIST is set and no -H/--hostfile].",
        ),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def cluster_launcher_from_cli(
    command: Sequence[str],
    num_workers: int,
    num_servers: Optional[int],
    opts: Mapping[str, Any],
    env: Optional[Mapping[str, str]] = None,
    **launcher_kwargs: Any,
) -> Any:
    """A ClusterLauncher for -H/--hostfile/SLURM, or None for a job on this machine only."""
    from fastps.launch.cluster import ClusterLauncher
    from fastps.launch.hosts import parse_host_list, parse_hostfile, parse_server_hosts, place
    from fastps.launch.remote import SrunTransport, SshTransport
    from fastps.launch.slurm import allocation_from_env

    env = os.environ if env is None else env
    hosts_text, hostfile = opts.get("hosts"), opts.get("hostfile")
    if hosts_text and hostfile:
        raise FastPSError("give -H or --hostfile, not both")
    slurm = opts.get("slurm")
    use_slurm = bool(slurm) or (
        slurm is None and not hosts_text and not hostfile and bool(env.get("SLURM_JOB_NODELIST"))
    )
    if hosts_text:
        hosts = parse_host_list(hosts_text)
    elif hostfile:
        hosts = parse_hostfile(hostfile)
    elif use_slurm:
        hosts = allocation_from_env(env)
    else:
        for name in ("server_hosts", "ssh_port", "ssh_identity_file", "network_interface"):
            if opts.get(name) is not None:
                flag = "--" + name.replace("_", "-")
                raise FastPSError(f"{flag} needs -H, --hostfile or a SLURM allocation")
        return None
    servers = parse_server_hosts(opts["server_hosts"]) if opts.get("server_hosts") else []
    placement = place(hosts, num_workers, servers, num_servers)
    kwargs: Dict[str, Any] = dict(launcher_kwargs)
    if use_slurm and not hosts_text and not hostfile:
        transport: Any = SrunTransport()
        # Every node is reached through srun, this one too: the steps belong to the job.
        kwargs["local_hosts"] = []
    else:
        transport = SshTransport(
            port=opts.get("ssh_port"),
            identity_file=opts.get("ssh_identity_file"),
            connect_timeout=float(opts.get("ssh_connect_timeout") or 5.0),
        )
    return ClusterLauncher(
        command,
        placement,
        transport,
        network_interface=opts.get("network_interface"),
        connect_timeout=float(opts.get("ssh_connect_timeout") or 5.0),
        **kwargs,
    )
