"""Local SGD and DiLoCo in the MXNet plugin (plugins/mxnet/algorithms/local_sgd.py,
docs/guide/local-sgd.md).

In this process: bad settings are refused naming the value, with the servers' own words;
the 'outer' server rule is registered and checked.

On 2 real workers and a server (one job, workers/local_sgd_worker_mx.py; 4 KiB parts, so
the float64 weight spans several): after every step, every worker's parameters equal a
numpy float64 replay of both workers' known local steps and of the outer steps (the mean
for ``LocalSGD(H=3)``, torch.optim.SGD's Nesterov rule with the momentum carried for
``DiLoCo(H=2)``), starting from rank 0's values, and the same with ``overlap=True``; a net
Gluon initializes at the first forward pass is set up at the first step; the trainer refuses
what it cannot run.
"""

from __future__ import annotations

import json
import re
from typing import Any, Dict, List

import pytest
from mxnet_jobs import WORKERS, fastpsrun, require_mxnet

require_mxnet()


def test_bad_settings_name_the_value() -> None:
    from algorithm_refusals import assert_local_sgd_refusals, assert_overlap_refusals
    from fastps.mxnet.algorithms import DiLoCo, LocalSGD

    assert_local_sgd_refusals(LocalSGD, DiLoCo)
    assert_overlap_refusals(LocalSGD, DiLoCo)


def test_server_rule_is_registered_and_checked() -> None:
    from fastps.mxnet.algorithms import DiLoCo, LocalSGD, ServerRule, check_server_rule

    rule = DiLoCo(H=8).server_rule()
    assert rule.kind == "outer"
    assert dict(rule.options) == {"lr": 0.7, "momentum": 0.9, "nesterov": True}
    assert dict(LocalSGD(H=2).server_rule().options) == {
        "lr": 1.0,
        "momentum": 0.0,
        "nesterov": False,
    }
    check_server_rule(rule, "DiLoCo")
    with pytest.raises(ValueError, match="outer momentum 2"):
        check_server_rule(ServerRule("outer", {"lr": 0.7, "momentum": 2.0, "nesterov": True}), "x")
    with pytest.raises(ValueError, match="server rule 'outer_adam' is not available"):
        check_server_rule(ServerRule("outer_adam"), "x")


_job: Dict[str, Any] = {}


def _out() -> str:
    """The one job every check below reads (started once)."""
    if not _job:
        env = {"FASTPS_SHM": "0", "FASTPS_PARTITION_BYTES": "4K"}
        res = fastpsrun(2, WORKERS / "local_sgd_worker_mx.py", env=env, timeout=240)
        assert res.returncode == 0, res.stdout[-6000:]
        _job["out"] = res.stdout
    return str(_job["out"])


@pytest.mark.parametrize("what", ["LOCALSGD", "DILOCO", "OVERLAP", "OVERLAPDILOCO", "DEFERRED"])
def test_outer_steps_equal_the_float64_reference(what: str) -> None:
    out = _out()
    assert len(re.findall(rf"rank \d {what} OK", out)) == 2, out[-6000:]


def test_refusals_name_the_culprit() -> None:
    out = _out()
    refused: List[List[str]] = [
        json.loads(line.split(" REFUSED ", 1)[1])
        for line in out.splitlines()
        if " REFUSED " in line
    ]
    assert len(refused) == 2, out[-6000:]
    for messages in refused:
        assert len(messages) == 5, messages
        asynchronous, adasum, twice, optimizer, not_one = messages
        assert "algorithm=LocalSGD(H=2, outer_lr=1.0" in asynchronous, asynchronous
        assert "cannot run asynchronously" in asynchronous, asynchronous
        assert "algorithm DiLoCo runs with op=Average only" in adasum, adasum
        assert "algorithm LocalSGD decides what it compresses" in twice, twice
        assert "algorithm DiLoCo needs hvd.DistributedTrainer" in optimizer, optimizer
        assert "algorithm must be a fastps.mxnet.algorithms.Algorithm, got str" in not_one
