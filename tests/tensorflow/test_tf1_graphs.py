"""Collectives in TensorFlow 1 graphs (``tf.compat.v1.Session``) with a single inter-op
thread: many collectives in one step, created in a different order on every rank, an
allreduce of an allreduce, a step that fails after a collective started, join, and
Horovod's error types."""

from __future__ import annotations

import re

import pytest
from tfjobs import WORKERS, fastpsrun, tail

MODES = ["many", "chain", "subset", "join", "errors"]


@pytest.mark.parametrize("n", [2, 3])
def test_tf1_graphs_never_wait_on_an_executor_thread(n: int) -> None:
    # A deadlock would end only at the op timeout (60 s per op, 40 ops in "many").
    p = fastpsrun(n, [str(WORKERS / "tf1_graph_worker.py"), ",".join(MODES)], op_timeout=60)
    assert p.returncode == 0, tail(p)
    for mode in MODES:
        done = re.findall(rf"rank \d+ {mode} OK in (\S+) s", p.stdout)
        assert len(done) == n, (mode, tail(p))
        assert max(float(t) for t in done) < 50, (mode, tail(p))


@pytest.mark.parametrize("mode", ["tape", "keras2-partial"])
def test_tape_gradients_fetched_one_at_a_time(mode: str) -> None:
    """DistributedGradientTape in a TF1 session, each gradient fetched by its own
    Session.run: no fused bucket waits for gradients that run does not compute; and a
    Keras 2 model's PartialDistributedGradientTape (tf_keras local layers accepted)."""
    argv = [str(WORKERS / "tf1_tape_subset_worker.py")] + ([mode] if mode != "tape" else [])
    p = fastpsrun(2, argv, timeout=200, op_timeout=30)
    assert p.returncode == 0, tail(p)
    for r in range(2):
        assert f"rank {r} OK" in p.stdout, tail(p)
