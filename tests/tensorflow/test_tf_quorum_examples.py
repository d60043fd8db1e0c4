"""The Keras digits example (a fixed number of epochs, as users write it) trains under
quorum rounds (FASTPS_ROUND_QUORUM, docs/guide/async.md) on every data path, to the accuracy it
reaches without them (tests/quorum_examples.py runs it)."""

from __future__ import annotations

import pytest
from quorum_examples import run_digits

ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0"}
PATHS = ["tcp", "shm", "local", "hosts"]


@pytest.fixture(scope="module")
def plain_accuracy() -> float:
    accuracy, _ = run_digits("tensorflow/keras_digits.py", [], "tcp", 3, None, env=ENV)
    return accuracy


# Under a quorum of 2 of 3 the slowest worker's gradients are dropped, and under load it is
# often the same worker, so its shard counts less: on a quiet machine 5 runs under a quorum
# ended at 0.96-0.98; under a CI run's load one ended at 0.944, its plain run at 0.982. The
# bound leaves room for that; a wrong sum or a lost round costs far more.
TOLERANCE = 0.04


@pytest.mark.parametrize("path", PATHS)
def test_keras_digits_example_trains_under_quorum_rounds(plain_accuracy: float, path: str) -> None:
    # The example's own exit check (--target, 0.95 by default) is lowered so that this
    # test's comparison, which names both accuracies, is the one that decides.
    args = ["--target", "0.9"]
    accuracy, out = run_digits("tensorflow/keras_digits.py", args, path, 3, 2, env=ENV)
    assert "/450)" in out, out[-2000:]  # the test counts are an exact sum
    assert accuracy >= plain_accuracy - TOLERANCE, (accuracy, plain_accuracy, out[-2000:])
