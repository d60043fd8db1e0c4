"""The Gluon digits example (a fixed number of epochs, as users write it) trains under
quorum rounds (FASTPS_ROUND_QUORUM, docs/guide/async.md) on every data path, to the accuracy it
reaches without them (tests/quorum_examples.py runs it)."""

from __future__ import annotations

import pytest
from quorum_examples import run_digits

PATHS = ["tcp", "shm", "local", "hosts"]


@pytest.fixture(scope="module")
def plain_accuracy() -> float:
    accuracy, _ = run_digits("mxnet/gluon_digits.py", [], "tcp", 3, None)
    return accuracy


@pytest.mark.parametrize("path", PATHS)
def test_gluon_digits_example_trains_under_quorum_rounds(plain_accuracy: float, path: str) -> None:
    accuracy, out = run_digits("mxnet/gluon_digits.py", [], path, 3, 2)
    assert accuracy >= plain_accuracy - 0.02, (accuracy, plain_accuracy, out[-2000:])
