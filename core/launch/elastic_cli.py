"""fastpsrun's elastic options (Horovod's names) and the launcher they select."""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, Optional, Sequence

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
    """The ElasticLauncher for --host-discovery-script, or None."""
    script = opts.get("host_discovery_script")
    if not script:
        given = [f"--{k.replace('_', '-')}" for k in ELASTIC_KEYS if opts.get(k) is not None]
        if given:
            raise FastPSError(f"{', '.join(given)} need --host-discovery-script (elastic mode)")
        return None
    used = [k for k in ("hosts", "hostfile", "server_hosts", "slurm") if multihost.get(k)]
    if used:
        raise FastPSError(
            "elastic mode (--host-discovery-script) runs on this machine only; drop "
            + ", ".join(f"--{k.replace('_', '-')}" for k in used)
        )
    env = launcher_kwargs.get("env") or os.environ
    from fastps.launch.elastic_driver import (
        DEFAULT_ELASTIC_TIMEOUT,
        ElasticLauncher,
        discovery_interval,
    )

    min_np = opts.get("min_np") or num_workers or 1
    max_np = opts.get("max_np") or max(min_np, num_workers or 0, 1 << 16)
    timeout = opts.get("elastic_timeout") or DEFAULT_ELASTIC_TIMEOUT
    cooldown = opts.get("blacklist_cooldown_range")
    if cooldown is not None and cooldown[1] < cooldown[0]:
        raise FastPSError(f"--blacklist-cooldown-range {cooldown[0]:g} {cooldown[1]:g}: HI < LO")
    return ElasticLauncher(
        command,
        discovery_script=script,
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
        **launcher_kwargs,
    )
