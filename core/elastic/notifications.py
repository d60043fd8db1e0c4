"""Host-update notifications in a worker (Horovod's ``WorkerNotificationManager``).

A daemon thread keeps one ``watch`` request open at fastpsrun's elastic driver; when the
driver's host epoch moves (a worker started on a new slot, one failed or was stopped) it
calls ``on_hosts_updated(epoch, HostUpdateResult)`` on every registered state, which queues
it in ``state._host_messages`` as Horovod does. The commit decision itself does not wait
for this thread: ``State.check_host_updates`` asks the driver directly (rank 0) so every
rank decides alike at the same commit; the queue is for scripts that look at it.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
import weakref
from typing import Any, Optional

from fastps.control import elastic_wire as wire
from fastps.elastic import rendezvous
from fastps.errors import FastPSError

log = logging.getLogger("fastps.elastic")

RETRY_DELAY = 1.0  # after a failed watch request (the driver busy, or gone)
MAX_FAILURES = 30  # consecutive failed requests before the watcher gives up
QUIET_DELAY = 0.2  # after an answer without news


class HostUpdateResult(enum.IntFlag):
    """What changed (Horovod's flags, same values)."""

    no_update = 0
    removed = 1
    added = 2
    mixed = 3


class _Watcher:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listeners: weakref.WeakSet[Any] = weakref.WeakSet()
        self._thread: Optional[threading.Thread] = None

    def register(self, state: Any) -> None:
        """Starts the watcher on first use (only in an elastic worker) and adds ``state``."""
        if not wire.enabled():
            return
        with self._lock:
            self._listeners.add(state)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name="fastps-elastic-watch", daemon=True
                )
                self._thread.start()

    def remove(self, state: Any) -> None:
        with self._lock:
            self._listeners.discard(state)

    def _loop(self) -> None:
        epoch: Optional[int] = None
        failures = 0
        while True:
            with self._lock:
                if not self._listeners:
                    self._thread = None
                    return
            try:
                answer = rendezvous.request(
                    {"type": "watch", "after": epoch}, timeout=rendezvous.WATCH_TIMEOUT
                )
            except FastPSError as exc:
                failures += 1
                if failures >= MAX_FAILURES:
                    log.warning("host-update notifications stopped: %s", exc)
                    with self._lock:
                        self._thread = None
                    return
                time.sleep(RETRY_DELAY)
                continue
            failures = 0
            now = int(answer.get("epoch", 0))
            if epoch is not None and now == epoch:
                # No news: normally after the driver's 20 s; at once when the job is
                # ending. Either way, do not ask again in a tight loop.
                time.sleep(QUIET_DELAY)
            if epoch is not None and now > epoch:
                result = HostUpdateResult.no_update
                if answer.get("added"):
                    result |= HostUpdateResult.added
                if answer.get("removed"):
                    result |= HostUpdateResult.removed
                with self._lock:
                    listeners = list(self._listeners)
                for state in listeners:
                    state.on_hosts_updated(now, result)
            epoch = now


_watcher = _Watcher()


def register_listener(state: Any) -> None:
    _watcher.register(state)


def remove_listener(state: Any) -> None:
    _watcher.remove(state)
