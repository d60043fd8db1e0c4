"""The shared collectives harness (``tests/integration/collectives/worker.py``) through the MXNet
plugin: every collective, mismatches, duplicate names, process sets and join, as real jobs
of 1, 2 and 4 workers. (It lives here because only the MXNet environment has MXNet.)"""

from __future__ import annotations

import pytest
from mxnet_jobs import ROOT, fastpsrun, require_mxnet

require_mxnet()

WORKER = ROOT / "tests" / "integration" / "collectives" / "worker.py"
CHECKS = ["mismatch OK", "duplicate OK", "out of order OK", "process sets OK", "join OK", "ALL OK"]


@pytest.mark.parametrize("np_", [1, 2, 4])
def test_every_collective_through_mxnet(np_: int) -> None:
    res = fastpsrun(np_, WORKER, "mxnet", timeout=400)
    assert res.returncode == 0, res.stdout[-6000:]
    lines = res.stdout.splitlines()
    for check in CHECKS:
        got = [line for line in lines if check in line]
        assert len(got) == np_, (check, res.stdout[-4000:])
    assert len([line for line in lines if "dtype " in line]) >= 7 * np_
