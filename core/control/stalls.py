"""The stall inspector's judgement, on the scheduler: which ranks keep a tensor waiting, and
when a stall is permanent. The worker side (what each worker reports) is
``fastps.worker.stall``.

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
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from fastps.control.coordinator import JOIN

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
    core/control/coordinator.py, of process set ``set_id``) or "barrier" (``api.barrier``)."""
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
