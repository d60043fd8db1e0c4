"""Horovod's ``start_timeline`` / ``stop_timeline`` for every plugin: each rank records its
share; stopping is a collective after which rank 0 merges the shares (docs/guide/timeline.md)."""

from __future__ import annotations

from ..errors import FastPSError
from ..worker import api as _api
from . import merge, recorder


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Starts recording this worker's share of the job's timeline; every rank calls it with
    the same path. ``mark_cycles`` is accepted for compatibility: fastps has no background
    cycle to mark."""
    del mark_cycles
    _api.start_timeline(file_path)


def stop_timeline() -> None:
    """Stops recording; every rank calls it. Rank 0 then merges the workers' shares into the
    file given to start_timeline (servers' tracks too when they record: fastpsrun
    --timeline-filename or FASTPS_TIMELINE)."""
    rec = recorder.active()
    if rec is None:
        raise FastPSError("stop_timeline() without start_timeline()")
    path = rec.path
    _api.stop_timeline()
    _api.barrier()  # every worker's share is written
    if _api.rank() == 0:
        merge.merge_files(path)
