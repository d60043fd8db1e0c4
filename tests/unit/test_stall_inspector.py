"""The stall inspector's judgement without a job (core/control/stalls.py, core/worker/stall.py):
which ranks wait for what, when a stall is provably permanent, and how both are described.
The same inspector in real jobs: tests/integration/test_stall.py."""

from __future__ import annotations

from typing import Any, Dict, List

from fastps.control.stalls import (
    DeadlockWatch,
    _ranks,
    control_wait,
    describe,
    describe_deadlock,
    find_deadlock,
    find_stalls,
)
from fastps.worker.stall import SubmissionCounts

PERMANENT = "permanent stall (no rank can make progress): "


def test_find_stalls_counts_rounds_not_names() -> None:
    reports = {
        0: {"waiting": {"a": [3, 70.0]}, "counts": {"a": 3, "b": 5}},
        1: {"waiting": {"a": [3, 65.0]}, "counts": {"a": 3, "b": 5}},
        # Rank 2 pushed 'a' twice, in earlier rounds: it owes round 3.
        2: {"waiting": {"b": [6, 1.0]}, "counts": {"a": 2, "b": 6}},
    }
    stalls = {s["name"]: s for s in find_stalls(reports, [0, 1, 2, 3])}
    assert stalls["a"]["missing"] == [2, 3]  # rank 3 left the job without a report
    assert stalls["a"]["waiting"] == [0, 1] and stalls["a"]["age_s"] == 70.0
    assert stalls["b"]["missing"] == [0, 1, 3]


def test_submission_counts_forget_one_off_names_only() -> None:
    counts = SubmissionCounts(limit=8)
    for _ in range(3):
        counts.add("grad.w")
    for i in range(20):
        counts.add(f"allreduce.noname.{i}", lambda: ["allreduce.noname.0"])
    kept = counts.snapshot()
    assert kept["grad.w"] == 3 and counts.most == 3
    assert "allreduce.noname.0" in kept  # still in flight
    assert "allreduce.noname.19" in kept  # the one just added
    assert len(kept) <= 8


def _rep(waiting: Dict[str, int], counts: Dict[str, int], **extra: Any) -> Dict[str, Any]:
    return {"waiting": {n: [r, 9.0] for n, r in waiting.items()}, "counts": counts, **extra}


def _order_reports() -> Dict[int, Dict[str, Any]]:
    return {
        0: _rep({"a": 1}, {"w": 1, "a": 1}),
        1: _rep({"b": 1}, {"w": 1, "b": 1}),
    }


def test_find_deadlock_names_the_cycle_of_a_different_order() -> None:
    items = find_deadlock(_order_reports(), [], [0, 1])
    assert items is not None
    assert [(i["name"], i["waiting"], i["missing"]) for i in items] == [
        ("a", [0], [1]),
        ("b", [1], [0]),
    ]
    assert describe_deadlock(items) == PERMANENT + (
        "rank 0 waits for round 1 of 'a', which rank 1 has not submitted; "
        "rank 1 waits for round 1 of 'b', which rank 0 has not submitted"
    )


def test_find_deadlock_refuses_what_may_still_finish() -> None:
    ranks = [0, 1, 2]
    # Everybody submitted 'g': a slow data path, not a deadlock.
    slow = {r: _rep({"g": 4}, {"g": 4}) for r in ranks}
    assert find_deadlock(slow, [], ranks) is None
    # Rank 2 is computing (waits for nothing): it may submit next.
    computing = {0: _rep({"x": 1}, {"x": 1}), 1: _rep({"x": 1}, {"x": 1}), 2: _rep({}, {})}
    assert find_deadlock(computing, [], ranks) is None
    # One wait lacks nobody among others that do: that one may finish, and free its rank.
    mixed = {
        0: _rep({"a": 1}, {"a": 1, "b": 1}),
        1: _rep({"b": 1}, {"b": 1}),
        2: _rep({"b": 1}, {"b": 1}),
    }
    assert find_deadlock(mixed, [], ranks) is None
    # Rank 1 waits on round 2 of 'a', which everybody submitted; rank 0 is a round ahead.
    rounds = {0: _rep({"a": 3}, {"a": 3}), 1: _rep({"a": 2}, {"a": 2})}
    assert find_deadlock(rounds, [], [0, 1]) is None
    # A rank without a report (it did not answer): no proof.
    assert find_deadlock({0: _rep({"a": 1}, {"a": 1})}, [], [0, 1]) is None


def test_find_deadlock_with_held_waits_and_quorum_rounds() -> None:
    """The motivating case: under quorum rounds (k = 2 of 3) rank 2 caught up and pushed
    round 29 alone, while ranks 0 and 1 wait in the epoch-end allreduce it never calls."""
    reports = {
        r: _rep({"grad.0.bias": 29} if r == 2 else {}, {"grad.0.bias": 28 + (r == 2)}, closers=2)
        for r in range(3)
    }
    held = [control_wait("op", "train.loss", [0, 1], [2], 9.0)]
    items = find_deadlock(reports, held, [0, 1, 2])
    assert items is not None
    assert describe_deadlock(items) == PERMANENT + (
        "ranks 0, 1 wait in collective 'train.loss', which rank 2 has not called; "
        "rank 2 waits for round 29 of 'grad.0.bias', which ranks 0, 1 have not submitted"
    )
    # A round two ranks pushed may close under k = 2: not provably stuck.
    closing = {
        r: _rep(
            {"loss": 1} if r < 2 else {"g": 5}, {"loss": int(r < 2), "g": 4 + (r == 2)}, closers=2
        )
        for r in range(3)
    }
    assert find_deadlock(closing, [], [0, 1, 2]) is None
    # The same without quorum rounds: 'loss' lacks rank 2, and 'g' ranks 0 and 1.
    plain = {r: {k: v for k, v in rep.items() if k != "closers"} for r, rep in closing.items()}
    assert find_deadlock(plain, [], [0, 1, 2]) is not None


def test_find_deadlock_knows_process_sets_and_join() -> None:
    ranks = [0, 1, 2]
    # Ranks 1 and 2 both submitted their process set's part: only rank 0 never does, and
    # it owes nothing there.
    reports = {
        0: _rep({"lonely": 1}, {"lonely": 1}),
        1: _rep({"p.0.1.256": 1}, {"p.0.1.256": 1}, members={"p.0.1.256": [1, 2]}),
        2: _rep({"p.0.1.256": 1}, {"p.0.1.256": 1}, members={"p.0.1.256": [1, 2]}),
    }
    assert find_deadlock(reports, [], ranks) is None
    unknown = {**reports, 1: {**reports[1], "members": None}}
    assert find_deadlock(unknown, [], ranks) is None
    # Rank 0 is in join: it owes no push_pull (it pushes zeros for sums as they come).
    joined = {
        0: _rep({}, {}),
        1: _rep({"x": 1}, {"x": 1}),
        2: _rep({"x": 1}, {"x": 1}),
    }
    held = [control_wait("op", "__join__", [0], [1, 2], 9.0)]
    assert find_deadlock(joined, held, ranks) is None
    # A held wait that lacks nobody is about to be answered.
    done = [control_wait("barrier", "barrier.3", [0, 1, 2], [], 0.0)]
    assert find_deadlock(_order_reports(), done, [0, 1]) is None


def test_deadlock_watch_proves_only_what_does_not_move() -> None:
    watch = DeadlockWatch()
    reports = _order_reports()
    text, again = watch.observe(100.0, reports, [], [0, 1], 1.0)
    assert text is None and again == 101.0
    # Too soon for a proof: look again at the same time.
    assert watch.observe(100.4, reports, [], [0, 1], 1.0) == (None, 101.0)
    # Progress in between (rank 1 submitted something): the clock starts again.
    moved = {**reports, 1: _rep({"b": 1}, {"w": 2, "b": 1})}
    assert watch.observe(100.8, moved, [], [0, 1], 1.0) == (None, 101.8)
    assert watch.observe(101.5, moved, [], [0, 1], 1.0) == (None, 101.8)
    text, again = watch.observe(101.8, moved, [], [0, 1], 1.0)
    assert text is not None and text.startswith(PERMANENT) and again is None
    # Nothing looks stuck: nothing to prove, nothing to look at again.
    slow = {r: _rep({"g": 1}, {"g": 1}) for r in (0, 1)}
    assert watch.observe(103.0, slow, [], [0, 1], 1.0) == (None, None)


def test_descriptions() -> None:
    assert _ranks([3]) == "rank 3"
    assert _ranks([0, 1]) == "ranks 0, 1"
    assert _ranks([9, 0, 1, 2, 3, 5, 7, 8]) == "ranks 0-3, 5, 7-9"
    assert _ranks([4, 6, 7]) == "ranks 4, 6, 7"
    held = control_wait("op", "x", [0], [1, 2], 61.0, set_id=1)
    assert describe(held) == (
        "collective 'x' of process set 1 has waited 61 s on rank 0: ranks 1, 2 did not call it"
    )
    # Waits alike but for the name are one clause; the list of waits is bounded.
    items: List[Dict[str, Any]] = [
        {"kind": "push", "name": f"g{i}", "round": 4, "waiting": [1], "missing": [0]}
        for i in range(5)
    ]
    items.append({"kind": "op", "name": "__join__", "set": 0, "waiting": [0], "missing": [1]})
    text = describe_deadlock(items)
    assert text == PERMANENT + (
        "rank 0 waits in join, which rank 1 has not joined; "
        "rank 1 waits for round 4 of 'g0', 'g1', 'g2' and 2 more, which rank 0 has not submitted"
    )
    many = [
        {
            "kind": "push",
            "name": f"t{i}",
            "round": i + 1,
            "waiting": [i % 2],
            "missing": [1 - i % 2],
        }
        for i in range(9)
    ]
    assert describe_deadlock(many).endswith("; and 3 more waits")
