"""The torch plugin's events on the job's timeline (docs/guide/timeline.md): when backward
produced a gradient, how long the optimizer waited for sums and applied them, and — with
cross-barrier updates — how long a module's forward waited for its parameters' sums.

Each call costs one lookup when no timeline is recording.
"""

from __future__ import annotations

import time

from fastps.timeline import recorder as _recorder


def recording() -> bool:
    """Whether a timeline is recording: callers skip building labels when not."""
    return _recorder.active() is not None


def start() -> int:
    """A span's start (0 when no timeline is recording, so ``end`` records nothing)."""
    return time.monotonic_ns() if _recorder.active() is not None else 0


def end(kind: str, label: str, started: int) -> None:
    rec = _recorder.active()
    if rec is not None and started:
        rec.span(kind, label, started, time.monotonic_ns())


def instant(kind: str, label: str) -> None:
    rec = _recorder.active()
    if rec is not None:
        now = time.monotonic_ns()
        rec.span(kind, label, now, now)
