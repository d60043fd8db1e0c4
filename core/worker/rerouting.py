"""A worker's data plane that goes on when summation servers leave or join (the worker side
of ``core/control/server_pool.py``; docs/guide/elastic.md, "Servers that leave and join").

:class:`ReroutingWorker` stands where ``fastps._core.Worker`` stands (same methods), over
one core per *server epoch*. When the scheduler announces new servers it:

1. aborts the current core (a dead server already failed it) and sorts its push_pulls
   into completed ones and lost ones (started, result not all in);
2. reports, per tensor name, the last round it completed and the last it started;
3. receives the plan (rounds ``lo+1..hi`` of each name that some worker started and not
   every worker completed), starts a core connected to the new servers (new weights from
   ``core/control/placement.py``; tensor names carry the epoch, so no part meets a half-summed
   round the old core left on a surviving server), and sums those rounds again:
   its own lost push_pulls from a copy of their input (an in-place push_pull may already
   hold part of the old sum), and rounds it had completed but another worker had not
   from the same copies, their results dropped (a *replay*). Every worker contributes
   each redone round exactly once, so the sum is complete and counted once.

The copies are why this is opt-in (``FASTPS_ELASTIC_SERVERS=1``): every push_pull copies
its input, and the last two rounds of each name are kept. Routed push_pulls (collectives
of ``fastps.collectives`` other than sums) are not redone: one in flight during a server
change fails with an error naming it.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from fastps.errors import FastPSAbort, FastPSError, FastPSTimeoutError

log = logging.getLogger("fastps.elastic")

# How long a push_pull the core failed waits to learn whether a server change caused it.
CHANGE_NOTICE_WAIT = 5.0
# How long the change waits for the old core's waiters to see its abort.
WAITERS_DRAIN = 10.0


class _Op:
    """One push_pull as the user sees it (``kind`` "user") or a replay ("replay")."""

    def __init__(self, row: Tuple[Any, ...], kind: str = "user") -> None:
        self.row = row
        self.name: str = row[4]
        self.routed = len(row) == 10 and (int(row[9]) > 0 or not row[7] or not row[8])
        self.kind = kind
        self.round = 0
        self.copy: Optional[np.ndarray] = None  # the input as it was when submitted
        self.scratch: Optional[np.ndarray] = None  # a replay's result, dropped
        self.core: Any = None
        self.cid = -1
        # deferred (waits for a change to end) -> running -> done | lost | failed
        self.state = "deferred"
        self.waiter = False
        self.error: Optional[BaseException] = None
        self.lost_at = 0.0

    def lose(self, error: BaseException) -> None:
        self.state, self.error, self.lost_at = "lost", error, time.monotonic()


def _copy_of(ptr: int, nbytes: int) -> np.ndarray:
    buf = np.empty(nbytes, dtype=np.uint8)
    if nbytes:
        ctypes.memmove(buf.ctypes.data, ptr, nbytes)
    return buf


class ReroutingWorker:
    """``build(servers, epoch)`` starts a core connected to ``servers`` (the scheduler's
    server records); ``client`` is the worker's ControlClient."""

    def __init__(
        self,
        build: Callable[[List[Dict[str, Any]], int], Any],
        client: Any,
        servers: List[Dict[str, Any]],
        rank: int,
        op_timeout: float,
        keep_s: float = 60.0,
    ) -> None:
        self._build = build
        self._client = client
        self._rank = rank
        self._cv = threading.Condition()
        self._core: Any = build(servers, 0)
        self._epoch = 0
        self._announced: Tuple[int, List[Dict[str, Any]]] = (0, servers)
        self._plans: Dict[int, Dict[str, List[int]]] = {}
        self._changing = False
        self._closed = False
        self._aborted: Optional[str] = None
        self._ops: Dict[int, _Op] = {}
        self._next_id = 1
        self._started: Dict[str, int] = {}
        self._done: Dict[str, int] = {}
        self._copies: Dict[str, Dict[int, np.ndarray]] = {}
        self._meta: Dict[str, Tuple[str, int, float]] = {}  # name -> dtype, priority, scale
        self._op_timeout = op_timeout
        # A completed round's copy is kept this long: another worker may lack its sum until
        # the scheduler notices the server that died answering (bounded by its heartbeat
        # timeout). Names used once (anonymous collectives) so do not pile up copies.
        self._keep_s = keep_s
        self._expiry: collections.deque = collections.deque()  # (when, name, round)
        self._thread: Optional[threading.Thread] = None
        # Each change: its epoch, seconds, push_pulls resent and replayed (tests, benchmarks).
        self.changes: List[Dict[str, Any]] = []
        client.on_message("servers", self._on_servers)
        client.on_message("reroute_plan", self._on_plan)

    # ------------------------------------------------------------ submitting
    def push_pull(
        self,
        in_ptr: int,
        out_ptr: int,
        nbytes: int,
        dtype: str,
        name: str,
        priority: int,
        scale: float,
        send: bool = True,
        receive: bool = True,
        pushers: int = 0,
        mode: int = 0,
        compression: str = "",
    ) -> int:
        if mode:
            raise FastPSError(
                f"tensor '{name}': async mode and quorum exchanges are not available with "
                "elastic servers (FASTPS_ELASTIC_SERVERS=1)"
            )
        row = (in_ptr, out_ptr, nbytes, dtype, name, priority, scale, send, receive, pushers)
        return self.push_pull_group([(*row, compression)])[0]

    def push_pull_group(self, rows: Sequence[Tuple[Any, ...]]) -> List[int]:
        for r in rows:
            # Compressed rounds carry residuals in the core that a rerouted round would
            # apply twice; refuse rather than sum wrong.
            if len(r) > 10 and r[10]:
                raise FastPSError(
                    f"tensor '{r[4]}': compression ({r[10]}) is not available with elastic "
                    "servers (FASTPS_ELASTIC_SERVERS=1)"
                )
        ops = [_Op(tuple(r[:10])) for r in rows]
        with self._cv:
            if self._aborted is not None:
                raise FastPSAbort(self._aborted)
            if self._closed:
                raise FastPSError("fastps was shut down")
            self._drop_old_copies()
            for op in ops:
                if op.routed:
                    continue
                op.round = self._started.get(op.name, 0) + 1
                self._meta[op.name] = (str(op.row[3]), int(op.row[5]), float(op.row[6]))
                op.copy = _copy_of(int(op.row[0]), int(op.row[2]))
            ids = []
            for op in ops:
                ids.append(self._next_id)
                self._ops[self._next_id] = op
                self._next_id += 1
            if not self._changing:
                try:
                    self._submit(ops, from_copy=False)
                except ValueError:
                    for i in ids:
                        del self._ops[i]
                    raise
            for op in ops:
                if not op.routed:
                    self._started[op.name] = op.round
                    kept = self._copies.setdefault(op.name, {})
                    kept[op.round] = op.copy  # type: ignore[assignment]
                    kept.pop(op.round - 2, None)
        return ids

    def _core_name(self, name: str) -> str:
        # A new epoch's core must not meet the partial sums the old one left on a server.
        return f"{name}@servers{self._epoch}" if self._epoch else name

    def _submit(self, ops: Sequence[_Op], from_copy: bool) -> None:
        """Starts ``ops`` on the current core (called with the lock held)."""
        core = self._core
        rows = []
        for op in ops:
            row = list(op.row)
            if from_copy and op.copy is not None:
                row[0] = op.copy.ctypes.data
            if op.kind == "replay":
                assert op.scratch is not None
                row[1] = op.scratch.ctypes.data
            row[4] = self._core_name(op.name)
            rows.append(tuple(row) if len(row) == 10 and op.routed else tuple(row[:7]))
        try:
            cids = core.push_pull_group(rows)
        except ValueError:
            raise
        except Exception as exc:  # noqa: BLE001 - the core failed: a change may redo them
            for op in ops:
                op.core = core
                op.lose(exc)
                if op.routed:  # not redone (module docstring)
                    op.state = "failed"
            self._cv.notify_all()
            return
        for op, cid in zip(ops, cids):
            op.core, op.cid, op.state = core, int(cid), "running"
        self._cv.notify_all()

    def set_fusion_plan(self, plan: str, members: Sequence[Tuple[str, int, str, int]]) -> int:
        """Fusion is off with elastic servers: a fused bucket could not be redone alone."""
        return 0

    # --------------------------------------------------------------- waiting
    def poll(self, hid: int) -> bool:
        with self._cv:
            op = self._op(hid)
            if op.state in ("done", "failed"):
                return True
            if op.state != "running":
                return False
            core, cid = op.core, op.cid
        try:
            return bool(core.poll(cid))
        except Exception:  # noqa: BLE001 - its wait reports what happened
            return True

    def _op(self, hid: int) -> _Op:
        op = self._ops.get(hid)
        if op is None:
            raise ValueError(f"unknown push_pull handle {hid}")
        return op

    def wait(self, hid: int, timeout_s: float) -> int:
        """Like ``Worker.wait``; returns the quorum lag, always 0 here (an elastic-server
        job reroutes parts between servers and runs no quorum catch-up)."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._cv:
                op = self._op(hid)
                while True:
                    if op.state == "done":
                        del self._ops[hid]
                        return 0
                    if op.state == "failed":
                        del self._ops[hid]
                        assert op.error is not None
                        raise op.error
                    if op.state == "running" and not op.waiter:
                        op.waiter = True
                        core, cid = op.core, op.cid
                        break
                    if op.state == "lost" and not self._change_coming(op):
                        op.state = "failed"
                        continue
                    left = deadline - time.monotonic()
                    if left <= 0:
                        del self._ops[hid]
                        raise FastPSTimeoutError(
                            f"push_pull of tensor '{op.name}' on worker {self._rank} did not "
                            f"complete within {timeout_s:g} s (state: {op.state}, while the "
                            "job's servers changed)"
                        )
                    self._cv.wait(min(left, 0.25))
            error: Optional[BaseException] = None
            try:
                core.wait(cid, max(deadline - time.monotonic(), 0.001))
            except ValueError:
                with self._cv:
                    op.waiter = False
                raise
            except Exception as exc:  # noqa: BLE001 - sorted below
                error = exc
            with self._cv:
                op.waiter = False
                if error is None:
                    self._finish(op)
                elif op.state == "running":
                    op.error = error
                    # A timeout, a tensor's own failure or a routed op is not redone.
                    redo = (
                        not op.routed
                        and not isinstance(error, FastPSTimeoutError)
                        and bool(core.error())
                    )
                    if redo:
                        op.lose(error)
                    else:
                        op.state = "failed"
                self._cv.notify_all()

    def _change_coming(self, op: _Op) -> bool:
        """Whether a lost push_pull will be redone: a server change was announced after its
        core started, none of the job's own failures came, and one came soon enough."""
        if self._aborted is not None or self._client.abort_reason is not None:
            if op.error is None:
                op.error = FastPSAbort(self._aborted or self._client.abort_reason)
            return False
        if self._announced[0] > self._epoch or self._changing:
            return True
        return time.monotonic() - op.lost_at < CHANGE_NOTICE_WAIT

    def _finish(self, op: _Op) -> None:
        op.state = "done"
        if not op.routed:
            self._done[op.name] = max(self._done.get(op.name, 0), op.round)
            if op.kind == "user":
                self._expiry.append((time.monotonic() + self._keep_s, op.name, op.round))

    def _drop_old_copies(self) -> None:
        """Forgets the copies of rounds completed more than keep_s ago (lock held)."""
        now = time.monotonic()
        while self._expiry and self._expiry[0][0] < now:
            _, name, rnd = self._expiry.popleft()
            kept = self._copies.get(name)
            if kept is not None and rnd <= self._done.get(name, 0):
                kept.pop(rnd, None)
                if not kept:
                    del self._copies[name]

    def release(self, hid: int) -> None:
        with self._cv:
            op = self._ops.pop(hid, None)
        if op is not None and op.state == "running" and not op.waiter:
            try:
                op.core.release(op.cid)
            except Exception:  # noqa: BLE001 - a retired core forgot it already
                pass

    # ------------------------------------------------------------- the rest
    def abort(self, reason: str, quiet: bool = False) -> None:
        with self._cv:
            self._aborted = reason
            core = self._core
            self._cv.notify_all()
        if core is not None:
            core.abort(reason, quiet)

    def error(self) -> str:
        if self._aborted is not None:
            return self._aborted
        core = self._core
        return "" if core is None or self._changing else str(core.error())

    def part_layout(self, name: str, nbytes: int, elem_size: int) -> Any:
        return self._core.part_layout(self._core_name(name), nbytes, elem_size)

    def stats(self) -> Dict[str, Any]:
        core = self._core
        out = dict(core.stats()) if core is not None else {}
        out["server_epoch"] = self._epoch
        return out

    def local_reduce(self) -> bool:
        return False

    def server_epoch(self, wait_for: int = 0, timeout: float = 0.0) -> int:
        """The server epoch this worker runs in; with ``wait_for``, first waits (at most
        ``timeout`` s) until it reached that epoch and no change is under way."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while (self._epoch < wait_for or self._changing) and time.monotonic() < deadline:
                self._cv.wait(min(0.1, max(deadline - time.monotonic(), 0.001)))
            return self._epoch

    def shutdown(self) -> None:
        with self._cv:
            self._closed = True
            core = self._core
            self._cv.notify_all()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=WAITERS_DRAIN)
        if core is not None:
            core.shutdown()

    # --------------------------------------------------- a change of servers
    def _on_servers(self, msg: Dict[str, Any]) -> None:
        """The scheduler's announcement (receiver thread): the change runs on a thread of
        its own, since its plan arrives on the receiver thread."""
        epoch, servers = int(msg.get("epoch", 0)), list(msg.get("servers") or [])
        with self._cv:
            if epoch <= self._announced[0] or self._closed:
                return
            self._announced = (epoch, servers)
            log.warning(
                "worker %d: servers change (epoch %d): %s", self._rank, epoch, msg.get("why")
            )
            self._cv.notify_all()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._change_loop, name="fastps-server-change", daemon=True
                )
                self._thread.start()

    def _on_plan(self, msg: Dict[str, Any]) -> None:
        with self._cv:
            self._plans[int(msg.get("epoch", 0))] = dict(msg.get("redo") or {})
            self._cv.notify_all()

    def _change_loop(self) -> None:
        while True:
            with self._cv:
                epoch, servers = self._announced
                if epoch <= self._epoch or self._closed or self._aborted is not None:
                    self._changing = False
                    self._cv.notify_all()
                    return
            started = time.monotonic()
            try:
                self._change(epoch, servers, started)
            except Exception as exc:  # noqa: BLE001 - the job cannot go on: say why
                with self._cv:
                    # Another change (a second server lost) may have failed this one; the
                    # scheduler's word on it can be a moment behind the failure.
                    def moved_on(e: int = epoch) -> bool:
                        return self._announced[0] > e or self._closed

                    self._cv.wait_for(moved_on, CHANGE_NOTICE_WAIT)
                    if self._announced[0] > epoch and not self._closed:
                        continue  # move to the newest servers
                reason = f"worker {self._rank} could not move to the new servers: {exc}"
                log.error("%s", reason)
                self._client.send_abort(reason)
                self.abort(reason)
                return

    def _change(self, epoch: int, servers: List[Dict[str, Any]], started: float) -> None:
        """Moves to the servers of ``epoch`` (unless a newer change replaces this one) and
        records in ``changes`` how long it took and how many push_pulls it resent and
        replayed."""
        deadline = time.monotonic() + self._client_timeout()
        with self._cv:
            old = self._core
            self._changing = True
        if old is not None:
            old.abort(f"the job's servers changed (epoch {epoch})", True)
        with self._cv:
            # Waiters on the old core see its abort at once; then this thread sorts the rest.
            drain_until = time.monotonic() + WAITERS_DRAIN
            while any(op.waiter and op.core is old for op in self._ops.values()):
                if time.monotonic() > drain_until:
                    raise FastPSError("a push_pull of the old servers did not finish its wait")
                self._cv.wait(0.05)
            for hid, op in list(self._ops.items()):
                if op.core is not old or op.state != "running":
                    continue
                try:
                    old.wait(op.cid, 1.0)
                    self._finish(op)
                except Exception as exc:  # noqa: BLE001 - lost with the old core
                    op.lose(exc)
                    if op.routed:
                        op.state = "failed"
                        op.error = FastPSAbort(
                            f"routed push_pull of '{op.name}' was running when the job's servers "
                            "changed; routed collectives are not redone"
                        )
                if op.kind == "replay" and op.state != "running":
                    del self._ops[hid]
            self._core = None
            # Everything started so far is in the report; a push_pull not yet started on a
            # core counts as lost (it is redone like one), later ones start normally.
            for op in self._ops.values():
                if op.state == "deferred" and not op.routed:
                    op.lose(FastPSError("started while the job's servers changed"))
            # Only names in flight here: see server_pool.redo_plan for why that suffices.
            rounds = {
                name: [self._done.get(name, 0), started]
                for name, started in self._started.items()
                if started > self._done.get(name, 0)
            }
        if old is not None:
            old.shutdown()
        self._client.send_message({"type": "reroute_report", "epoch": epoch, "rounds": rounds})
        with self._cv:
            while epoch not in self._plans:
                if self._announced[0] > epoch:
                    return  # a newer change replaces this one
                if self._client.abort_reason is not None or self._aborted is not None:
                    raise FastPSAbort(str(self._client.abort_reason or self._aborted))
                if time.monotonic() > deadline:
                    raise FastPSTimeoutError(f"no reroute plan for server epoch {epoch} in time")
                self._cv.wait(0.1)
            plan = self._plans.pop(epoch)
        core = self._build(servers, epoch)
        with self._cv:
            if self._closed:  # shut down while this core connected
                core.shutdown()
                return
            self._core, self._epoch = core, epoch
            lost = {(op.name, op.round): op for op in self._ops.values() if op.state == "lost"}
            first: List[_Op] = []
            second: List[_Op] = []
            for name, (lo, hi) in sorted(plan.items()):
                for r, phase in ((lo + 1, first), (lo + 2, second)):
                    if r > hi:
                        continue
                    mine = lost.pop((name, r), None)
                    if mine is not None:
                        phase.append(mine)
                    elif r <= self._done.get(name, 0):
                        phase.append(self._replay(name, r))
            for (name, r), op in lost.items():
                op.state = "failed"
                op.error = FastPSError(
                    f"tensor '{name}' round {r} was lost with the old servers and is not in "
                    "the scheduler's plan"
                )
            if first:
                self._submit(first, from_copy=True)
            replays = [op for op in first if op.kind == "replay"]
        for op in replays:
            # Replays are rounds every worker started, so they finish without anybody's
            # next step; their results are dropped.
            if op.state != "running":
                raise FastPSError(f"could not replay tensor '{op.name}' round {op.round}")
            core.wait(op.cid, max(deadline - time.monotonic(), 0.001))
        with self._cv:
            for op in replays:
                for hid, o in list(self._ops.items()):
                    if o is op:
                        del self._ops[hid]
            if second:
                self._submit(second, from_copy=True)
            deferred = [op for op in self._ops.values() if op.state == "deferred"]
            if deferred:
                self._submit(deferred, from_copy=True)
            counts = {"resent": len(first) + len(second) - len(replays), "replayed": len(replays)}
            self.changes.append({"epoch": epoch, "seconds": time.monotonic() - started, **counts})
            self._changing = False
            self._cv.notify_all()
        log.warning(
            "worker %d: on the new servers (epoch %d): %d push_pulls resent, %d rounds "
            "another worker lacked replayed",
            self._rank,
            epoch,
            counts["resent"],
            counts["replayed"],
        )

    def _replay(self, name: str, r: int) -> _Op:
        copy = self._copies.get(name, {}).get(r)
        if copy is None:
            raise FastPSError(f"tensor '{name}': no copy of round {r} left to sum again")
        row = self._replay_row(name, r, copy)
        op = _Op(row, kind="replay")
        op.round, op.copy = r, copy
        op.scratch = np.empty_like(copy)
        self._ops[self._next_id] = op
        self._next_id += 1
        return op

    def _replay_row(self, name: str, r: int, copy: np.ndarray) -> Tuple[Any, ...]:
        meta = self._meta.get(name)
        if meta is None:
            raise FastPSError(f"tensor '{name}': nothing known about it to replay round {r}")
        dtype, priority, scale = meta
        return (copy.ctypes.data, copy.ctypes.data, copy.nbytes, dtype, name, priority, scale)

    def _client_timeout(self) -> float:
        return self._op_timeout
