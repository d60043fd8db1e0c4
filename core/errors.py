"""Every exception type fastps raises, in one place (the plugins add framework-flavoured
subclasses of these).

Every failure a user can see derives from :class:`FastPSError`, so one ``except`` clause
catches them all; the subclasses tell a wait that ran out of time from a job that was torn
down because a peer died or disagreed, a collective whose ranks disagree from a call made
wrongly, and carry Horovod's names where Horovod users catch them.
"""

from __future__ import annotations

__all__ = [
    "CollectiveError",
    "ConfigError",
    "FastPSAbort",
    "FastPSError",
    "FastPSTimeoutError",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "UsageError",
    "WorkerLostError",
]


class FastPSError(RuntimeError):
    """Base class of every error fastps raises."""


class ConfigError(FastPSError, ValueError):
    """A ``FASTPS_*`` variable whose value cannot be parsed or is out of range; the message
    names the variable and the value. Also a ValueError: what the plugins raised for their
    own switches before ``fastps.config`` read them all."""


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


class CollectiveError(FastPSError):
    """An op whose ranks disagree (shape, dtype, op, root...) or that was used wrongly.
    Raised on every rank of the op; the job goes on."""


class UsageError(FastPSError, ValueError):
    """A call this rank made wrongly (a name already in flight, a root or rank outside the
    process set, bad splits): raised at once on the caller, never waits for other ranks.
    Both a ValueError (Horovod's type for these) and a FastPSError."""


class HorovodInternalError(FastPSError):
    """Horovod's name for a failed collective (the job's peers are gone or disagree)."""


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod's elastic-mode signal that hosts changed, raised by an elastic state's
    ``commit()`` (``fastps.elastic``); ``skip_sync``: only removals, no state to hand out."""

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("hosts updated")
        self.skip_sync = skip_sync


class WorkerLostError(FastPSAbort, HorovodInternalError):
    """A peer of this elastic generation died or left: the operation failed. Horovod's
    ``HorovodInternalError`` (what ``hvd.elastic.run`` catches to restore the last commit)
    and a ``FastPSAbort`` (what non-elastic code catches)."""
