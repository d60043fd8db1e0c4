"""The control client's routing of completions around a withdrawal (core/control/protocol.py),
with no connection: a completion read before the acknowledgement of a withdrawal is the
withdrawn announcement's. The whole case in a real job:
tests/integration/test_late_completion.py."""

from __future__ import annotations

from typing import Any, Dict, List

from fastps.control.protocol import ControlClient


def _client() -> Any:
    """A ControlClient with no connection: only its message handling is exercised."""
    return ControlClient(("127.0.0.1", 1), "job", "token")


def test_client_routes_a_completion_read_before_the_withdraw_ack() -> None:
    """The scheduler answers in order: a completion read before the acknowledgement of a
    withdrawal is the withdrawn announcement's; after it, a new announcement's."""
    c = _client()
    sent: List[Dict[str, Any]] = []
    c._send = sent.append
    c._check_live = lambda: None
    got: List[str] = []
    c.coordinate(0, [0, 1], "x", {}, lambda m: got.append("first"))
    c.withdraw(0, [0, 1], "x")
    seq = sent[-1]["seq"]
    assert sent[-1]["withdraw"] is True
    # Re-announced before the acknowledgement came back.
    c.coordinate(0, [0, 1], "x", {}, lambda m: got.append("second"))
    c._dispatch({"type": "coord_done", "set": 0, "name": "x", "records": [{}, {}]})
    assert got == ["first"]
    c._dispatch({"type": "coord_withdrawn", "set": 0, "name": "x", "seq": seq})
    c._dispatch({"type": "coord_done", "set": 0, "name": "x", "records": [{}, {}]})
    assert got == ["first", "second"]
    # A withdrawal that took effect: the next completion is the new announcement's.
    c.coordinate(0, [0, 1], "y", {}, lambda m: got.append("y1"))
    c.withdraw(0, [0, 1], "y")
    c._dispatch({"type": "coord_withdrawn", "set": 0, "name": "y", "seq": sent[-1]["seq"]})
    c.coordinate(0, [0, 1], "y", {}, lambda m: got.append("y2"))
    c._dispatch({"type": "coord_done", "set": 0, "name": "y", "records": [{}, {}]})
    assert got == ["first", "second", "y2"]
    assert c._withdrawn == {} and c._coords == {}
