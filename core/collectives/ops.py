"""Every collective of fastps, once, on host arrays: the layer the framework plugins adapt.

A plugin turns its tensor into a numpy array over the same host memory (``dtype`` names the
element type, so bfloat16 travels as uint16 bits), calls an ``*_async`` function here, and
turns the returned :class:`Op`'s numpy result back into a tensor. Nothing here knows a
framework.

How an op runs (``docs/design/architecture.md``, "Collectives"):

1. **Announce.** The op's record (kind, dtype, shape, reduce op, root, splits, scale
   factors) goes to the scheduler under the op's name (``core/control/coordinator.py``); this
   never waits. A duplicate name still in flight raises ``ValueError`` at once.
2. **Check.** When every member of the process set has announced that name, each member
   gets all records and checks them with :func:`_check_records`, the same function on every
   rank, so a mismatch raises the same error (both values named) on every rank and no data
   moves: the job stays usable.
3. **Move the data** on the C++ data plane, started from the scheduler connection's
   receiver thread so an op nobody waits for still completes. Two primitives:
   :func:`_push_sum` (a push_pull) and :func:`_route` (routed parts: a block forwarded
   from its sender to the ranks that want it, or a sum only some ranks receive), so each
   op moves each byte once (``docs/design/architecture.md``, "Bytes on the wire"). Sets other
   than the global one are routed too: the servers count only the set's pushes.
4. **Finish** in :meth:`Op.synchronize`: local post-processing (slicing, Min/Max/Product,
   integer scaling).
"""

from __future__ import annotations

import enum
import logging
import pickle
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from fastps.collectives import adasum
from fastps.collectives.anon_names import Numbering, number_of
from fastps.control.coordinator import JOIN
from fastps.errors import (  # noqa: F401 - re-exported: the collective layer's errors
    CollectiveError,
    FastPSError,
    FastPSTimeoutError,
    HorovodInternalError,
    HostsUpdatedInterrupt,
    UsageError,
)
from fastps.worker import api
from fastps.worker.buffers import raw_buffer
from fastps.worker.compression import spec_for as compression_spec_for
from fastps.worker.waitable import Waitable

log = logging.getLogger("fastps.collectives")

__all__ = [
    "ReduceOp",
    "CollectiveError",
    "UsageError",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "ProcessSet",
    "global_process_set",
    "add_process_set",
    "remove_process_set",
    "add_member_process_set",
    "forget_member_process_set",
    "Op",
    "resolve_op",
    "priority_for",
    "DTYPES",
    "allreduce_async",
    "grouped_allreduce_async",
    "allgather_async",
    "grouped_allgather_async",
    "broadcast_async",
    "alltoall_async",
    "reducescatter_async",
    "grouped_reducescatter_async",
    "reduce_async",
    "reduce_rows",
    "barrier",
    "join",
    "broadcast_object",
    "allgather_object",
    "start_session",
    "end_session",
    "check_same_everywhere",
]


class ReduceOp(enum.IntEnum):
    """How an allreduce combines the workers' tensors (Horovod's numbering)."""

    AVERAGE = 0
    SUM = 1
    ADASUM = 2
    MIN = 3
    MAX = 4
    PRODUCT = 5


# Core dtype name -> numpy dtype of the array a plugin hands in (bfloat16 as its bits).
DTYPES: Dict[str, np.dtype] = {
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(np.uint16),
    "int8": np.dtype(np.int8),
    "int16": np.dtype(np.int16),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
    "uint8": np.dtype(np.uint8),
    "bool": np.dtype(np.bool_),
}
_FLOATS = ("float32", "float64", "float16", "bfloat16")
# Allreduce ops the servers cannot compute: every rank's tensor is gathered, reduced locally.
_GATHERED_OPS = (ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT, ReduceOp.ADASUM)


def resolve_op(op: Optional[int], average: Optional[bool]) -> ReduceOp:
    """Horovod's op argument, with the deprecated ``average`` flag."""
    if average is not None:
        if op is not None:
            raise UsageError("pass either op or the deprecated average argument, not both")
        return ReduceOp.AVERAGE if average else ReduceOp.SUM
    if op is None:
        return ReduceOp.AVERAGE
    try:
        return ReduceOp(int(op))
    except ValueError:
        raise UsageError(f"unknown reduction op {op!r}") from None


def priority_for(position: int, count: int) -> int:
    """The one priority formula: the ``position``-th of ``count`` tensors in forward order
    (0 = used first by the next forward pass) goes first (P3): ``count - position``."""
    return int(count) - int(position)


# --------------------------------------------------------------------------- process sets


class ProcessSet:
    """A subset of the ranks; collectives with ``process_set=`` run among them only."""

    def __init__(self, ranks: Optional[Sequence[int]] = None) -> None:
        self._ranks = None if ranks is None else sorted({int(r) for r in ranks})
        self.process_set_id: Optional[int] = 0 if ranks is None else None

    @property
    def ranks(self) -> List[int]:
        return list(range(api.size())) if self._ranks is None else list(self._ranks)

    def size(self) -> int:
        return len(self.ranks)

    def rank(self) -> int:
        """This worker's rank within the set."""
        ranks = self.ranks
        me = api.rank()
        if me not in ranks:
            raise UsageError(f"rank {me} is not a member of process set {self.ranks}")
        return ranks.index(me)

    def included(self) -> bool:
        return api.rank() in self.ranks

    @property
    def sid(self) -> int:
        """The registered set's id (collectives only run on registered sets)."""
        if self.process_set_id is None:
            raise UsageError(f"{self!r} is not registered (hvd.add_process_set)")
        return self.process_set_id

    def __repr__(self) -> str:
        if self._ranks is None:
            return "ProcessSet(global)"
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self._ranks})"


global_process_set = ProcessSet(None)
# Ids of sets registered by their members alone (add_member_process_set) start here, far
# above the ones add_process_set counts up from 1.
MEMBER_SET_IDS = 1 << 20


# --------------------------------------------------------------------------- session


class _Session:
    """What an init/shutdown pair of a plugin owns: process sets, names in flight, counters."""

    def __init__(self) -> None:
        self.lock = threading.RLock()  # Op.poll releases names while a caller holds it
        self.sets: Dict[int, ProcessSet] = {0: global_process_set}
        self.next_set = 1
        # Anonymous-op counters: by set id, and by ("barrier", set id).
        self.counters: Dict[Any, Any] = {}
        self.inflight: Dict[Tuple[int, str], Op] = {}
        self.stand_ins: List[Any] = []  # data-plane work done while joined
        self.join_pending: Dict[int, Tuple[Dict[str, Any], threading.Event]] = {}


_session: Optional[_Session] = None
_session_lock = threading.Lock()


def start_session(process_sets: Optional[Sequence[Any]] = None) -> None:
    """Called by a plugin's ``init`` once the core is initialized. ``process_sets`` are
    registered in order (every rank must pass the same list)."""
    global _session
    with _session_lock:
        if _session is None:
            _session = _Session()
    for ps in process_sets or ():
        add_process_set(ps)


def end_session(timeout: Optional[float] = None) -> None:
    """Waits (bounded) for the ops still in flight and forgets the session's state."""
    global _session
    with _session_lock:
        s, _session = _session, None
    if s is None:
        return
    client = api._st().client if api.is_initialized() else None
    for set_id in list(s.join_pending):
        ps = s.sets.get(set_id)
        if client is not None and ps is not None:
            client.withdraw(set_id, ps.ranks, JOIN)
    for op in list(s.inflight.values()):
        try:
            op.synchronize(timeout)
        except Exception as exc:  # noqa: BLE001 - the owner never asked for it
            log.debug("op %r ended with %s at shutdown", op.name, exc)
    for set_id, ps in list(s.sets.items()):
        if set_id != 0:
            ps.process_set_id = None


def process_set_by_id(process_set_id: int) -> Optional[ProcessSet]:
    """The process set of this session with id ``process_set_id``, or None."""
    return _sess().sets.get(int(process_set_id))


def _sess() -> _Session:
    api._st()  # raises "not initialized" first
    s = _session
    if s is None:
        raise UsageError("fastps has not been initialized; use hvd.init()")
    return s


def add_process_set(ranks: Any) -> ProcessSet:
    """Registers a process set (a ProcessSet or a list of ranks). Every rank must add the
    same sets in the same order; the set ids follow that order."""
    s = _sess()
    ps = ranks if isinstance(ranks, ProcessSet) else ProcessSet(list(ranks))
    if ps._ranks is None:
        raise UsageError("the global process set is always registered")
    size = api.size()
    bad = [r for r in ps._ranks if not 0 <= r < size]
    if bad or not ps._ranks:
        raise UsageError(f"process set ranks {ps._ranks} must be non-empty ranks of 0..{size - 1}")
    with s.lock:
        for other in s.sets.values():
            if other._ranks == ps._ranks:
                raise UsageError(f"a process set with ranks {ps._ranks} is already registered")
        ps.process_set_id = s.next_set
        s.sets[s.next_set] = ps
        s.next_set += 1
    # Registration is collective: the ranks agree on the set (and its id) before use.
    _run_control_op(
        global_process_set,
        f"add_process_set.{ps.sid}",
        {"k": "add_process_set", "ranks": ps._ranks},
    )
    return ps


def remove_process_set(ps: ProcessSet) -> bool:
    """Unregisters ``ps`` (collective, like adding it). False if it was not registered."""
    s = _sess()
    set_id = ps.process_set_id
    if set_id in (None, 0):
        return False
    with s.lock:
        if s.sets.get(set_id) is not ps:
            return False
    _run_control_op(
        global_process_set,
        f"remove_process_set.{set_id}",
        {"k": "remove_process_set", "ranks": ps._ranks},
    )
    with s.lock:
        s.sets.pop(set_id, None)
        s.counters.pop(set_id, None)
    client = api._st().client
    if client is not None and api.rank() == 0:
        client.forget_set(set_id, ps.ranks)
    ps.process_set_id = None
    return True


def add_member_process_set(ranks: Sequence[int], process_set_id: int) -> ProcessSet:
    """Registers a set whose id its members agreed on elsewhere (torch.distributed's
    ``new_group``: only the members create it, and the store numbered it). Collective among
    the members only; the id must not be one :func:`add_process_set` hands out (they count
    from 1; callers use ids from ``MEMBER_SET_IDS``)."""
    s = _sess()
    ps = ProcessSet(list(ranks))
    size = api.size()
    if not ps._ranks or any(not 0 <= r < size for r in ps._ranks):
        raise UsageError(f"process set ranks {ps._ranks} must be non-empty ranks of 0..{size - 1}")
    if process_set_id < MEMBER_SET_IDS:
        raise UsageError(f"member-agreed process set ids start at {MEMBER_SET_IDS}")
    with s.lock:
        old = s.sets.get(process_set_id)
        if old is not None:
            if old._ranks != ps._ranks:
                raise UsageError(
                    f"process set id {process_set_id} is registered with ranks {old._ranks}, "
                    f"not {ps._ranks}"
                )
            return old
        ps.process_set_id = process_set_id
        s.sets[process_set_id] = ps
    try:
        _run_control_op(
            ps, f"add_process_set.{process_set_id}", {"k": "add_process_set", "ranks": ps._ranks}
        )
    except BaseException:
        with s.lock:
            s.sets.pop(process_set_id, None)
        ps.process_set_id = None
        raise
    return ps


def forget_member_process_set(ps: ProcessSet) -> None:
    """This member is done with a set of :func:`add_member_process_set` (no collective:
    members may end at different times)."""
    s = _session
    set_id = ps.process_set_id
    if s is None or set_id is None or set_id < MEMBER_SET_IDS:
        return
    with s.lock:
        if s.sets.get(set_id) is ps:
            del s.sets[set_id]
            s.counters.pop(set_id, None)
    ps.process_set_id = None


def _registered(ps: Optional[ProcessSet]) -> ProcessSet:
    ps = global_process_set if ps is None else ps
    if not isinstance(ps, ProcessSet):
        raise UsageError(f"process_set must be a ProcessSet, got {type(ps).__name__}")
    s = _sess()
    if ps.process_set_id is None or s.sets.get(ps.process_set_id) is not ps:
        raise UsageError(f"{ps!r} is not registered (hvd.add_process_set) in this session")
    if not ps.included():
        raise UsageError(
            f"rank {api.rank()} is not a member of {ps!r}; only its members may "
            "call its collectives"
        )
    return ps


def _op_name(ps: ProcessSet, name: Optional[str]) -> str:
    """Named ops keep their name; anonymous ones are numbered per process set in call
    order, whatever the op, so ranks stay in step even when their ops differ or fail."""
    if name is not None:
        if not isinstance(name, str) or not name:
            raise UsageError(f"op names must be non-empty strings, got {name!r}")
        return name
    s = _sess()
    with s.lock:
        counter = s.counters.setdefault(ps.sid, Numbering())
    return f"noname.{counter.take()}"


def _numbering(s: _Session, ps: ProcessSet, name: str) -> Optional[Tuple[Numbering, int]]:
    """The counter that numbered the anonymous op ``name``, and its number."""
    numbered = number_of(name)
    if numbered is None:
        return None
    kind, number = numbered
    key: Any = ps.sid if kind == "noname" else ("barrier", ps.sid)
    with s.lock:
        counter = s.counters.get(key)
    return None if counter is None else (counter, number)


# --------------------------------------------------------------------------- ops


class Op(Waitable):
    """A collective in progress. ``synchronize()`` waits (bounded) and returns the result."""

    def __init__(self, name: str, ps: ProcessSet) -> None:
        self.name = name
        self.process_set = ps
        self._coordinated = threading.Event()
        self._error: Optional[BaseException] = None
        self._parts: List[Any] = []  # core handles of the data stage
        self._finish: Optional[Callable[[], Any]] = None
        self._finished = False
        self._result: Any = None
        self._lock = threading.Lock()
        # Guards _parts against the data stage still adding to them as the caller gives up.
        self._parts_lock = threading.Lock()
        self._given_up = False
        self._numbered: Optional[Tuple[Numbering, int]] = None  # anonymous ops
        self._withdrawn = False  # announcement taken back before it coordinated
        self._counted = False

    def _count_end(self) -> None:
        """Tells the numbering this op ended (once): its number was used by every rank
        unless this rank withdrew it (core/collectives/anon_names.py)."""
        if self._numbered is not None and not self._counted:
            self._counted = True
            counter, number = self._numbered
            counter.finished(number, self._withdrawn)

    # Called on the scheduler connection's receiver thread (or inline without one).
    def _fail(self, exc: BaseException) -> None:
        self._error = exc
        self._coordinated.set()

    def _wait_coordinated(self, limit: float) -> bool:
        """Waits for the other members; a wait cut short (timeout, Ctrl-C, a test's
        timeout) withdraws this rank's announcement, so the name can be used again."""
        done = False
        try:
            done = self._coordinated.wait(limit)
        finally:
            if not done and not self._coordinated.is_set():
                client = api._st().client
                if client is not None:
                    self._withdrawn = client.withdraw(
                        self.process_set.sid, self.process_set.ranks, self.name
                    )
                    if self._withdrawn and self._numbered is not None:
                        _withdraw_siblings(self)
        return done

    def poll(self) -> bool:
        if self._finished:
            return True
        if not self._coordinated.is_set():
            return False
        if self._error is not None:
            return True
        done = all(p.poll() for p in self._parts)
        if done:
            _release(self)
            self._count_end()
        return done

    def synchronize(self, timeout: Optional[float] = None) -> Any:
        with self._lock:
            if self._finished:
                if self._error is not None:
                    raise self._error
                return self._result
            limit = timeout or api._st().cfg.op_timeout
            try:
                if not self._wait_coordinated(limit):
                    raise FastPSTimeoutError(
                        f"op '{self.name}' did not start within {limit:g} s: not every member "
                        f"of {self.process_set!r} called it"
                    )
                if self._error is not None:
                    raise self._error
                deadline = time.monotonic() + limit
                for part in self._parts:
                    _wait_part(self, part, deadline, limit)
                self._result = self._finish() if self._finish else None
            except BaseException as exc:
                self._error = exc
                raise
            finally:
                self._finished = True
                self._give_up_parts()
                _release(self)
                self._count_end()
            return self._result

    def give_up(self) -> None:
        """The caller will not synchronize this op (another op of its group failed or was
        interrupted): it leaves the names in flight, an announcement not yet gathered is
        withdrawn, and parts still moving go to the sweep (``Handle.abandon``), so nothing
        is left waiting that nobody will ever poll. No-op once finished or while another
        thread synchronizes it."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            if self._finished:
                return
            self._wait_coordinated(0.0)
            if self._error is None:
                self._error = CollectiveError(f"op '{self.name}' was given up by its caller")
            self._finished = True
            self._give_up_parts()
            _release(self)
            self._count_end()
        finally:
            self._lock.release()

    def _give_up_parts(self) -> None:
        """Nobody waits for this op's parts any more (it finished, failed or timed out):
        those still moving are handed to the core-side sweep (``Handle.abandon``), which
        keeps their buffers until the core is done with them without blocking this thread;
        parts the data stage adds later follow them (``_start``)."""
        with self._parts_lock:
            parts, self._parts = self._parts, []
            self._given_up = True
        for part in parts:
            part.abandon()

    wait = synchronize

    def __repr__(self) -> str:
        return f"<fastps Op {self.name!r} {'done' if self._finished else 'running'}>"


def give_up(waitables: Sequence[Any]) -> None:
    """``give_up`` on each of a group's members that has it (layer ops, plugin handles):
    for a group handle whose wait failed part-way, so its other members do not stay in
    flight unpolled."""
    for w in waitables:
        stop = getattr(w, "give_up", None)
        if stop is not None:
            stop()


def _wait_part(op: Op, part: Any, deadline: float, limit: float) -> None:
    """Waits for a core handle in short sleeps, so signals (Ctrl-C, test timeouts) reach
    the caller, and a wait past the limit fails this op without aborting the job."""
    pause = 20e-6
    while not part.poll():
        if time.monotonic() > deadline:
            waiting = [p.name for p in op._parts if not p.poll()]
            shown = ", ".join(f"'{n}'" for n in waiting[:4]) + (", ..." if waiting[4:] else "")
            raise FastPSTimeoutError(
                f"op '{op.name}' of {op.process_set!r} did not complete within {limit:g} s: "
                f"{len(waiting)} of its {len(op._parts)} data-plane tensors still wait "
                f"({shown}); every member announced it, so another member did not push its "
                "share (its op failed or gave up there); the stall inspector names the "
                "missing ranks after FASTPS_STALL_WARNING_S"
            )
        time.sleep(pause)
        pause = min(pause * 2, 2e-3)
    part.synchronize(limit)


def _withdraw_siblings(op: Op) -> None:
    """The wait for one part of an anonymous group was cut short before it coordinated:
    the group's other parts (same number) are withdrawn too and fail, so that the number
    can be given back (core/collectives/anon_names.py) rather than held by parts nobody
    waits for."""
    s = _session
    client = api._st().client
    if s is None or client is None or op._numbered is None:
        return
    number = op._numbered[1]
    with s.lock:
        siblings = [
            o
            for (sid, _), o in s.inflight.items()
            if sid == op.process_set.sid
            and o is not op
            and o._numbered is not None
            and o._numbered[0] is op._numbered[0]
            and o._numbered[1] == number
            and not o._coordinated.is_set()
        ]
    for sib in siblings:
        if client.withdraw(sib.process_set.sid, sib.process_set.ranks, sib.name):
            sib._withdrawn = True
            sib._fail(
                FastPSTimeoutError(
                    f"op '{sib.name}' was withdrawn: the wait for '{op.name}' of the same "
                    "group was cut short before every member called it"
                )
            )
            _release(sib)
            sib._count_end()


def _release(op: Op) -> None:
    s = _session
    if s is None:
        return
    key = (op.process_set.sid, op.name)
    with s.lock:
        if s.inflight.get(key) is op:
            del s.inflight[key]


def _start(
    ps: ProcessSet,
    name: str,
    record: Dict[str, Any],
    run: Callable[[Op, List[Optional[Dict[str, Any]]]], None],
) -> Op:
    """Announces the op; ``run(op, records)`` checks and starts the data stage once every
    member announced it."""
    s = _sess()
    op = Op(name, ps)
    key = (ps.sid, name)
    with s.lock:
        old = s.inflight.get(key)
        if old is not None and not old.poll():
            raise UsageError(
                f"an op named '{name}' is already in flight on rank {api.rank()} "
                f"({ps!r}); names must be unique among running ops"
            )
        s.inflight[key] = op
    op._numbered = _numbering(s, ps, name)
    if op._numbered is not None:
        op._numbered[0].started(op._numbered[1])

    def done(msg: Dict[str, Any]) -> None:
        if "error" in msg:
            op._fail(CollectiveError(str(msg["error"])))
            return
        try:
            run(op, msg["records"])
        except BaseException as exc:  # noqa: BLE001 - delivered to whoever synchronizes
            op._fail(
                exc
                if isinstance(exc, (FastPSError, ValueError))
                else CollectiveError(f"op '{name}': {type(exc).__name__}: {exc}")
            )
            return
        finally:
            # The caller gave up (a timeout, possibly as the gather completed: then this
            # is the withdrawn announcement's completion, ControlClient.withdraw): the
            # data still moves, since the other members count on this worker's parts.
            with op._parts_lock:
                late = op._given_up
            if late:
                op._give_up_parts()
        op._coordinated.set()

    try:
        _announce(ps, name, record, done)
    except BaseException:
        _release(op)
        op._withdrawn = True  # never announced
        op._count_end()
        raise
    return op


def _announce(
    ps: ProcessSet, name: str, record: Dict[str, Any], done: Callable[[Dict[str, Any]], None]
) -> None:
    client = api._st().client
    if client is None:  # one process: everyone has announced
        done({"records": [record]})
        return
    client.coordinate(ps.sid, ps.ranks, name, record, done)


def _run_control_op(ps: ProcessSet, name: str, record: Dict[str, Any]) -> List[Any]:
    """An op with no data: returns every member's record once all announced it."""
    got: List[Any] = []

    def run(op: Op, records: List[Optional[Dict[str, Any]]]) -> None:
        _check_records(name, ps, records)
        got.extend(records)
        op._finish = lambda: None

    _start(ps, name, record, run).synchronize()
    return got


# --------------------------------------------------------------------------- checks


def _describe(record: Dict[str, Any]) -> str:
    return f"{record.get('dt')}{record.get('sh')}"


def _check_records(name: str, ps: ProcessSet, records: List[Optional[Dict[str, Any]]]) -> None:
    """The same verdict on every rank: raise CollectiveError naming both disagreeing values."""
    ranks = ps.ranks
    present = [(r, rec) for r, rec in zip(ranks, records) if rec is not None]
    if not present:
        raise CollectiveError(f"op '{name}': every member of {ps!r} has joined")
    r0, first = present[0]

    def differ(what: str, get: Callable[[Dict[str, Any]], Any]) -> None:
        for r, rec in present[1:]:
            if get(rec) != get(first):
                raise CollectiveError(
                    f"op '{name}': mismatched {what}: rank {r0} has {get(first)!r}, "
                    f"rank {r} has {get(rec)!r}{hint}"
                )

    # Anonymous ops pair by call order: after an op that one rank gave up (a timeout, an
    # interrupted test) or skipped, the ranks pair different calls.
    hint = (
        " (an anonymous op: if the ranks' calls no longer line up, an earlier op may have "
        "been given up or skipped on one rank only; name ops to pair them by name)"
        if name.startswith("noname.")
        else ""
    )

    differ("operation", lambda rec: rec.get("k"))
    kind = first.get("k")
    differ("dtype", lambda rec: rec.get("dt"))
    if kind in ("allreduce", "reducescatter", "broadcast", "reduce"):
        differ("shape", lambda rec: rec.get("sh"))
    if kind in ("allgather", "alltoall"):
        differ("rank (number of dimensions)", lambda rec: len(rec.get("sh") or []))
        differ("shape after the first dimension", lambda rec: (rec.get("sh") or [])[1:])
    if kind in ("allreduce", "reducescatter", "reduce"):
        differ("reduce op", lambda rec: rec.get("op"))
        differ("compression", lambda rec: rec.get("cz") or "none")
        differ("prescale factor", lambda rec: rec.get("pre"))
        differ("postscale factor", lambda rec: rec.get("post"))
    if kind == "reduce":
        differ("root rank", lambda rec: rec.get("root"))
    if kind == "broadcast":
        differ("root rank", lambda rec: rec.get("root"))
        root = first.get("root")
        if records[ranks.index(int(root or 0))] is None:
            raise CollectiveError(f"broadcast '{name}': root rank {root} has already joined")
    if kind not in ("allreduce", "barrier") and len(present) < len(records):
        joined = [r for r, rec in zip(ranks, records) if rec is None]
        raise CollectiveError(
            f"{kind} '{name}': rank(s) {joined} have joined; only allreduce and barrier "
            "take part in join (the joined ranks stand in with zeros)"
        )
    if kind in ("add_process_set", "remove_process_set"):
        differ("process set ranks", lambda rec: rec.get("ranks"))


# --------------------------------------------------------------------------- arithmetic


def _to_compute(a: np.ndarray, dtype: str) -> np.ndarray:
    """Values for local arithmetic: bfloat16 bits widen to float32."""
    if dtype == "bfloat16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a


def _from_compute(a: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
        rounding = ((bits >> 16) & 1) + 0x7FFF  # round to nearest even
        return ((bits + rounding) >> 16).astype(np.uint16)
    return np.asarray(a).astype(DTYPES[dtype], copy=False)


def _scaled(a: np.ndarray, dtype: str, factor: float) -> np.ndarray:
    """``a * factor`` in ``a``'s dtype, computed as Horovod does: float32/float64 in their
    own precision, float16/bfloat16 in float32, integers in float64 rounded toward zero."""
    if factor == 1.0:
        return a
    if dtype == "bool":
        raise CollectiveError("boolean tensors cannot be scaled")
    if dtype in ("float32", "float64"):
        return (a * a.dtype.type(factor)).astype(a.dtype, copy=False)
    if dtype in _FLOATS:
        return _from_compute(_to_compute(a, dtype).astype(np.float32) * np.float32(factor), dtype)
    return np.trunc(a.astype(np.float64) * factor).astype(a.dtype)


def _reduce_stack(stack: np.ndarray, dtype: str, op: ReduceOp) -> np.ndarray:
    """Combines rows of ``stack`` (one per rank) locally: Sum/Min/Max/Product."""
    vals = _to_compute(stack, dtype)
    if dtype == "bool":
        out = vals.all(axis=0) if op in (ReduceOp.MIN, ReduceOp.PRODUCT) else vals.any(axis=0)
        return np.asarray(out)
    if op == ReduceOp.MIN:
        out = vals.min(axis=0)
    elif op == ReduceOp.MAX:
        out = vals.max(axis=0)
    elif op == ReduceOp.PRODUCT:
        out = vals.prod(axis=0, dtype=vals.dtype)
    else:
        acc = np.float64 if dtype in _FLOATS else vals.dtype
        out = vals.sum(axis=0, dtype=acc)
    return _from_compute(out, dtype)


def _average(a: np.ndarray, dtype: str, count: int) -> np.ndarray:
    if dtype in _FLOATS:
        return _scaled(a, dtype, 1.0 / count)
    if dtype == "bool":
        raise CollectiveError("boolean tensors cannot be averaged; use op=Sum (logical OR)")
    return (np.sign(a) * (np.abs(a) // count)).astype(a.dtype)  # rounds toward zero


# --------------------------------------------------------------------------- transports


def _push_sum(
    op: Op,
    data_name: str,
    src: np.ndarray,
    dst: np.ndarray,
    dtype: str,
    priority: int = 0,
    scale: float = 1.0,
    spec: str = "",
) -> None:
    """Data plane: ``dst`` receives the sum over the set's members of their ``src``. The
    global set uses the plain sum (local reduce included; compressed with ``spec``, a
    compressor spec, when given); another set routes it, so the servers count only its
    members' pushes."""
    ps = op.process_set
    if ps.sid != 0:
        other = None if dst is src else dst
        _route(op, data_name, src, dtype, ps.size(), True, True, other, scale, priority)
        return
    name = f"{data_name}.{ps.sid}.{src.nbytes}"
    sbuf = raw_buffer(src, f"tensor '{op.name}'", dtype=dtype)
    dbuf = (
        sbuf
        if dst is src
        else raw_buffer(dst, f"output of '{op.name}'", writable=True, dtype=dtype)
    )
    op._parts.append(
        api.push_pull_raw(
            sbuf, dbuf, name, priority, scale, out=dst, keep=(src,), declare=False, compression=spec
        )
    )


def _route(
    op: Op,
    data_name: str,
    buf: np.ndarray,
    dtype: str,
    pushers: int,
    send: bool,
    receive: bool,
    dst: Optional[np.ndarray] = None,
    scale: float = 1.0,
    priority: int = 0,
) -> None:
    """Data plane, routed (``docs/design/architecture.md``, "Bytes on the wire"): ``pushers``
    workers push each part of ``data_name``; the server sums the pushes that carry data
    (one: a forward) and answers only those that want the result. ``buf`` is what this
    worker contributes (``send``); the result lands in ``dst`` (default ``buf``) when
    ``receive``. Every pusher must use the same ``data_name`` and size."""
    name = f"{data_name}.{op.process_set.sid}.{buf.nbytes}"
    target = buf if dst is None else dst
    sbuf = raw_buffer(buf, f"tensor '{op.name}'", writable=receive and dst is None, dtype=dtype)
    dbuf = (
        sbuf
        if dst is None
        else raw_buffer(dst, f"output of '{op.name}'", writable=True, dtype=dtype)
    )
    op._parts.append(
        api.push_pull_raw(
            sbuf,
            dbuf,
            name,
            priority,
            scale,
            out=target,
            keep=(buf,),
            declare=False,
            send=send,
            receive=receive,
            pushers=pushers,
        )
    )


def _zeros_like_record(rec: Dict[str, Any], rows: Optional[int] = None) -> np.ndarray:
    shape = list(rec["sh"])
    if rows is not None:
        shape = [rows, *shape[1:]]
    return np.zeros(shape, dtype=DTYPES[rec["dt"]])


# --------------------------------------------------------------------------- allreduce


def _record(kind: str, a: np.ndarray, dtype: str, **extra: Any) -> Dict[str, Any]:
    if dtype not in DTYPES:
        raise CollectiveError(f"dtype {dtype!r} is not supported (supported: {', '.join(DTYPES)})")
    rec = {"k": kind, "dt": dtype, "sh": [int(d) for d in a.shape]}
    rec.update(extra)
    return rec


def _check_scaling(name: str, dtype: str, op: ReduceOp, pre: float, post: float) -> None:
    if op == ReduceOp.ADASUM:
        try:
            adasum.check_dtype(name, dtype)
        except ValueError as exc:
            raise CollectiveError(str(exc)) from None
    if dtype == "bool" and (op == ReduceOp.AVERAGE or pre != 1.0 or post != 1.0):
        raise CollectiveError(
            f"op '{name}': boolean tensors support op=Sum (logical OR), Min and Max without "
            "scale factors only"
        )


def allreduce_async(
    a: np.ndarray,
    dtype: str,
    name: Optional[str] = None,
    op: ReduceOp = ReduceOp.AVERAGE,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Optional[ProcessSet] = None,
    priority: int = 0,
    out: Optional[np.ndarray] = None,
    compression: Any = None,
) -> Op:
    """Reduces ``a`` over the set. ``out`` (same shape/dtype) receives the result when
    given (it may be ``a`` itself: in place); the result is ``out`` or a new array.
    ``compression`` (a :class:`fastps.Compression` choice) compresses a Sum/Average of
    the global set on the wire (docs/guide/compression.md); every rank must choose alike."""
    ps = _registered(process_set)
    name = _op_name(ps, name)
    op = ReduceOp(op)
    pre, post = float(prescale_factor), float(postscale_factor)
    _check_scaling(name, dtype, op, pre, post)
    spec = compression_spec_for(compression, name, a.nbytes, dtype)
    if spec and (ps.sid != 0 or op not in (ReduceOp.SUM, ReduceOp.AVERAGE)):
        raise CollectiveError(
            f"op '{name}': compression ({spec}) applies to Sum/Average allreduce on the "
            "global process set only"
        )
    rec = _record("allreduce", a, dtype, op=int(op), pre=pre, post=post)
    if spec:
        rec["cz"] = spec
    return _start(
        ps,
        name,
        rec,
        lambda o, recs: _allreduce_run(o, recs, a, dtype, op, pre, post, priority, out, spec),
    )


def _allreduce_run(
    o: Op,
    recs: List[Any],
    a: np.ndarray,
    dtype: str,
    op: ReduceOp,
    pre: float,
    post: float,
    priority: int,
    out: Optional[np.ndarray],
    spec: str = "",
) -> None:
    ps = o.process_set
    _check_records(o.name, ps, recs)
    count = ps.size()

    def deliver(result: np.ndarray) -> np.ndarray:
        if out is None:
            return result
        np.copyto(out, result.reshape(out.shape), casting="unsafe")
        return out

    if count == 1 or op in _GATHERED_OPS:
        if count == 1:
            stack = np.stack([_scaled(np.asarray(a), dtype, pre)])
            o._finish = lambda: deliver(_finish_reduce(stack, dtype, op, post, count))
            return
        # Min/Max/Product/Adasum on the data plane: every present rank forwards its tensor
        # to the others (an allgather); a joined rank's row stays zeros and costs no bytes.
        stack = np.zeros((count, *a.shape), dtype=a.dtype)
        me = ps.ranks.index(api.rank())
        stack[me] = _scaled(a, dtype, pre)
        present = [i for i, rec in enumerate(recs) if rec is not None]
        for i in present if len(present) > 1 else ():
            mine = i == me
            row = stack[i : i + 1]  # a view even for a scalar tensor (stack[i] would copy)
            _route(o, f"{o.name}.stack.{i}", row, dtype, len(present), mine, not mine)
        o._finish = lambda: deliver(_finish_reduce(stack, dtype, op, post, count))
        return
    # Sum/Average on the data plane: the core scales floats on the way back.
    src = a if pre == 1.0 else _scaled(a, dtype, pre)
    dst = out if out is not None and out.flags.c_contiguous else np.empty_like(a)
    if dtype in _FLOATS:
        scale = post / count if op == ReduceOp.AVERAGE else post
        _push_sum(o, o.name, np.ascontiguousarray(src), dst, dtype, priority, scale, spec)
        o._finish = lambda: deliver(dst)
    else:
        _push_sum(o, o.name, np.ascontiguousarray(src), dst, dtype, priority)

        def finish() -> np.ndarray:
            result = _average(dst, dtype, count) if op == ReduceOp.AVERAGE else dst
            return deliver(_scaled(result, dtype, post))

        o._finish = finish


def reduce_rows(stack: np.ndarray, dtype: str, op: ReduceOp) -> np.ndarray:
    """Reduces the rows of ``stack`` (one per rank, rank order) with ``op``, here."""
    return _finish_reduce(stack, dtype, op, 1.0, int(stack.shape[0]))


def _finish_reduce(
    stack: np.ndarray, dtype: str, op: ReduceOp, post: float, count: int
) -> np.ndarray:
    if op == ReduceOp.ADASUM:  # core/collectives/adasum.py: over the rows in rank order
        result = adasum.reduce_rows(
            [_to_compute(row, dtype) for row in stack],
            lambda x: _to_compute(_from_compute(x, dtype), dtype),
        )
        return _scaled(_from_compute(result, dtype), dtype, post)
    rop = ReduceOp.SUM if op == ReduceOp.AVERAGE else op
    result = _reduce_stack(stack, dtype, rop)
    if op == ReduceOp.AVERAGE:
        result = _average(result, dtype, count)
    return _scaled(result, dtype, post)


def grouped_allreduce_async(
    arrays: Sequence[np.ndarray],
    dtypes: Sequence[str],
    name: Optional[str] = None,
    op: ReduceOp = ReduceOp.AVERAGE,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Optional[ProcessSet] = None,
    priority: int = 0,
    outs: Optional[Sequence[Optional[np.ndarray]]] = None,
) -> List[Op]:
    """One allreduce per array, announced together; their data starts in one core call."""
    names = group_names(process_set, name, len(arrays))
    with api.submission_batch():
        return [
            allreduce_async(
                a,
                dt,
                n,
                op,
                prescale_factor,
                postscale_factor,
                process_set,
                priority,
                None if outs is None else outs[i],
            )
            for i, (a, dt, n) in enumerate(zip(arrays, dtypes, names))
        ]


def group_names(process_set: Optional[ProcessSet], name: Optional[str], count: int) -> List[str]:
    ps = _registered(process_set)
    base = _op_name(ps, name)
    return [f"{base}.{i}" for i in range(count)]


# --------------------------------------------------------------------------- allgather


def allgather_async(
    a: np.ndarray,
    dtype: str,
    name: Optional[str] = None,
    process_set: Optional[ProcessSet] = None,
    priority: int = 0,
) -> Op:
    """Concatenates every member's ``a`` along the first dimension, in rank order (first
    dimensions may differ). The result is ``(array, rows per member)``. ``priority``: as
    for a push_pull (larger goes first; the same on every member), e.g. a sparse gradient's
    place in the forward order."""
    ps = _registered(process_set)
    name = _op_name(ps, name)
    if a.ndim == 0:
        a = a.reshape(1)
    rec = _record("allgather", a, dtype)
    return _start(ps, name, rec, lambda o, recs: _allgather_run(o, recs, a, dtype, priority))


def _allgather_run(o: Op, recs: List[Any], a: np.ndarray, dtype: str, priority: int = 0) -> None:
    ps = o.process_set
    _check_records(o.name, ps, recs)
    counts = [0 if rec is None else int(rec["sh"][0]) for rec in recs]
    me = ps.ranks.index(api.rank())
    # Each member forwards its own rows once; the others receive them straight into their
    # place in the result (the server answers only the receivers).
    total = sum(counts)
    buf = np.empty((total, *a.shape[1:]), dtype=a.dtype)
    start = 0
    for i, rows in enumerate(counts):
        block = buf[start : start + rows]
        start += rows
        if i == me:
            block[...] = a
        if rows == 0 or ps.size() == 1:
            continue
        _route(
            o, f"{o.name}.gather.{i}", block, dtype, ps.size(), i == me, i != me, priority=priority
        )
    o._finish = lambda: (buf, counts)


def grouped_allgather_async(
    arrays: Sequence[np.ndarray],
    dtypes: Sequence[str],
    name: Optional[str] = None,
    process_set: Optional[ProcessSet] = None,
) -> List[Op]:
    names = group_names(process_set, name, len(arrays))
    with api.submission_batch():
        return [allgather_async(a, dt, n, process_set) for a, dt, n in zip(arrays, dtypes, names)]


# --------------------------------------------------------------------------- broadcast


def broadcast_async(
    a: np.ndarray,
    dtype: str,
    root_rank: int,
    name: Optional[str] = None,
    process_set: Optional[ProcessSet] = None,
    out: Optional[np.ndarray] = None,
) -> Op:
    """``root_rank``'s ``a`` on every member (into ``out`` when given)."""
    ps = _registered(process_set)
    if not isinstance(root_rank, (int, np.integer)) or int(root_rank) not in ps.ranks:
        raise UsageError(f"root_rank {root_rank!r} is not a member of {ps!r} (ranks {ps.ranks})")
    root_rank = int(root_rank)
    name = _op_name(ps, name)
    rec = _record("broadcast", a, dtype, root=root_rank)
    return _start(ps, name, rec, lambda o, recs: _broadcast_run(o, recs, a, dtype, root_rank, out))


def _broadcast_run(
    o: Op, recs: List[Any], a: np.ndarray, dtype: str, root: int, out: Optional[np.ndarray]
) -> None:
    ps = o.process_set
    _check_records(o.name, ps, recs)
    dst = out if out is not None and out.flags.c_contiguous else np.empty(a.shape, a.dtype)
    if ps.size() == 1:
        np.copyto(dst, a)
    elif api.rank() == root:
        # The root's tensor goes up once and is not sent back to it.
        np.copyto(dst, a.reshape(dst.shape))
        _route(o, f"{o.name}.bcast", dst, dtype, ps.size(), send=True, receive=False)
    else:
        _route(o, f"{o.name}.bcast", dst, dtype, ps.size(), send=False, receive=True)

    def finish() -> np.ndarray:
        if out is not None and dst is not out:
            np.copyto(out, dst)
            return out
        return dst

    o._finish = finish


# --------------------------------------------------------------------------- alltoall


def alltoall_async(
    a: np.ndarray,
    dtype: str,
    splits: Optional[Sequence[int]] = None,
    name: Optional[str] = None,
    process_set: Optional[ProcessSet] = None,
) -> Op:
    """Sends ``splits[j]`` rows of ``a`` (in order) to the j-th member; the result is
    ``(received rows concatenated in member order, rows received from each member)``.
    Without ``splits`` the first dimension is divided evenly."""
    ps = _registered(process_set)
    name = _op_name(ps, name)
    n = ps.size()
    if a.ndim == 0:
        raise UsageError(f"alltoall '{name}': a scalar cannot be split; pass a tensor")
    rows = int(a.shape[0])
    if splits is None:
        if rows % n:
            raise UsageError(
                f"alltoall '{name}': the first dimension ({rows}) is not divisible by the "
                f"number of ranks ({n}); pass splits"
            )
        splits = [rows // n] * n
    splits = [int(s) for s in splits]
    if len(splits) != n:
        raise UsageError(f"alltoall '{name}': {len(splits)} splits for {n} ranks")
    if any(s < 0 for s in splits) or sum(splits) != rows:
        raise UsageError(
            f"alltoall '{name}': splits {splits} must be non-negative and sum to the first "
            f"dimension ({rows})"
        )
    rec = _record("alltoall", a, dtype, splits=splits)
    return _start(ps, name, rec, lambda o, recs: _alltoall_run(o, recs, a, dtype))


def _alltoall_run(o: Op, recs: List[Any], a: np.ndarray, dtype: str) -> None:
    ps = o.process_set
    _check_records(o.name, ps, recs)
    if any(rec is None for rec in recs):
        raise CollectiveError(f"alltoall '{o.name}': a member has joined")
    n = ps.size()
    me = ps.ranks.index(api.rank())
    split = [rec["splits"] for rec in recs]  # split[i][j]: rows from member i to member j
    received = [split[i][me] for i in range(n)]
    if n == 1:
        o._finish = lambda: (np.array(a, copy=True), received)
        return
    # Block (i -> j) is forwarded once, from member i to member j (two pushers per part:
    # the sender's data and the receiver's request); this rank's own block is copied here.
    out = np.empty((sum(received), *a.shape[1:]), dtype=a.dtype)
    send_begin = [sum(split[me][:j]) for j in range(n)]
    recv_begin = [sum(received[:i]) for i in range(n)]
    own = a[send_begin[me] : send_begin[me] + split[me][me]]
    out[recv_begin[me] : recv_begin[me] + split[me][me]] = own
    for j in range(n):
        if j != me and split[me][j]:
            block = np.ascontiguousarray(a[send_begin[j] : send_begin[j] + split[me][j]])
            _route(o, f"{o.name}.a2a.{me}.{j}", block, dtype, 2, send=True, receive=False)
    for i in range(n):
        if i != me and split[i][me]:
            block = out[recv_begin[i] : recv_begin[i] + split[i][me]]
            _route(o, f"{o.name}.a2a.{i}.{me}", block, dtype, 2, send=False, receive=True)
    o._finish = lambda: (out, received)


# --------------------------------------------------------------------------- reducescatter


def reducescatter_rows(rows: int, count: int) -> List[int]:
    """Rows of the result on each member: even shares, the first ``rows % count`` one more."""
    return [rows // count + (1 if i < rows % count else 0) for i in range(count)]


def reducescatter_async(
    a: np.ndarray,
    dtype: str,
    name: Optional[str] = None,
    op: ReduceOp = ReduceOp.AVERAGE,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Optional[ProcessSet] = None,
) -> Op:
    """Reduces ``a`` over the set and leaves each member its share of the first dimension."""
    ps = _registered(process_set)
    name = _op_name(ps, name)
    op = ReduceOp(op)
    if op not in (ReduceOp.SUM, ReduceOp.AVERAGE):
        raise CollectiveError(f"reducescatter '{name}': only op=Sum and op=Average are supported")
    if a.ndim == 0:
        raise UsageError(f"reducescatter '{name}': a scalar cannot be scattered")
    pre, post = float(prescale_factor), float(postscale_factor)
    _check_scaling(name, dtype, op, pre, post)
    rec = _record("reducescatter", a, dtype, op=int(op), pre=pre, post=post)
    inner = Op(name, ps)

    def run(o: Op, recs: List[Any]) -> None:
        shares = reducescatter_rows(int(a.shape[0]), ps.size())
        me = ps.ranks.index(api.rank())
        begin = sum(shares[:me])
        if ps.size() == 1:
            rec2 = [None if r is None else {**r, "k": "allreduce"} for r in recs]
            _allreduce_run(inner, rec2, a, dtype, op, pre, post, 0, None)
            o._parts = inner._parts

            def finish_whole() -> np.ndarray:
                assert inner._finish is not None
                full = inner._finish()
                return np.ascontiguousarray(full[begin : begin + shares[me]])

            o._finish = finish_whole
            return
        _check_records(o.name, ps, recs)
        _reducescatter_run(o, a, dtype, op, pre, post, shares, me)

    return _start(ps, name, rec, run)


def _reducescatter_run(
    o: Op,
    a: np.ndarray,
    dtype: str,
    op: ReduceOp,
    pre: float,
    post: float,
    shares: List[int],
    me: int,
) -> None:
    """Shard j is summed over every member and sent back to member j only: each member
    pushes its whole tensor once and receives its own shard once."""
    n = len(shares)
    src = np.ascontiguousarray(a if pre == 1.0 else _scaled(a, dtype, pre))
    mine = np.empty((shares[me], *a.shape[1:]), dtype=a.dtype)
    scale = (post / n if op == ReduceOp.AVERAGE else post) if dtype in _FLOATS else 1.0
    start = 0
    for j, rows in enumerate(shares):
        block = src[start : start + rows]
        start += rows
        if rows == 0:
            continue
        name = f"{o.name}.rs.{j}"
        if j == me:
            _route(o, name, block, dtype, n, send=True, receive=True, dst=mine, scale=scale)
        else:
            _route(o, name, block, dtype, n, send=True, receive=False)

    def finish() -> np.ndarray:
        if dtype in _FLOATS:
            return mine
        result = _average(mine, dtype, n) if op == ReduceOp.AVERAGE else mine
        return _scaled(result, dtype, post)

    o._finish = finish


def grouped_reducescatter_async(
    arrays: Sequence[np.ndarray],
    dtypes: Sequence[str],
    name: Optional[str] = None,
    op: ReduceOp = ReduceOp.AVERAGE,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Optional[ProcessSet] = None,
) -> List[Op]:
    names = group_names(process_set, name, len(arrays))
    with api.submission_batch():
        return [
            reducescatter_async(a, dt, n, op, prescale_factor, postscale_factor, process_set)
            for a, dt, n in zip(arrays, dtypes, names)
        ]


# --------------------------------------------------------------------------- reduce


def reduce_async(
    a: np.ndarray,
    dtype: str,
    root_rank: int,
    name: Optional[str] = None,
    op: ReduceOp = ReduceOp.SUM,
    process_set: Optional[ProcessSet] = None,
) -> Op:
    """Reduces ``a`` over the set onto ``root_rank`` only (torch.distributed's ``reduce``).
    The root's result is the reduced array; the others' is None. Sum/Average: every member
    pushes once and only the root pulls; Min/Max/Product: each member's tensor goes to the
    root once, which reduces them."""
    ps = _registered(process_set)
    if not isinstance(root_rank, (int, np.integer)) or int(root_rank) not in ps.ranks:
        raise UsageError(f"root_rank {root_rank!r} is not a member of {ps!r} (ranks {ps.ranks})")
    root = int(root_rank)
    name = _op_name(ps, name)
    op = ReduceOp(op)
    if op == ReduceOp.ADASUM:
        raise CollectiveError(f"reduce '{name}': Adasum is an allreduce op only")
    _check_scaling(name, dtype, op, 1.0, 1.0)
    rec = _record("reduce", a, dtype, op=int(op), root=root)
    return _start(ps, name, rec, lambda o, recs: _reduce_run(o, recs, a, dtype, op, root))


def _reduce_run(o: Op, recs: List[Any], a: np.ndarray, dtype: str, op: ReduceOp, root: int) -> None:
    ps = o.process_set
    _check_records(o.name, ps, recs)
    n = ps.size()
    me_rank = api.rank()
    at_root = me_rank == root
    src = np.ascontiguousarray(a)
    if n == 1:
        o._finish = lambda: np.array(src, copy=True)
        return
    if op in (ReduceOp.SUM, ReduceOp.AVERAGE):
        dst = np.empty_like(src) if at_root else None
        scale = 1.0 / n if op == ReduceOp.AVERAGE and dtype in _FLOATS else 1.0
        _route(o, f"{o.name}.reduce", src, dtype, n, True, at_root, dst=dst, scale=scale)

        def finish_sum() -> Optional[np.ndarray]:
            if dst is None:
                return None
            if op == ReduceOp.AVERAGE and dtype not in _FLOATS:
                return _average(dst, dtype, n)
            return dst

        o._finish = finish_sum
        return
    # Min/Max/Product: block i (member i's tensor) goes to the root only.
    me = ps.ranks.index(me_rank)
    stack = np.empty((n, *src.shape), dtype=src.dtype) if at_root else None
    for i, r in enumerate(ps.ranks):
        if r == root:
            if at_root:
                assert stack is not None
                stack[i] = src
            continue
        if at_root:
            assert stack is not None
            _route(o, f"{o.name}.reduce.{i}", stack[i : i + 1], dtype, 2, False, True)
        elif i == me:
            _route(o, f"{o.name}.reduce.{i}", src.reshape(1, *src.shape), dtype, 2, True, False)

    def finish_gathered() -> Optional[np.ndarray]:
        if stack is None:
            return None
        return _finish_reduce(stack, dtype, op, 1.0, n)

    o._finish = finish_gathered


# --------------------------------------------------------------------------- barrier, join


def barrier(process_set: Optional[ProcessSet] = None) -> None:
    """Returns once every member of the set called ``barrier``."""
    ps = _registered(process_set)
    s = _sess()
    with s.lock:  # own numbering: a rank that stood in for others' ops has the same count
        counter = s.counters.setdefault(("barrier", ps.sid), Numbering())
    name = f"barrier.{counter.take()}"
    _run_control_op(ps, name, {"k": "barrier"})


def join(process_set: Optional[ProcessSet] = None, timeout: Optional[float] = None) -> int:
    """Waits until every member joined; meanwhile this rank takes part in the others' ops
    with zeros (no rows, for allgather). Returns the rank that joined last."""
    ps = _registered(process_set)
    st = api._st()
    s = _sess()
    result: Dict[str, Any] = {}
    finished = threading.Event()

    def done(msg: Dict[str, Any]) -> None:
        result.update(msg)
        finished.set()

    def stand_in(msg: Dict[str, Any]) -> None:
        try:
            _stand_in(s, ps, msg)
        except Exception:  # noqa: BLE001 - the op's owners see their own error
            log.exception("rank %d could not stand in for op %r", api.rank(), msg.get("name"))

    client = st.client
    if client is None:
        return api.rank()
    with s.lock:
        pending = s.join_pending.get(ps.sid)
        if pending is None:  # a join interrupted earlier (Ctrl-C, a timeout) is still on
            pending = s.join_pending[ps.sid] = (result, finished)
            fresh = True
        else:
            result, finished = pending
            fresh = False
    client.on_unsolicited(stand_in)
    try:
        if fresh:
            client.coordinate(ps.sid, ps.ranks, JOIN, {"k": "join"}, done)
        limit = timeout or st.cfg.op_timeout
        if not finished.wait(limit):
            raise FastPSTimeoutError(f"join did not complete within {limit:g} s")
    except BaseException:
        if fresh and not finished.is_set() and client.abort_reason is not None:
            s.join_pending.pop(ps.sid, None)
        raise
    finally:
        if finished.is_set():
            client.on_unsolicited(None)
    with s.lock:
        s.join_pending.pop(ps.sid, None)
    for handle in s.stand_ins:
        handle.synchronize()
    s.stand_ins = []
    if "error" in result:
        raise CollectiveError(str(result["error"]))
    return int(result["last"])


def _skip_name(s: _Session, ps: ProcessSet, name: str) -> None:
    """A joined rank stood in for an anonymous op: its numbering moves past it too."""
    prefix, _, rest = name.partition(".")
    number = rest.split(".")[0]
    if prefix != "noname" or not number.isdigit():
        return
    with s.lock:
        counter = s.counters.setdefault(ps.sid, Numbering())
    counter.skip_past(int(number))


def _stand_in(s: _Session, ps: ProcessSet, msg: Dict[str, Any]) -> None:
    """This joined rank contributes zeros to an op of the others on the data plane."""
    if int(msg.get("set", -1)) != ps.sid or "records" not in msg:
        return
    recs = msg["records"]
    present = [rec for rec in recs if rec is not None]
    if not present:
        return
    rec = present[0]
    _skip_name(s, ps, str(msg["name"]))
    try:
        _check_records(str(msg["name"]), ps, recs)
    except CollectiveError:
        return  # the members raise it; no data moves
    op = Op(str(msg["name"]), ps)
    kind = rec["k"]
    # Only allreduce takes part in join (_check_records refuses the others). Min/Max/Product
    # gather the present ranks' rows only: a joined rank's row is zeros on every receiver,
    # so it moves nothing; Sum/Average add its zeros on the data plane.
    if kind == "allreduce" and ReduceOp(rec["op"]) in (ReduceOp.SUM, ReduceOp.AVERAGE):
        zeros = _zeros_like_record(rec)
        _push_sum(op, op.name, zeros, np.empty_like(zeros), rec["dt"])
    s.stand_ins.extend(op._parts)


# --------------------------------------------------------------------------- objects


try:  # cloudpickle also serialises lambdas and locally defined classes
    import cloudpickle as _pickler  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # pragma: no cover - depends on the environment
    _pickler = pickle  # type: ignore[no-redef,unused-ignore]


def _dumps(obj: Any) -> np.ndarray:
    return np.frombuffer(_pickler.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8)


def broadcast_object(
    obj: Any,
    root_rank: int = 0,
    name: Optional[str] = None,
    process_set: Optional[ProcessSet] = None,
) -> Any:
    """``root_rank``'s picklable ``obj`` on every member."""
    ps = _registered(process_set)
    name = _op_name(ps, name)
    payload = _dumps(obj) if api.rank() == root_rank else np.zeros(0, dtype=np.uint8)
    size = broadcast_async(
        np.array([payload.size], dtype=np.int64), "int64", root_rank, f"{name}.size", ps
    ).synchronize()
    buf = payload if api.rank() == root_rank else np.zeros(int(size[0]), dtype=np.uint8)
    data = broadcast_async(buf, "uint8", root_rank, f"{name}.data", ps).synchronize()
    return obj if api.rank() == root_rank else pickle.loads(data.tobytes())


def allgather_object(
    obj: Any, name: Optional[str] = None, process_set: Optional[ProcessSet] = None
) -> List[Any]:
    """Every member's picklable ``obj``, in rank order."""
    ps = _registered(process_set)
    name = _op_name(ps, name)
    payload = _dumps(obj)
    data, counts = allgather_async(payload, "uint8", name, ps).synchronize()
    out, pos = [], 0
    for c in counts:
        out.append(pickle.loads(data[pos : pos + c].tobytes()))
        pos += c
    return out


def check_same_everywhere(
    signatures: Sequence[Tuple[str, Sequence[int], str]],
    what: str,
    process_set: Optional[ProcessSet] = None,
) -> None:
    """The "same tensors on every worker" check: ``signatures`` are this rank's
    (name, shape, dtype); raises CollectiveError on every rank, naming the first tensor
    that differs (or exists on one rank only) and the ranks involved."""
    ps = _registered(process_set)
    if ps.size() == 1:
        return
    mine = [(str(n), [int(d) for d in shape], str(dt)) for n, shape, dt in signatures]
    everyone = allgather_object(mine, process_set=ps)
    first = ps.ranks[0]

    def describe(sig: Any) -> str:
        return f"{sig[2]}{list(sig[1])}"

    ref = {sig[0]: sig for sig in everyone[0]}
    for rank, sigs in zip(ps.ranks[1:], everyone[1:]):
        theirs = {sig[0]: sig for sig in sigs}
        for n, sig in ref.items():
            other = theirs.get(n)
            if other is None:
                raise CollectiveError(
                    f"{what}: tensor '{n}' ({describe(sig)}) exists on rank {first} but not on "
                    f"rank {rank}; every rank must hold the same tensors"
                )
            if list(other[1]) != list(sig[1]) or other[2] != sig[2]:
                raise CollectiveError(
                    f"{what}: tensor '{n}' is {describe(sig)} on rank {first} but "
                    f"{describe(other)} on rank {rank}; every rank must hold the same tensors"
                )
        for n, sig in theirs.items():
            if n not in ref:
                raise CollectiveError(
                    f"{what}: tensor '{n}' ({describe(sig)}) exists on rank {rank} but not on "
                    f"rank {first}; every rank must hold the same tensors"
                )
