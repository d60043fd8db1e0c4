"""Keras DistributedOptimizer(backward_passes_per_step=N) and PartialDistributedOptimizer
under Keras 3 and Keras 2, in real 2-worker jobs
(tests/tensorflow/workers/tf_keras_aggregation_worker.py)."""

from __future__ import annotations

import re

import pytest
from tfjobs import tail


def _shared(check: str) -> list:
    return [pytest.param(k, marks=pytest.mark.shared_check(k, check)) for k in ("keras3", "keras2")]


@pytest.mark.parametrize("keras", _shared("aggregation"))
def test_local_aggregation_and_local_layers(shared_check, keras: str) -> None:
    """With N passes per step the weights stay put for N - 1 passes and then equal the
    update with every rank's summed gradients averaged (divided by N when asked); local
    layers take this rank's own sum / size and differ between ranks; custom loops eagerly
    and in tf.function, model.fit; bad arguments raise naming the culprit."""
    p = shared_check  # workers/tf_keras_aggregation_worker.py KERAS, shared job (tfjobs.py)
    assert p.returncode == 0, tail(p)
    for r in range(2):
        assert f"rank {r} OK" in p.stdout, tail(p)
    cases = 10 if keras == "keras2" else 5  # two optimizer kinds under Keras 2
    assert len(re.findall(r"rank 0 .*: ok", p.stdout)) == cases, tail(p)


@pytest.mark.parametrize("keras", _shared("compute-gradients"))
def test_compute_gradients_reduces_once(shared_check, keras: str) -> None:
    """Horovod's split step, ``_compute_gradients`` then ``apply_gradients``: the gradients
    come back reduced (with op=Sum a second reduction would show), scalars stay scalars,
    with N=2 the first pass returns this rank's own gradients and applies nothing; the
    plain ``apply_gradients`` path with a scalar variable too; eagerly and in tf.function
    (tests/tensorflow/workers/tf_keras_compute_gradients_worker.py)."""
    p = shared_check  # workers/tf_keras_compute_gradients_worker.py KERAS, shared (tfjobs.py)
    assert p.returncode == 0, tail(p)
    for r in range(2):
        assert f"rank {r} OK" in p.stdout, tail(p)
    cases = 16 if keras == "keras2" else 8  # two optimizer kinds under Keras 2
    assert len(re.findall(r"rank 0 .*: ok", p.stdout)) == cases, tail(p)
