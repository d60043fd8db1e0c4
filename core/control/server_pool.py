"""The scheduler's side of summation servers that leave and join a running job.

With ``FASTPS_ELASTIC_SERVERS=1`` a server that dies (or says bye) while workers still
train does not abort the job, and a server that registers after the membership went out is
admitted. Either way the scheduler starts a new *server epoch*: it tells every worker the
servers that are now in the job (``servers``), each worker moves to a data-plane core
connected to exactly those servers and reports, per tensor name, the last round it
completed and the last round it started (``reroute_report``). From the reports the
scheduler computes which rounds must be summed again on the new servers (``reroute_plan``):
every round that some worker started but did not complete. The worker side is
``core/worker/rerouting.py``; docs/guide/elastic.md explains why that is exactly the set
of rounds whose sum may be missing somewhere, and why no round is counted twice.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Protocol, Set, Tuple

if TYPE_CHECKING:  # the scheduler imports this module
    from fastps.control.scheduler import _Conn

log = logging.getLogger("fastps.scheduler")

# The highest server id a joining server may take (ids order the servers for placement).
MAX_SERVER_ID = 4095


def redo_plan(reports: Dict[int, Dict[str, Any]]) -> Tuple[Dict[str, List[int]], Optional[str]]:
    """``{name: [lo, hi]}``: rounds lo+1..hi of ``name`` are summed again, from every
    worker's report ``{name: [done, started]}``. Returns (plan, None) or ({}, a
    description of the inconsistent report).

    A worker reports only the names it has a push_pull of in flight (started > done): one
    with nothing in flight changes neither bound. Its done round cannot be the lowest --
    a worker in flight with a lower one would be waiting for a round this worker completed
    without pushing -- nor can it have started anything beyond the others' rounds."""
    names: Set[str] = set()
    for rounds in reports.values():
        names.update(rounds)
    plan: Dict[str, List[int]] = {}
    for name in sorted(names):
        dones, starts = [], []
        for rank, rounds in sorted(reports.items()):
            if name not in rounds:
                continue
            done, started = rounds[name]
            if not (isinstance(done, int) and isinstance(started, int) and 0 <= done <= started):
                return {}, f"worker {rank} reported rounds {[done, started]!r} for tensor {name!r}"
            dones.append(done)
            starts.append(started)
        lo, hi = min(dones), max(starts)
        # One push_pull per name is in flight per worker and a round completes only once
        # every worker pushed it, so the workers are never more than two rounds apart.
        if hi - lo > 2:
            return {}, (
                f"tensor {name!r}: workers report rounds {lo} to {hi} (more than two apart); "
                "it is not pushed by every worker in the same order"
            )
        if hi > lo:
            plan[name] = [lo, hi]
    return plan, None


class PoolHost(Protocol):
    """What the pool asks of the scheduler that owns it (from the scheduler's thread)."""

    def live_servers(self) -> Dict[int, _Conn]:
        """The servers registered, connected and not leaving, by id."""

    def live_workers(self) -> Dict[int, _Conn]:
        """The workers registered, connected and not leaving, by rank."""

    def may_change_servers(self) -> bool:
        """Whether the job is running (membership sent, not ending or aborted)."""

    def server(self, sid: int) -> Optional[_Conn]:
        """Server ``sid``'s connection, or None."""

    def forget_server(self, sid: int) -> None:
        """Drops server ``sid`` from the job."""

    def membership(self) -> Dict[str, Any]:
        """The membership message as a server that joins now must see it."""

    def send(self, conn: _Conn, msg: Dict[str, Any]) -> None: ...

    def fail_job(self, reason: str) -> None:
        """Aborts the job with ``reason``."""

    def reject(self, conn: _Conn, text: str) -> None:
        """A malformed message from ``conn``."""


class ServerPool:
    """Owned by a :class:`~fastps.control.scheduler.Scheduler` whose job has elastic
    servers; reaches it only through :class:`PoolHost`."""

    def __init__(self, host: PoolHost) -> None:
        self._host = host
        self.epoch = 0
        self._reports: Dict[int, Dict[str, Any]] = {}
        self._waiting: set = set()

    def live_servers(self) -> Dict[int, _Conn]:
        return self._host.live_servers()

    def server_gone(self, conn: _Conn, why: str) -> bool:
        """A server died or left. True: handled (the job goes on); False: the caller aborts
        (no server would remain, or the job is already ending)."""
        h = self._host
        if not h.may_change_servers():
            return False
        sid = conn.node_id
        if sid is None or h.server(sid) is not conn:
            return True  # already replaced or removed
        others = {k: c for k, c in h.live_servers().items() if k != sid}
        if not others:
            return False
        h.forget_server(sid)
        self._announce(f"{conn.label} {why}")
        return True

    def admit(self, conn: _Conn) -> None:
        """A server registered after the membership went out: it joins from the next epoch."""
        self._host.send(conn, self._host.membership())
        self._announce(f"{conn.label} joined")

    def _announce(self, why: str) -> None:
        h = self._host
        self.epoch += 1
        servers = h.membership()["servers"]
        log.warning("server epoch %d (%s): servers %s", self.epoch, why, [x["id"] for x in servers])
        self._reports = {}
        workers = h.live_workers()
        self._waiting = set(workers)
        msg = {"type": "servers", "epoch": self.epoch, "servers": servers, "why": why}
        for r in self._waiting:
            h.send(workers[r], msg)
        for c in h.live_servers().values():
            h.send(c, msg)

    def report(self, conn: _Conn, msg: Dict[str, Any]) -> None:
        """A worker's rounds for the announced epoch; the plan goes out once all reported."""
        epoch, rounds = msg.get("epoch"), msg.get("rounds")
        if conn.role != "worker" or conn.node_id is None or not isinstance(rounds, dict):
            self._host.reject(conn, "invalid reroute_report message")
            return
        if epoch != self.epoch or conn.node_id not in self._waiting:
            return  # an older epoch's report: a newer announcement replaced it
        self._reports[conn.node_id] = {
            str(k): tuple(v) if isinstance(v, list) and len(v) == 2 else (-1, -1)
            for k, v in rounds.items()
        }
        self._waiting.discard(conn.node_id)
        self._maybe_plan()

    def _maybe_plan(self) -> None:
        h = self._host
        if self._waiting or not self._reports:
            return
        plan, error = redo_plan(self._reports)
        if error is not None:
            h.fail_job(f"cannot move the job to the new servers: {error}")
            return
        log.info("server epoch %d: %d tensors summed again", self.epoch, len(plan))
        out = {"type": "reroute_plan", "epoch": self.epoch, "redo": plan}
        workers = h.live_workers()
        for r in self._reports:
            worker = workers.get(r)
            if worker is not None:
                h.send(worker, out)

    def worker_gone(self, rank: int) -> None:
        """A worker that finished no longer owes a report."""
        self._waiting.discard(rank)
        self._reports.pop(rank, None)
        self._maybe_plan()
