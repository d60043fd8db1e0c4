"""``fastpsrun``: the command line that starts a job (docs/reference/cli.md): one machine
(:class:`fastps.launch.job.Launcher`), several machines over ssh, SLURM or mpirun
(``cluster_cli``), or an elastic job (``elastic_cli``).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, Optional, Sequence

import click
from fastps.config import parse_size, stated_log_level
from fastps.errors import FastPSError
from fastps.launch.cluster_cli import cluster_launcher_from_cli, multihost_options
from fastps.launch.config_file import load_config_file
from fastps.launch.elastic_cli import elastic_launcher_from_cli, elastic_options, pop_elastic
from fastps.launch.job import Launcher, PrefixHandler, describe_exit, say

__all__ = ["main", "Launcher", "describe_exit"]


def _size(_ctx: click.Context, _param: click.Parameter, value: Optional[str]) -> Optional[int]:
    if value is None:
        return None
    try:
        size = parse_size(value, "--partition-bytes")
    except FastPSError as exc:
        raise click.BadParameter(str(exc)) from None
    if size <= 0:
        raise click.BadParameter("must be > 0")
    return size


def _check_build(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from fastps.launch.check_build import main as check_build

    ctx.exit(check_build())


def _apply_settings(config_file: Optional[str], log_level: Optional[str], verbose: bool) -> None:
    """Puts the config file's settings, then the logging flags, into the environment every
    process of the job inherits (so the flags win over the file, the file over what was
    there)."""
    if config_file is not None:
        settings, ignored = load_config_file(config_file)
        for note in ignored:
            say(f"{config_file}: {note}")
        os.environ.update(settings)
    if log_level is not None:
        os.environ["FASTPS_LOG_LEVEL"] = log_level.upper()
    elif verbose:
        # At least INFO: a DEBUG already asked for stays.
        os.environ["FASTPS_LOG_LEVEL"] = "DEBUG" if stated_log_level() == "DEBUG" else "INFO"


@click.command(
    context_settings={
        "ignore_unknown_options": True,
        "allow_interspersed_args": False,
        "help_option_names": ["-h", "--help"],
    }
)
@click.option(
    "--check-build",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_check_build,
    help="Show what this installation can do (core build, frameworks and their fastps "
    "plugins, GPUs, launch tools) and exit.",
)
@click.option(
    "-np",
    "--num-workers",
    "num_workers",
    type=click.IntRange(min=1),
    default=None,
    help="Number of worker processes (each runs CMD); in elastic mode the number to start.",
)
@click.option(
    "--num-servers",
    type=click.IntRange(min=0),
    default=None,
    help="Number of summation servers (0: none) [default: 1; with -H one per worker host "
    "plus one per --server-hosts host].",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Registration/barrier timeout in seconds [default: FASTPS_TIMEOUT or 120].",
)
@click.option("--job-id", default=None, help="Job id [default: random].")
@click.option(
    "--finish-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Stop the job if a worker is still running this many seconds after another "
    "finished [default: wait; the workers still running are named every 30 s].",
)
@click.option(
    "--partition-bytes",
    callback=_size,
    default=None,
    help="Largest part a tensor is cut into, e.g. 4M [default: FASTPS_PARTITION_BYTES].",
)
@click.option(
    "--host-addr",
    default="127.0.0.1",
    show_default=True,
    help="Address the scheduler binds and the processes advertise.",
)
@click.option(
    "--timeline-filename",
    "timeline",
    default=None,
    help="Write one merged timeline of the whole job (Chrome trace / Perfetto JSON) to "
    "this file [default: FASTPS_TIMELINE; docs/guide/timeline.md].",
)
@click.option(
    "--progress",
    is_flag=True,
    default=False,
    help="Show a status line (iterations/s, gradient GB/s, per-host link use, slowest rank) "
    "under the processes' output (needs rich).",
)
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], case_sensitive=False),
    default=None,
    help="Log level of every process of the job, fastpsrun's own included (sets "
    "FASTPS_LOG_LEVEL) [default: FASTPS_LOG_LEVEL or WARNING].",
)
@click.option(
    "--verbose",
    is_flag=True,
    default=False,
    help="Name every process as it starts (pid, command) and log at INFO unless --log-level "
    "says otherwise.",
)
@click.option(
    "--output-filename",
    "output_dir",
    default=None,
    metavar="DIR",
    help="Also write each process's stdout and stderr, unprefixed, to DIR/rank.<i>/ "
    "(workers) and DIR/server.<i>/ (servers).",
)
@click.option(
    "--config-file",
    default=None,
    metavar="FILE",
    help="Settings for every process from a YAML file (Horovod's keys, and a 'fastps:' "
    "section); it wins over the environment, the flags win over it.",
)
@multihost_options
@elastic_options
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def cli(
    num_workers: Optional[int],
    num_servers: Optional[int],
    timeout: Optional[float],
    job_id: Optional[str],
    finish_timeout: Optional[float],
    partition_bytes: Optional[int],
    host_addr: str,
    timeline: Optional[str],
    progress: bool,
    log_level: Optional[str],
    verbose: bool,
    output_dir: Optional[str],
    config_file: Optional[str],
    command: Sequence[str],
    **multihost: Any,
) -> None:
    """Run CMD as N workers of a fastps job on this machine, or on the machines of -H,
    --hostfile or the SLURM allocation (docs/guide/multi-node.md)."""
    try:
        _apply_settings(config_file, log_level, verbose)
    except FastPSError as exc:
        say(str(exc))
        sys.exit(2)
    logger = logging.getLogger("fastps")
    if not logger.handlers:
        handler = PrefixHandler("[scheduler] ")
        handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    elastic = pop_elastic(multihost)
    try:
        launcher = elastic_launcher_from_cli(
            command,
            num_workers,
            num_servers,
            elastic,
            multihost,
            timeout=timeout,
            job_id=job_id,
            partition_bytes=partition_bytes,
            host_addr=host_addr,
            finish_timeout=finish_timeout,
        )
        if launcher is not None and (timeline or progress):
            raise FastPSError(
                "--timeline-filename and --progress are not supported in elastic mode yet"
            )
        if launcher is None:
            if num_workers is None:
                raise click.UsageError("Missing option '-np' / '--num-workers'.")
            launcher = cluster_launcher_from_cli(
                command,
                num_workers,
                num_servers,
                multihost,
                timeout=timeout,
                job_id=job_id,
                partition_bytes=partition_bytes,
                finish_timeout=finish_timeout,
            ) or Launcher(
                command,
                num_workers=num_workers,
                num_servers=1 if num_servers is None else num_servers,
                timeout=timeout,
                job_id=job_id,
                partition_bytes=partition_bytes,
                host_addr=host_addr,
                finish_timeout=finish_timeout,
                timeline=timeline,
                progress=progress,
            )
        logger.setLevel(launcher.config.log_level)
        launcher.set_output(output_dir, verbose)
    except FastPSError as exc:
        say(str(exc))
        sys.exit(2)
    launcher.install_signal_handlers()
    try:
        code = launcher.run()
    except FastPSError as exc:
        say(str(exc))
        code = 1
    sys.exit(code)


def main() -> None:
    """Entry point of the ``fastpsrun`` console script."""
    cli(prog_name="fastpsrun")


if __name__ == "__main__":
    main()
