"""fastpsrun's elastic options (Horovod's names) and the launcher they select.

Elastic mode is ``--host-discovery-script``, or, as in Horovod, ``-H``/``--hostfile`` with an
elastic flag (``--min-np``, ``--max-np``, ...): a discovery whose hosts never change. Hosts
that are not this machine get their workers over ssh (``--ssh-port``,
``--ssh-identity-file``, ``--ssh-connect-timeout`` and ``--network-interface`` apply).

Inside a SLURM allocation (``--slurm``, or elastic flags alone with SLURM_JOB_NODELIST set,
as fastpsrun picks SLURM without elastic flags) the allocation's nodes and task counts are
a fixed discovery, every worker is an srun step of the job (``remote.SrunTransport``, this
node's too), and a ``--host-discovery-script``, ``-H`` or ``--hostfile`` may only name the
allocation's nodes.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

import click
from fastps.config import elastic_defer_join
from fastps.errors import FastPSError

ELASTIC_KEYS = (
    "min_np",
    "max_np",
    "host_discovery_script",
    "elastic_timeout",
    "reset_limit",
    "blacklist_cooldown_range",
    "blacklist",
    "spare_hosts",
)


def elastic_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    opts = [
        click.option(
            "--host-discovery-script",
            default=None,
            metavar="SCRIPT",
            help="Elastic mode: a command printing the available 'host:slots' lines, run "
            "every second; workers start and stop as its output changes (docs/guide/elastic.md).",
        ),
        click.option(
            "--min-np",
            type=click.IntRange(min=1),
            default=None,
            help="Elastic mode: fewest workers to train with [default: -np].",
        ),
        click.option(
            "--max-np",
            type=click.IntRange(min=1),
            default=None,
            help="Elastic mode: most workers [default: every discovered slot].",
        ),
        click.option(
            "--elastic-timeout",
            type=click.FloatRange(min=0, min_open=True),
            default=None,
            help="Elastic mode: seconds to wait for --min-np workers or an incomplete "
            "rendezvous before failing [default: 600].",
        ),
        click.option(
            "--reset-limit",
            type=click.IntRange(min=0),
            default=None,
            help="Elastic mode: most changes of world (new generations after the first) "
            "before the job stops [default: no limit].",
        ),
        click.option(
            "--blacklist-cooldown-range",
            type=(click.FloatRange(min=1), click.FloatRange(min=1)),
            default=None,
            metavar="LO HI",
            help="Elastic mode: a failed host (or slot) may be used again after a cooldown "
            "of LO..HI seconds, doubling with each failure [default: never again].",
        ),
        click.option(
            "--blacklist",
            type=click.Choice(["slot", "host"]),
            default=None,
            help="Elastic mode: what a failed worker takes out of the job: its slot (the "
            "host's other workers go on) or, as Horovod, its whole host [default: slot].",
        ),
        click.option(
            "--spare-hosts",
            type=click.IntRange(min=0),
            default=None,
            metavar="N",
            help="Elastic mode: keep N more workers started and waiting on discovered "
            "slots; one takes a failed worker's rank at once [default: 0].",
        ),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def pop_elastic(kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """Takes the elastic options out of the CLI's keyword arguments."""
    return {k: kwargs.pop(k, None) for k in ELASTIC_KEYS}


def elastic_launcher_from_cli(
    command: Sequence[str],
    num_workers: Optional[int],
    num_servers: Optional[int],
    opts: Dict[str, Any],
    multihost: Dict[str, Any],
    **launcher_kwargs: Any,
) -> Any:
    """The ElasticLauncher for --host-discovery-script (or -H/--hostfile/the SLURM allocation
    with elastic flags), or None."""
    script = opts.get("host_discovery_script")
    given = [f"--{k.replace('_', '-')}" for k in ELASTIC_KEYS if opts.get(k) is not None]
    hosts_text, hostfile = multihost.get("hosts"), multihost.get("hostfile")
    env = launcher_kwargs.get("env") or os.environ
    slurm = multihost.get("slurm")
    # As without elastic flags: the allocation is used unless hosts are named some other way.
    use_slurm = bool(slurm) or (
        slurm is None
        and not (script or hosts_text or hostfile)
        and bool(env.get("SLURM_JOB_NODELIST"))
    )
    if not script and not (given and (hosts_text or hostfile or use_slurm)):
        if given:
            raise FastPSError(
                f"{', '.join(given)} need --host-discovery-script, -H, --hostfile or --slurm "
                "(elastic mode)"
            )
        return None
    fixed = _fixed_hosts(script, hosts_text, hostfile)
    if multihost.get("server_hosts"):
        raise FastPSError(
            "--server-hosts is not supported in elastic mode: each generation's servers run "
            "on fastpsrun's machine (--num-servers sets how many)"
        )
    from fastps.launch.elastic_driver import (
        DEFAULT_ELASTIC_TIMEOUT,
        ElasticLauncher,
        discovery_interval,
    )
    from fastps.launch.remote import SshTransport, Transport

    connect_timeout = float(multihost.get("ssh_connect_timeout") or 5.0)
    transport: Transport = SshTransport(
        port=multihost.get("ssh_port"),
        identity_file=multihost.get("ssh_identity_file"),
        connect_timeout=connect_timeout,
    )
    slurm_kwargs: Dict[str, Any] = {}
    if use_slurm:
        fixed, transport, slurm_kwargs = _slurm_setup(env, script, hosts_text, fixed)

    min_np = opts.get("min_np") or num_workers or 1
    max_np = opts.get("max_np") or max(min_np, num_workers or 0, 1 << 16)
    timeout = opts.get("elastic_timeout") or DEFAULT_ELASTIC_TIMEOUT
    cooldown = opts.get("blacklist_cooldown_range")
    if cooldown is not None and cooldown[1] < cooldown[0]:
        raise FastPSError(f"--blacklist-cooldown-range {cooldown[0]:g} {cooldown[1]:g}: HI < LO")
    return ElasticLauncher(
        command,
        discovery_script=script or "",
        min_np=min_np,
        max_np=max_np,
        num_workers=num_workers,
        num_servers=1 if num_servers is None else num_servers,
        elastic_timeout=timeout,
        reset_limit=opts.get("reset_limit"),
        cooldown_range=None if cooldown is None else (float(cooldown[0]), float(cooldown[1])),
        blacklist_scope=opts.get("blacklist") or "slot",
        discovery_interval=discovery_interval(env),
        defer_join=elastic_defer_join(env),
        spares=opts.get("spare_hosts") or 0,
        fixed_hosts=fixed,
        transport=transport,
        network_interface=multihost.get("network_interface"),
        connect_timeout=connect_timeout,
        **slurm_kwargs,
        **launcher_kwargs,
    )


def _slurm_setup(
    env: Mapping[str, str],
    script: Optional[str],
    hosts_text: Optional[str],
    fixed: Optional[Dict[str, int]],
) -> Tuple[Optional[Dict[str, int]], Any, Dict[str, Any]]:
    """Elastic mode inside a SLURM allocation: the fixed discovery (the allocation's nodes
    and slots, or -H/--hostfile's hosts, which must be among them; None with a discovery
    script), the srun transport, and the launcher's arguments that start every worker as
    a step of the job and keep every discovered host inside the allocation."""
    from fastps.launch.remote import SrunTransport
    from fastps.launch.slurm import allocation_hosts, check_in_allocation

    allocation = allocation_hosts(env)
    job_id = env.get("SLURM_JOB_ID") or ""
    if fixed is not None:
        check_in_allocation(fixed, allocation, "-H" if hosts_text else "--hostfile", job_id)
    elif not script:
        fixed = allocation

    def host_check(hosts: Mapping[str, int]) -> None:
        check_in_allocation(hosts, allocation, "the host discovery script", job_id)

    # Every node is reached through srun, this one too: the steps belong to the job.
    launcher_kwargs = {"local_hosts": [], "host_check": host_check}
    return fixed, SrunTransport(job_id=job_id or None), launcher_kwargs


def _fixed_hosts(
    script: Optional[str], hosts_text: Optional[str], hostfile: Optional[str]
) -> Optional[Dict[str, int]]:
    """-H/--hostfile as a discovery that never changes (None: the script discovers)."""
    from fastps.launch.hosts import parse_host_list, parse_hostfile

    if hosts_text and hostfile:
        raise FastPSError("give -H or --hostfile, not both")
    if not hosts_text and not hostfile:
        return None
    if script:
        flag = "-H" if hosts_text else "--hostfile"
        raise FastPSError(f"give --host-discovery-script or {flag}, not both")
    hosts = parse_host_list(hosts_text) if hosts_text else parse_hostfile(str(hostfile))
    return {h.name: h.slots for h in hosts}
