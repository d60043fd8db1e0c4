"""Numbering of anonymous collectives (core/collectives/anon_names.py): a number withdrawn before it
coordinated is given back, from the top only, once no op with it still runs; a number any
part of which coordinated, or that a joined rank skipped, is never reused."""

from __future__ import annotations

from fastps.collectives.anon_names import Numbering, number_of


def test_names_parse() -> None:
    assert number_of("noname.12") == ("noname", 12)
    assert number_of("noname.12.3") == ("noname", 12)
    assert number_of("noname.12.size") == ("noname", 12)
    assert number_of("barrier.4") == ("barrier", 4)
    assert number_of("grads") is None
    assert number_of("nonamed.1") is None
    assert number_of("allreduce.noname.3") is None


def run(c: Numbering, withdrawn: bool) -> int:
    n = c.take()
    c.started(n)
    c.finished(n, withdrawn)
    return n


def test_withdrawn_number_is_taken_again() -> None:
    c = Numbering()
    assert run(c, False) == 0
    assert run(c, True) == 1
    assert c.peek() == 1
    assert run(c, False) == 1
    assert c.peek() == 2


def test_given_back_from_the_top_only() -> None:
    c = Numbering()
    a, b = c.take(), c.take()
    c.started(a)
    c.started(b)
    c.finished(a, withdrawn=True)
    assert c.peek() == 2  # b still runs
    c.finished(b, withdrawn=True)
    assert c.peek() == 0  # both back, in order


def test_not_given_back_below_a_coordinated_number() -> None:
    c = Numbering()
    a, b = c.take(), c.take()
    c.started(a)
    c.started(b)
    c.finished(a, withdrawn=True)
    c.finished(b, withdrawn=False)
    assert c.peek() == 2


def test_group_parts_share_a_number() -> None:
    c = Numbering()
    n = c.take()
    for _ in range(3):
        c.started(n)
    c.finished(n, withdrawn=True)
    c.finished(n, withdrawn=True)
    assert c.peek() == 1  # one part still runs
    c.finished(n, withdrawn=True)
    assert c.peek() == 0
    # a part that coordinated (an object broadcast's '.size') keeps the number used
    n = c.take()
    c.started(n)
    c.finished(n, withdrawn=False)
    c.started(n)
    c.finished(n, withdrawn=True)
    assert c.peek() == 1


def test_skipped_numbers_stay_used() -> None:
    c = Numbering()
    n = c.take()
    c.started(n)
    c.skip_past(4)
    assert c.peek() == 5
    c.finished(n, withdrawn=True)
    assert c.peek() == 5
