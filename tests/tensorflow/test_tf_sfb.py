"""Sufficient-factor broadcasting of Keras 3 Dense kernels (docs/guide/sfb.md) in a real 2-worker
job (tests/tensorflow/workers/tf_sfb_worker.py): float64 weights after several steps equal
the dense path's (bit for bit with integer data), with DistributedGradientTape eagerly and
in tf.function and with model.fit; auto's choices, the fallback of a graph traced without
a batch size, and the error for a loss term on a factored kernel."""

from __future__ import annotations

import re

import pytest
from tfjobs import tail


@pytest.mark.shared_check("keras3", "sfb")
def test_sfb_equals_dense_path(shared_check) -> None:
    p = shared_check  # workers/tf_sfb_worker.py, in the shared job of tfjobs.SHARED_GROUPS
    assert p.returncode == 0, tail(p)
    for r in range(2):
        assert f"rank {r} OK" in p.stdout, tail(p)
    assert len(re.findall(r"rank 0 .*: ok", p.stdout)) == 7, tail(p)
    # rank 0 prints the cost model's choice per layer, once per model
    assert re.search(
        r"fastps SFB +wide/kernel: 256x256, 4 rows x 2 workers: .*-> sufficient factors", p.stderr
    ), tail(p)
    assert re.search(r"fastps SFB +head/kernel: 2x256, .*-> servers", p.stderr), tail(p)
    assert re.search(
        r"rows unknown when the graph was traced .*servers: traced/kernel", p.stderr
    ), tail(p)
    assert "no Dense rows captured yet" in p.stderr, tail(p)
    assert "[worker 1] fastps SFB" not in p.stderr, tail(p)
