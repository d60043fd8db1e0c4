"""The stall inspector on a worker: notices a push_pull that has waited
``FASTPS_STALL_WARNING_S``, asks the scheduler to find who is missing
(``fastps.control.stalls`` judges), logs the answer, and past ``FASTPS_STALL_SHUTDOWN_S``
aborts the job with it. Also counts this worker's submissions per tensor, which the
scheduler's inquiries read.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from fastps.control.stalls import MIN_POLL_S, describe, poll_interval

log = logging.getLogger("fastps.stall")


def _set_parts() -> Optional[Dict[str, List[int]]]:
    """The data parts of this worker's collectives in flight on a process set other than
    the global one (core/collectives/ops.py), with the set's ranks: only those submit them.
    None if they cannot be told (then no deadlock is proven)."""
    coll = sys.modules.get("fastps.collectives.ops")  # not in use unless imported
    session = getattr(coll, "_session", None)
    if session is None:
        return {}
    out: Dict[str, List[int]] = {}
    try:
        for op in list(session.inflight.values()):
            ps = op.process_set
            if ps.sid != 0:
                for part in list(op._parts):
                    out[part.name] = list(ps.ranks)
    except (AttributeError, RuntimeError, TypeError) as exc:
        log.debug("process set parts unknown: %s", exc)
        return None
    return out


class SubmissionCounts:
    """How many times this worker submitted each tensor name (thread-safe), and the most
    of any name (one per step for a gradient: fastpsrun --progress counts iterations so).

    Names used once and never again (anonymous collectives are numbered) would grow the
    table forever; past ``limit`` names, those seen once and not in flight are forgotten.
    That is safe for the stall inspector: a rank that forgot a name it ran once can only
    be asked about a later round of it, which it has not submitted either."""

    def __init__(self, limit: int = 1 << 16) -> None:
        # Reentrant: a StallInspector shares it, so that counting a submission and marking
        # it waiting take one lock per gradient (StallInspector.submit).
        self.lock = threading.RLock()
        self._counts: Dict[str, int] = {}
        self.limit = limit
        self.most = 0

    def add(self, name: str, in_flight: Callable[[], Sequence[str]] = list) -> int:
        with self.lock:
            return self.add_locked(name, in_flight)

    def add_locked(self, name: str, in_flight: Callable[[], Sequence[str]] = list) -> int:
        """``add`` for a caller that holds ``lock``."""
        n = self._counts.get(name, 0) + 1
        self._counts[name] = n
        if n > self.most:
            self.most = n
        if len(self._counts) > self.limit:
            keep = set(in_flight()) | {name}
            self._counts = {k: v for k, v in self._counts.items() if v > 1 or k in keep}
            if len(self._counts) > self.limit // 2:
                self.limit *= 2  # mostly names in use: sweep less often
        return n

    def snapshot_of(self, name: str) -> int:
        """How many times ``name`` was submitted (its latest round)."""
        with self.lock:
            return self._counts.get(name, 0)

    def snapshot(self) -> Dict[str, int]:
        with self.lock:
            return dict(self._counts)


class StallInspector:
    """A worker's side: what it waits for, since when, and a thread that asks once a
    push_pull has waited too long."""

    def __init__(
        self,
        client: Any,
        rank: int,
        warning_s: float,
        shutdown_s: float,
        counts: Optional[SubmissionCounts] = None,
        closers: Optional[Callable[[], Optional[int]]] = None,
    ) -> None:
        """``closers``: the fewest submitting ranks that may finish a round of a sum on this
        worker, asked at each report (None, or returning None: every rank)."""
        self._client = client
        self._rank = rank
        self._closers = closers
        self.warning_s = warning_s
        self.shutdown_s = shutdown_s
        self.counts = counts if counts is not None else SubmissionCounts()
        self._lock = self.counts.lock  # one lock for counting and waiting (submit/settle)
        # name -> round, name -> since: two dicts of plain numbers, so an op in flight keeps
        # no object the garbage collector tracks (docs/guide/torch.md, "Garbage collection").
        self._waiting: Dict[str, int] = {}
        self._since: Dict[str, float] = {}
        self._asked_at: Dict[Tuple[str, int], float] = {}  # last stall_check per round
        self._logged: Dict[Tuple[str, int], float] = {}  # last warning per round
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fastps-stall", daemon=True)
        client.on_message("stall_query", self._on_query)
        client.on_message("stall_result", self._on_result)
        # The scheduler looks at the waits it holds itself (collectives, barriers) once
        # they pass the warning period: it learns the period here.
        try:
            client.send_message({"type": "stall_config", "warning_s": float(warning_s)})
        except Exception as exc:  # noqa: BLE001 - only the scheduler's own look is lost
            log.debug("stall config not sent: %s", exc)
        self._thread.start()

    def submitted(self, name: str, rnd: int) -> None:
        """``name`` was submitted for the ``rnd``-th time (``SubmissionCounts.add``)."""
        with self._lock:
            self._waiting[name] = rnd
            self._since[name] = time.monotonic()

    def submit(self, name: str) -> int:
        """Counts a submission of ``name`` and marks it waiting, under one lock (the
        per-gradient path: ``SubmissionCounts.add`` then ``submitted``); returns its round."""
        with self._lock:
            rnd = self.counts.add_locked(name, self.in_flight)
            self._waiting[name] = rnd
            self._since[name] = time.monotonic()
            return rnd

    def settle(self, name: str) -> None:
        """The latest round of ``name`` is no longer waited for (``finished`` with the
        round ``SubmissionCounts`` holds), under one lock."""
        with self._lock:
            rnd = self.counts._counts.get(name, 0)
            if self._waiting.get(name, 0) == rnd:
                del self._waiting[name]
                del self._since[name]

    def in_flight(self) -> List[str]:
        with self._lock:
            return list(self._waiting)

    def finished(self, name: str, rnd: int) -> None:
        with self._lock:
            if self._waiting.get(name, 0) == rnd:
                del self._waiting[name]
                del self._since[name]

    def close(self) -> None:
        self._stop.set()

    def _report(self) -> Dict[str, Any]:
        now = time.monotonic()
        with self._lock:  # the counts' lock too: waits and counts from one instant
            waiting = {n: [r, now - self._since[n]] for n, r in self._waiting.items()}
            counts = self.counts.snapshot()
        report: Dict[str, Any] = {"waiting": waiting, "counts": counts, "warning_s": self.warning_s}
        closers = self._closers() if self._closers is not None else None
        if closers is not None:
            report["closers"] = closers
        parts = _set_parts()
        if parts is None:
            report["members"] = None
        else:
            members = {n: rs for n, rs in parts.items() if n in waiting}
            if members:
                report["members"] = members
        return report

    def _loop(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            due: Optional[float] = None
            ask = False
            with self._lock:
                for name, rnd in self._waiting.items():
                    since = self._since[name]
                    last = self._asked_at.get((name, rnd))
                    # Ask when it first passes the warning, then every warning period,
                    # and once more as it passes the shutdown deadline.
                    marks = [since + self.warning_s]
                    if last is not None:
                        marks = [last + self.warning_s]
                        if self.shutdown_s and last < since + self.shutdown_s:
                            marks.append(since + self.shutdown_s)
                    nxt = min(marks)
                    if nxt <= now:
                        ask = True
                        self._asked_at[(name, rnd)] = now
                    else:
                        due = nxt if due is None else min(due, nxt)
            if ask:
                try:
                    self._client.send_message({"type": "stall_check"})
                except Exception as exc:  # noqa: BLE001 - the job is ending anyway
                    log.debug("stall check not sent: %s", exc)
            # A push_pull submitted while this sleeps is seen within a quarter warning period.
            cap = poll_interval(self.warning_s)
            wait = cap if due is None else min(cap, max(MIN_POLL_S, due - now))
            if not ask:
                self._stop.wait(wait)

    def _on_query(self, _msg: Dict[str, Any]) -> None:
        self._client.send_message({"type": "stall_report", "report": self._report()})

    def _on_result(self, msg: Dict[str, Any]) -> None:
        mine = self._report()["waiting"]
        for stall in msg.get("stalls", []):
            if stall["name"] not in mine:
                continue
            text = describe(stall)
            rnd, age = mine[stall["name"]]
            # Several waiting ranks may start inquiries at once: warn once per period.
            last = self._logged.get((stall["name"], rnd))
            now = time.monotonic()
            shutting = bool(self.shutdown_s and age >= self.shutdown_s and stall["missing"])
            if not shutting and last is not None and now - last < self.warning_s / 2:
                continue
            self._logged[(stall["name"], rnd)] = now
            if shutting:
                log.error(
                    "stall: %s; FASTPS_STALL_SHUTDOWN_S=%g: stopping the job", text, self.shutdown_s
                )
                self._client.send_abort(
                    f"stall: {text} (FASTPS_STALL_SHUTDOWN_S={self.shutdown_s:g})"
                )
            else:
                log.warning("stall: %s", text)
