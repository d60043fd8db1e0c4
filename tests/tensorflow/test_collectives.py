"""The shared collectives harness (``tests/integration/collectives/worker.py``) through the
TensorFlow plugin, in the TensorFlow environment (tests/envs/tensorflow.sh): every
collective, mismatches, duplicate names, process sets and join, as real jobs of 1, 2 and 4
workers."""

from __future__ import annotations

import pytest
from tfjobs import ROOT, fastpsrun, tail

WORKER = ROOT / "tests" / "integration" / "collectives" / "worker.py"
CHECKS = ["mismatch OK", "duplicate OK", "out of order OK", "process sets OK", "join OK", "ALL OK"]


@pytest.mark.parametrize("np_", [1, 2, 4])
def test_every_collective_through_tensorflow(np_: int) -> None:
    res = fastpsrun(np_, [str(WORKER), "tensorflow"], timeout=400)
    assert res.returncode == 0, tail(res)
    lines = res.stdout.splitlines()
    for check in CHECKS:
        got = [line for line in lines if check in line]
        assert len(got) == np_, (check, tail(res, 4000))
    assert len([line for line in lines if "dtype " in line]) >= 7 * np_
