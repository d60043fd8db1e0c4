"""The scheduler's gather bookkeeping for collectives (pure, no sockets)."""

from __future__ import annotations

from fastps.control.coordinator import JOIN, Coordinator


def test_gather_completes_when_every_member_announced() -> None:
    c = Coordinator()
    done, err = c.announce(0, [0, 1, 2], "x", 1, {"v": 1})
    assert (done, err) == ([], None)
    done, err = c.announce(0, [0, 1, 2], "x", 0, {"v": 0})
    assert done == [] and err is None
    done, err = c.announce(0, [2, 1, 0], "x", 2, {"v": 2})
    assert err is None and len(done) == 1
    assert done[0].ranks == [0, 1, 2]
    assert done[0].message["records"] == [{"v": 0}, {"v": 1}, {"v": 2}]
    # the name is free again
    assert c.announce(0, [0, 1, 2], "x", 0, {"v": 0}) == ([], None)


def test_outsider_twice_and_disagreeing_sets_are_refused() -> None:
    c = Coordinator()
    done, err = c.announce(3, [0, 2], "y", 1, {})
    assert done == [] and "rank 1 is not a member of process set 3" in err
    c.announce(3, [0, 2], "y", 0, {})
    _, err = c.announce(3, [0, 2], "y", 0, {})
    assert "announced op 'y' twice" in err
    _, err = c.announce(3, [0, 1, 2], "y", 2, {})
    assert "ranks [0, 1, 2]" in err and "ranks [0, 2]" in err


def test_joined_ranks_count_as_present_and_join_names_the_last() -> None:
    c = Coordinator()
    assert c.announce(0, [0, 1, 2], JOIN, 0, {"k": "join"}) == ([], None)
    done, _ = c.announce(0, [0, 1, 2], "ar", 1, {"k": "allreduce"})
    assert done == []  # rank 2 still works
    done, _ = c.announce(0, [0, 1, 2], "ar", 2, {"k": "allreduce"})
    assert len(done) == 1 and done[0].message["records"][0] is None
    assert done[0].ranks == [0, 1, 2]  # the joined rank is told too: it stands in
    c.announce(0, [0, 1, 2], JOIN, 2, {"k": "join"})
    done, _ = c.announce(0, [0, 1, 2], JOIN, 1, {"k": "join"})
    assert len(done) == 1 and done[0].message["last"] == 1


def test_join_completes_pending_gathers_first_and_withdraw_frees_a_name() -> None:
    c = Coordinator()
    c.announce(0, [0, 1], "pending", 1, {"k": "allreduce"})
    done, _ = c.announce(0, [0, 1], JOIN, 0, {"k": "join"})
    assert [d.message["name"] for d in done] == ["pending"]
    c.withdraw(0, JOIN, 0)
    done, _ = c.announce(0, [0, 1], "late", 1, {})
    assert done == []  # rank 0 no longer counts as joined
    c.withdraw(0, "late", 1)
    assert c.announce(0, [0, 1], "late", 1, {}) == ([], None)  # not "twice"
