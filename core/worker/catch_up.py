"""Catch-up under quorum rounds (docs/guide/async.md, "Catch-up"): the policy every plugin's
optimizer follows when a worker is slower for good.

Under FASTPS_ROUND_QUORUM a wait reports how many of the tensor's rounds closed after the
one it answered (``Handle.lag``, ``api.wait_id``). A worker that applied one round per step
would fall further behind every step and, once FASTPS_QUORUM_HISTORY rounds behind, pace
everyone. So after applying the answered round the optimizer applies the rounds that closed
without it, in turn: it fetches each round's sums (nothing pushed or counted) and runs the
wrapped optimizer's step on them, exactly as every other replica did. The plugins differ only
in how they fetch into their gradients and run their step; what is shared lives here:

* :class:`RoundLag`: the least lag over one step's gradients, "unknown" as soon as one
  gradient went a path that cannot catch up (then nothing is fetched: rounds are
  whole-model, a round is applied whole or not at all);
* :func:`fetch_round`: the next round of every gradient, from the servers' history;
* :func:`catch_up`: the loop, over exactly the rounds the answer named (not those that
  closed meanwhile: a worker whose link cannot carry the sums as fast as rounds close would
  chase them for good and never compute a gradient again).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, List, Sequence, Tuple, TypeVar

from fastps.worker import api as _api

# A lag nobody can act on: the gradient went a path without catch-up (a process set,
# compression, sufficient factors, a local gradient).
UNKNOWN = -1

T = TypeVar("T")


def least_lag(lags: Iterable[int]) -> int:
    """The rounds to catch up on, given each gradient's lag: a round closed for the model
    only when it closed for every gradient, so the least; 0 when any lag is unknown or
    there is none."""
    least = -1
    for lag in lags:
        if lag < 0:
            return 0
        least = lag if least < 0 else min(least, lag)
    return max(least, 0)


class RoundLag:
    """The least lag over one step's gradients as they are waited for (from any thread),
    taken once per step by the optimizer. Keeps two numbers, not a list: a reducer whose
    lags nobody takes (no quorum, no catch-up on its path) costs nothing per step."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._least = -1  # none noted yet
        self._unknown = False
        # The core session the lags were noted in: an elastic membership change starts a
        # new one (new servers, rounds from 0), where an older lag means nothing.
        self._session: Any = None

    def note(self, lag: int) -> None:
        lag = int(lag)
        with self._lock:
            if self._session is not _api._state:
                self._session = _api._state
                self._least, self._unknown = -1, False
            if lag < 0:
                self._unknown = True
            elif self._least < 0 or lag < self._least:
                self._least = lag

    def unknown(self) -> None:
        """A gradient of this step cannot be fetched: no catch-up this step."""
        self.note(UNKNOWN)

    def take(self) -> int:
        """The rounds to catch up on after this step (0 if any gradient's lag is unknown,
        or none was noted); starts the next step's count."""
        with self._lock:
            least, unknown = self._least, self._unknown
            self._least, self._unknown = -1, False
            if self._session is not _api._state:
                return 0  # noted in an earlier session
        return 0 if unknown or least < 0 else least


@dataclass(frozen=True)
class Target:
    """A gradient's next round to fetch into host memory: where, and what its push
    carried (the same name, dtype, shape, priority and scale as its sums)."""

    ptr: int
    nbytes: int
    dtype: str
    shape: Tuple[int, ...]
    name: str
    priority: int
    scale: float


def fetch_round(targets: Sequence[Target]) -> int:
    """Writes into every target the sum of its tensor's next round, which closed without
    this worker, from the servers' history; returns the least lag of those answers.

    Every fetch starts before any is waited for: fused tensors travel as their bucket does,
    and a bucket goes once every member has started."""
    started: List[Tuple[Target, int]] = []
    try:
        for t in targets:
            hid = _api.push_pull_inplace_id(
                t.ptr, t.nbytes, t.dtype, t.shape, t.name, t.priority, t.scale, fetch=True
            )
            started.append((t, hid))
    finally:
        # also after a failed start: every op that started is waited for (and released)
        lags = [_api.wait_id(hid, t.name) for t, hid in started]
    return least_lag(lags)


def catch_up(behind: int, fetch: Callable[[], T], apply: Callable[[T], None]) -> int:
    """Applies the ``behind`` rounds that closed after the one just applied: for each,
    ``fetch()`` its sums and ``apply`` them with the wrapped optimizer. Returns how many
    rounds it applied."""
    for _ in range(max(0, int(behind))):
        apply(fetch())
    return max(0, int(behind))
