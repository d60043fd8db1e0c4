"""Units of the shared quorum catch-up policy (core/worker/catch_up.py) and of the async exchange's
restart in a new core session (core/worker/async_mode.py), without a job: the multi-process tests
are tests/torch/test_torch_quorum.py, tests/tensorflow/test_tf_quorum_catchup.py,
tests/mxnet/test_mx_quorum_catchup.py and tests/integration/elastic/test_elastic.py (async)."""

from __future__ import annotations

from typing import Any, List

import numpy as np
import pytest
from fastps.worker import api, async_mode
from fastps.worker import catch_up as cu


def test_least_lag_is_the_least_and_unknown_means_none() -> None:
    assert cu.least_lag([3, 1, 2]) == 1
    assert cu.least_lag([3, cu.UNKNOWN, 2]) == 0
    assert cu.least_lag([]) == 0


def test_round_lag_takes_once_and_forgets_an_earlier_session(monkeypatch: Any) -> None:
    first, second = object(), object()
    monkeypatch.setattr(api, "_state", first)
    lags = cu.RoundLag()
    for lag in (4, 2, 5):
        lags.note(lag)
    assert lags.take() == 2
    assert lags.take() == 0  # taken: the next step counts afresh
    lags.note(3)
    lags.unknown()  # one gradient off the fetchable path: no catch-up this step
    lags.note(5)
    assert lags.take() == 0
    lags.note(3)
    # an elastic membership change: new servers, rounds from 0; the old lag means nothing
    monkeypatch.setattr(api, "_state", second)
    assert lags.take() == 0
    lags.note(1)
    assert lags.take() == 1


def test_catch_up_applies_exactly_the_rounds_named() -> None:
    fetched: List[int] = []
    applied: List[int] = []

    def fetch() -> int:
        fetched.append(len(fetched))
        return fetched[-1]

    assert cu.catch_up(3, fetch, applied.append) == 3
    assert fetched == applied == [0, 1, 2]
    assert cu.catch_up(0, fetch, applied.append) == 0
    assert len(applied) == 3


@pytest.fixture
def fake_servers(monkeypatch: Any) -> List[str]:
    """async_mode's core calls, recorded instead of sent."""
    calls: List[str] = []
    monkeypatch.setattr(async_mode, "_alone", lambda: False)
    monkeypatch.setattr(async_mode, "init_params", lambda named: calls.append("init"))
    monkeypatch.setattr(async_mode, "update_async", lambda named: calls.append("update") or [])
    return calls


def test_delta_exchange_starts_the_servers_again_in_a_new_session(
    monkeypatch: Any, fake_servers: List[str]
) -> None:
    sessions = [object()]
    monkeypatch.setattr(async_mode, "session", lambda: sessions[-1])
    ex = async_mode.DeltaExchange("test")
    before, after = [np.zeros(3)], [np.ones(3)]
    ex.step(["w"], before, after)
    ex.step(["w"], before, after)
    assert fake_servers == ["init", "update", "update"]
    sessions.append(object())  # an elastic membership change: new servers, empty
    ex.step(["w"], before, after)
    assert fake_servers[3:] == ["init", "update"]
