"""The stall inspector: names the ranks that keep a tensor waiting.

A push_pull completes only once every worker submitted the tensor, so a rank that never
does (a branch taken on some ranks only, a crash-free hang, a different tensor order)
stalls the others until the op timeout. Each worker's ``StallInspector`` notices when one
of its push_pulls has waited ``FASTPS_STALL_WARNING_S`` and asks the scheduler
(``stall_check``); the scheduler asks every worker how many times it submitted each
waiting name (``stall_query`` / ``stall_report``), finds with :func:`find_stalls` the
ranks that are a round behind on it, and tells every worker (``stall_result``). Each
waiting rank logs which ranks are missing which tensors; past
``FASTPS_STALL_SHUTDOWN_S`` it aborts the job with that description instead.

A stall that can be proven permanent ends the job at once, whatever
``FASTPS_STALL_SHUTDOWN_S``: when every rank waits (a push_pull, or a collective or barrier
the scheduler holds), each wait lacks a rank that can never come (it waits too), and two
inquiries a poll interval apart see no submission move (:func:`find_deadlock`,
:class:`DeadlockWatch`), the scheduler aborts the job naming the cycle.
"""

from __future__ import annotations

import logging
import math
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from .coordinator import JOIN

log = logging.getLogger("fastps.stall")

# How often the inspector thread looks, at most (it looks sooner before a deadline).
MAX_POLL_S = 5.0
MIN_POLL_S = 0.05
# A deadlock is proven by two inquiries at least this far apart (and a poll interval).
MIN_CONFIRM_S = 1.0
# Waits named in a permanent stall's description; the rest are counted.
MAX_DESCRIBED = 6


def poll_interval(warning_s: float) -> float:
    """How often the inspector looks for waits past ``warning_s``."""
    return max(MIN_POLL_S, min(MAX_POLL_S, warning_s / 4))


def confirm_interval(warning_s: float) -> float:
    """How long nothing may move before an apparent deadlock counts as one: a poll
    interval, and at least a second, so reports taken a moment apart cannot fake it."""
    return max(MIN_CONFIRM_S, poll_interval(warning_s))


def find_stalls(
    reports: Mapping[int, Mapping[str, Any]], ranks: Sequence[int]
) -> List[Dict[str, Any]]:
    """The stalled tensors from every worker's report.

    A report: ``{"waiting": {name: [round, age_s]}, "counts": {name: submissions}}``
    (round: how many times that rank had submitted the name, this one included), and
    ``"members": {name: ranks}`` for the parts of a process set's collectives (only its
    ranks submit them; None: unknown). A rank whose count is below the highest waiting
    round of a name has not submitted it; a rank without a report (it left the job) has
    submitted nothing more."""
    names: Dict[str, Tuple[int, float, List[int]]] = {}
    members: Dict[str, Sequence[int]] = {}  # a process set's parts: its ranks only
    for rank, rep in reports.items():
        for name, (rnd, age) in rep.get("waiting", {}).items():
            top, oldest, waiting = names.get(name, (0, 0.0, []))
            names[name] = (max(top, int(rnd)), max(oldest, float(age)), [*waiting, rank])
        members.update(rep.get("members") or {})
    out = []
    for name, (rnd, age, waiting) in sorted(names.items()):
        missing = [
            r
            for r in members.get(name, ranks)
            if int(reports.get(r, {}).get("counts", {}).get(name, 0)) < rnd
        ]
        out.append(
            {
                "name": name,
                "round": rnd,
                "age_s": age,
                "waiting": sorted(waiting),
                "missing": missing,
            }
        )
    return out


def describe(stall: Mapping[str, Any]) -> str:
    missing = stall["missing"]
    waiting = _ranks(stall["waiting"])
    kind = stall.get("kind", "push")
    if kind != "push":  # a collective or barrier the scheduler holds (control_wait)
        what, verb = _held_words(kind, f"'{stall['name']}'")
        return (
            f"{what}{_in_set(stall)} has waited {stall['age_s']:.0f} s on {waiting}: "
            f"{_ranks(missing)} did not {verb} it"
        )
    if not missing:
        return (
            f"tensor '{stall['name']}' has waited {stall['age_s']:.0f} s on {waiting} "
            "although every rank submitted it (a slow or stuck data path)"
        )
    return (
        f"tensor '{stall['name']}' has waited {stall['age_s']:.0f} s on {waiting}: "
        f"{_ranks(missing)} did not submit it"
    )


def control_wait(
    kind: str,
    name: str,
    waiting: Sequence[int],
    missing: Sequence[int],
    age_s: float,
    set_id: int = 0,
) -> Dict[str, Any]:
    """A wait the scheduler holds: ``kind`` "op" (a collective's announcement, gathered by
    core/coordinator.py, of process set ``set_id``) or "barrier" (``api.barrier``)."""
    return {
        "kind": kind,
        "name": name,
        "set": set_id,
        "waiting": sorted(waiting),
        "missing": sorted(missing),
        "age_s": age_s,
    }


def _ranks(ranks: Sequence[int]) -> str:
    """``rank 2`` / ``ranks 0, 1`` / ``ranks 0-7, 9``."""
    rs = sorted(ranks)
    parts: List[str] = []
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{rs[i]}-{rs[j]}")
        else:
            parts.extend(str(r) for r in rs[i : j + 1])
        i = j + 1
    return f"rank{'s' if len(rs) > 1 else ''} {', '.join(parts)}"


def _held_words(kind: str, shown: str) -> Tuple[str, str]:
    """(what is waited in, the verb of reaching it) for a wait the scheduler holds."""
    if kind == "barrier":
        return f"barrier {shown}", "enter"
    if shown.strip("'") == JOIN:
        return "join", "join"
    return f"collective {shown}", "call"


def _in_set(item: Mapping[str, Any]) -> str:
    return f" of process set {item['set']}" if item.get("set") else ""


def find_deadlock(
    reports: Mapping[int, Mapping[str, Any]],
    control: Sequence[Mapping[str, Any]],
    ranks: Sequence[int],
) -> Optional[List[Dict[str, Any]]]:
    """The waits that hold the job if, in this snapshot, no rank can make progress; else None.

    ``reports``: every rank's stall report (``StallInspector._report``); ``control``: the
    waits the scheduler holds (``control_wait``); ``ranks``: the job's ranks, all live.
    Deadlocked when every rank waits on something and every wait lacks a rank: a
    push_pull round submitted by fewer ranks than can close it (every rank; under quorum
    rounds, the fewest the worker reports as ``closers``), a collective or barrier some
    member has not reached. A rank blocked in a wait cannot submit what another waits
    for, so none of them ever comes. A wait every rank submitted (a slow data path) is
    not provably stuck, so it rules the snapshot out. Per (name, round), not per name: a
    rank waiting on an older, complete round of a name is merely slow."""
    ranks = sorted(ranks)
    if not ranks or any(r not in reports for r in ranks):
        return None
    closers = len(ranks)
    members: Dict[str, List[int]] = {}
    for rep in reports.values():
        c = rep.get("closers")
        if c is not None:
            closers = min(closers, max(1, int(c)))
        if "members" in rep and rep["members"] is None:
            return None  # which ranks submit its process sets' parts is unknown
        for name, rs in rep.get("members", {}).items():
            members[name] = sorted(int(r) for r in rs)
    # A rank in join pushes zeros for plain sums but no part of a routed collective:
    # never count it as owing a push_pull.
    joined = {r for c in control if c["kind"] == "op" and c["name"] == JOIN for r in c["waiting"]}
    counts = {r: reports[r].get("counts", {}) for r in ranks}
    items: Dict[Tuple[str, int, str, int], Dict[str, Any]] = {}
    for rank in ranks:
        for name, (rnd, _age) in reports[rank].get("waiting", {}).items():
            rnd = int(rnd)
            item = items.get(("push", 0, name, rnd))
            if item is None:
                # A process set's part: only its members submit it (routed, never a quorum).
                pushers = members.get(name, ranks)
                need = len(pushers) if name in members else closers
                submitted = [r for r in pushers if int(counts.get(r, {}).get(name, 0)) >= rnd]
                if len(submitted) >= need:
                    return None  # enough ranks submitted it: it may still finish
                missing = [r for r in pushers if r not in submitted and r not in joined]
                if not missing:
                    return None
                item = items[("push", 0, name, rnd)] = {
                    "kind": "push",
                    "name": name,
                    "round": rnd,
                    "set": 0,
                    "waiting": [],
                    "missing": missing,
                }
            item["waiting"].append(rank)
    for c in control:
        if not c["missing"]:
            return None  # complete: about to be answered
        key = (str(c["kind"]), int(c.get("set", 0)), str(c["name"]), 0)
        items[key] = {**c, "round": 0, "waiting": sorted(c["waiting"])}
    waiting = {r for item in items.values() for r in item["waiting"]}
    if any(r not in waiting for r in ranks):
        return None  # a rank not waiting may be computing, and submit next
    return [items[k] for k in sorted(items)]


def progress_key(
    reports: Mapping[int, Mapping[str, Any]], control: Sequence[Mapping[str, Any]]
) -> Tuple[Any, ...]:
    """What changes whenever any rank makes progress: every rank's submission counts and
    waits, and the waits the scheduler holds (not their ages)."""
    ranks = tuple(
        (
            r,
            tuple(sorted((str(n), int(c)) for n, c in rep.get("counts", {}).items())),
            tuple(sorted((str(n), int(w[0])) for n, w in rep.get("waiting", {}).items())),
        )
        for r, rep in sorted(reports.items())
    )
    held = tuple(
        sorted(
            (str(c["kind"]), int(c.get("set", 0)), str(c["name"]), tuple(c["waiting"]))
            for c in control
        )
    )
    return (ranks, held)


def describe_deadlock(items: Sequence[Mapping[str, Any]]) -> str:
    """One line naming who waits for what, which ranks never submit it, walking the cycle
    (from a wait to the wait of the ranks it lacks). Waits alike but for the name merge."""
    groups: Dict[Tuple[Any, ...], List[str]] = {}
    for item in items:
        key = (
            item["kind"],
            int(item.get("set", 0)),
            int(item.get("round", 0)),
            tuple(item["waiting"]),
            tuple(item["missing"]),
        )
        groups.setdefault(key, []).append(str(item["name"]))
    left = sorted(groups, key=lambda k: (k[3], k[0], k[2]))
    order: List[Tuple[Any, ...]] = []
    while left:
        nxt = left[0]
        if order:
            owed = set(order[-1][4])
            nxt = next((k for k in left if owed & set(k[3])), nxt)
        left.remove(nxt)
        order.append(nxt)
    parts = []
    for key in order[:MAX_DESCRIBED]:
        kind, set_id, rnd, waiting, missing = key
        names = groups[key]
        shown = ", ".join(f"'{n}'" for n in names[:3])
        if len(names) > 3:
            shown += f" and {len(names) - 3} more"
        one = len(waiting) == 1
        who, lacking = _ranks(waiting), _ranks(missing)
        has = "has" if len(missing) == 1 else "have"
        in_set = _in_set({"set": set_id})
        waits = "waits" if one else "wait"
        if kind == "push":
            what = f"round {rnd} of {shown}"
            parts.append(f"{who} {waits} for {what}, which {lacking} {has} not submitted")
        else:
            what, verb = _held_words(kind, shown)
            done = {"call": "called", "enter": "entered", "join": "joined"}[verb]
            parts.append(f"{who} {waits} in {what}{in_set}, which {lacking} {has} not {done}")
    if len(order) > MAX_DESCRIBED:
        parts.append(f"and {len(order) - MAX_DESCRIBED} more waits")
    return "permanent stall (no rank can make progress): " + "; ".join(parts)


class DeadlockWatch:
    """The scheduler's proof that a stall is permanent: :func:`find_deadlock` holds in two
    inquiries at least ``confirm_s`` apart with nothing moved in between (``progress_key``):
    a rank that is slow but progressing changes its counts, and a rank with a push_pull in
    flight that still computes would submit something within that time."""

    def __init__(self) -> None:
        self._first: Optional[Tuple[float, Tuple[Any, ...]]] = None

    def observe(
        self,
        now: float,
        reports: Mapping[int, Mapping[str, Any]],
        control: Sequence[Mapping[str, Any]],
        ranks: Sequence[int],
        confirm_s: float,
    ) -> Tuple[Optional[str], Optional[float]]:
        """(the description once proven, else None; when to inquire again to prove it)."""
        items = find_deadlock(reports, control, ranks)
        if items is None:
            self._first = None
            return None, None
        key = progress_key(reports, control)
        if self._first is None or self._first[1] != key:
            self._first = (now, key)
            return None, now + confirm_s
        since = self._first[0]
        if now - since < confirm_s:
            return None, since + confirm_s
        self._first = None
        return describe_deadlock(items), None

    def reset(self) -> None:
        self._first = None


def _set_parts() -> Optional[Dict[str, List[int]]]:
    """The data parts of this worker's collectives in flight on a process set other than
    the global one (core/collectives.py), with the set's ranks: only those submit them.
    None if they cannot be told (then no deadlock is proven)."""
    coll = sys.modules.get(f"{__package__}.collectives")  # not in use unless imported
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


def _closers() -> Optional[int]:
    """The fewest submitting ranks that may finish a round of a sum on this worker (None:
    every rank). Under quorum rounds a round closes with k pushers, where a pusher is a
    worker, or a host (a rack) summing its workers first: it pushes only once all of them
    submitted, so k pushers mean at least k submitting ranks, and a fraction f of the
    pushers at least ceil(f * the fewest pushers there may be). Async exchanges finish
    alone (1)."""
    try:
        from . import api  # the worker's state; never imported by the scheduler
    except ImportError:  # pragma: no cover - only on a broken install
        return None
    st = getattr(api, "_state", None)
    if st is None:
        return None
    cfg = st.cfg
    if cfg.mode == "async":
        return 1
    # Off with elastic servers (api._State.quorum): every round waits for all there.
    if not getattr(st, "quorum", cfg.round_quorum or cfg.round_quorum_fraction):
        return None
    if cfg.round_quorum:
        return int(cfg.round_quorum)
    pushers = cfg.num_workers
    members = st.membership.workers if st.membership is not None else []
    if cfg.shm and members:
        pushers = min(pushers, len({w.hostname for w in members}))
    if any(w.rack for w in members):
        pushers = min(pushers, len({w.rack for w in members}))
    return max(1, math.ceil(cfg.round_quorum_fraction * pushers))


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
    ) -> None:
        self._client = client
        self._rank = rank
        self.warning_s = warning_s
        self.shutdown_s = shutdown_s
        self.counts = counts if counts is not None else SubmissionCounts()
        self._lock = self.counts.lock  # one lock for counting and waiting (submit/settle)
        # name -> round, name -> since: two dicts of plain numbers, so an op in flight keeps
        # no object the garbage collector tracks (docs/torch.md, "Garbage collection").
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
        closers = _closers()
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
