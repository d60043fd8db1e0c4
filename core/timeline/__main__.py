"""``python -m fastps.timeline summarize TRACE [--plot out.png]`` / ``merge PATH`` / ``check``."""

from __future__ import annotations

import json
import sys

import click


@click.group()
def cli() -> None:
    """Analyse fastps timelines (docs/guide/timeline.md)."""


@cli.command()
@click.argument("trace", type=click.Path(exists=True, dir_okay=False))
@click.option("--plot", "plot_to", default=None, help="Also draw one iteration as a PNG here.")
@click.option("--iteration", type=int, default=None, help="Which iteration [default: median].")
def summarize(trace: str, plot_to: str, iteration: int) -> None:
    """Per-stage and per-tensor times, critical path, stragglers, link utilisation."""
    from . import summarize as s

    if plot_to:
        try:
            s.pyplot()  # a missing matplotlib stops the command before any work, not after
        except s.PlotUnavailable as exc:
            raise click.ClickException(str(exc)) from None
    tl = s.load(trace)
    if not tl.parts:
        raise click.ClickException(f"{trace} holds no complete part of any tensor")
    click.echo(s.report(tl, iteration))
    if plot_to:
        try:
            k = s.plot(tl, plot_to, iteration)
        except ValueError as exc:  # no complete iteration, or --iteration names none
            raise click.ClickException(str(exc)) from None
        click.echo(f"\nwrote {plot_to} (iteration {k})")


@cli.command()
@click.argument("path")
@click.option("--keep-parts", is_flag=True, help="Leave <path>.parts/ in place.")
def merge(path: str, keep_parts: bool) -> None:
    """Merge <PATH>.parts/*.json (written by each process) into PATH."""
    from .merge import merge_files

    info = merge_files(path, remove_parts=not keep_parts)
    if info is None:
        raise click.ClickException(f"no shares in {path}.parts/")
    click.echo(f"wrote {path}: {info['processes']} processes")


@cli.command()
@click.argument("trace", type=click.Path(exists=True, dir_okay=False))
def check(trace: str) -> None:
    """Check that TRACE is a well-formed Chrome trace whose spans nest."""
    from .schema import check as run_check

    with open(trace) as f:
        problems = run_check(json.load(f))
    for p in problems:
        click.echo(p)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    cli(prog_name="python -m fastps.timeline")
