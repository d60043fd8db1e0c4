"""Exceptions raised by fastps.

Every failure a user can see derives from :class:`FastPSError`, so one ``except`` clause
catches them all; the two subclasses tell a wait that ran out of time from a job that was
torn down because a peer died or disagreed.
"""

from __future__ import annotations

__all__ = ["FastPSError", "FastPSTimeoutError", "FastPSAbort"]


class FastPSError(RuntimeError):
    """Base class of every error fastps raises."""


class FastPSTimeoutError(FastPSError):
    """A bounded wait (registration, barrier, operation) ran out of time."""


class FastPSAbort(FastPSError):
    """The job was aborted: a peer died, a tensor mismatched, or a node asked to abort.

    The message is the reason the scheduler broadcast, e.g.
    ``worker 1 (pid 4242 on host h) died: connection closed``.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
