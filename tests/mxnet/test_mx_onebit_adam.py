"""1-bit Adam in the MXNet plugin (plugins/mxnet/algorithms/onebit_adam.py,
docs/guide/algorithms.md).

In this process: bad settings are refused naming the value (MXNet's names and torch's);
the warm-up is Adam with torch's formula, against a numpy float64 reference; after it the
variance stays frozen and the step follows the algorithm's formula on the local momentum
(one process: nothing to exchange).

On 2 real workers (one job, workers/onebit_adam_worker_mx.py, FASTPS_SHM=0 so every push
crosses a socket): through ``DistributedTrainer`` and through ``DistributedOptimizer`` the
exchanged momentum is the onebit codec's output and every replica holds the same momentum
and parameters after every compressed update; on the digits MLP 1-bit Adam sends at least
4x fewer bytes than MXNet's Adam after the warm-up and ends within 3 points of its test
accuracy; the trainer and the optimizer refuse what they cannot run, naming it.
"""

from __future__ import annotations

import json
import re
from typing import Any, Dict, List

import pytest
from mxnet_jobs import WORKERS, fastpsrun, require_mxnet

require_mxnet()

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402
from mxnet import autograd, gluon  # noqa: E402


def _net() -> gluon.nn.HybridSequential:
    mx.random.seed(5)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(6, activation="tanh", in_units=7, dtype="float64"))
    net.add(gluon.nn.Dense(3, in_units=6, dtype="float64"))
    net.initialize(mx.init.Normal(0.5))
    return net


def _step(net: Any, trainer: Any, step: int) -> Dict[str, np.ndarray]:
    """One update on a batch of 16 drawn from ``step``; returns the raw gradients."""
    rng = np.random.RandomState(step)
    x = mx.nd.array(rng.randn(16, 7), dtype="float64")
    y = mx.nd.array(rng.randint(0, 3, 16), dtype="float64")
    with autograd.record():
        loss = gluon.loss.SoftmaxCrossEntropyLoss()(net(x), y)
    loss.backward()
    grads = {p.name: p.grad().asnumpy().copy() for p in net.collect_params().values()}
    trainer.step(16)
    return grads


# ---------------------------------------------------------------- in this process


@pytest.mark.parametrize(
    "kwargs, exc, needle",
    [
        ({"freeze_step": -1}, ValueError, "freeze_step (the warm-up) must be >= 1, got -1"),
        ({"freeze_step": 0}, ValueError, "freeze_step (the warm-up) must be >= 1, got 0"),
        ({"freeze_step": 2.5}, TypeError, "freeze_step must be an int, got 2.5"),
        ({"beta1": 1.0}, ValueError, "beta1 must be in [0, 1), got 1.0"),
        ({"betas": (1.0, 0.999)}, ValueError, "betas[0] must be in [0, 1), got 1.0"),
        ({"betas": (0.9, -0.1)}, ValueError, "betas[1] must be in [0, 1), got -0.1"),
        ({"epsilon": 0.0}, ValueError, "epsilon must be > 0, got 0.0"),
        ({"eps": 0.0}, ValueError, "eps must be > 0, got 0.0"),
        ({"learning_rate": float("nan")}, ValueError, "learning_rate must be finite, got nan"),
        ({"lr": float("nan")}, ValueError, "lr must be finite, got nan"),
        ({"lr": -1.0}, ValueError, "lr must be >= 0, got -1.0"),
        ({"wd": -0.1}, ValueError, "wd must be >= 0, got -0.1"),
        ({"weight_decay": -0.1}, ValueError, "weight_decay must be >= 0, got -0.1"),
        ({"lr": 0.1, "learning_rate": 0.1}, TypeError, "give learning_rate or lr, not both"),
        ({"compression": "onebit"}, ValueError, "compression must be one of the core's"),
    ],
)
def test_bad_settings_refused(kwargs: Dict[str, Any], exc: type, needle: str) -> None:
    from fastps.mxnet.algorithms import OneBitAdam

    with pytest.raises(exc) as info:
        OneBitAdam(**kwargs)
    assert needle in str(info.value)


def test_registered_and_float16_refused_by_name() -> None:
    from fastps.errors import FastPSError
    from fastps.mxnet.algorithms import OneBitAdam, OneBitAdamAlgorithm

    opt = mx.optimizer.create("onebitadam", learning_rate=0.01, freeze_step=3)
    assert isinstance(opt, OneBitAdam) and opt.freeze_step == 3 and opt.lr == 0.01
    assert isinstance(opt.fastps_algorithm(), OneBitAdamAlgorithm)
    assert opt.compression.spec == "onebit:ef"
    named = OneBitAdam(param_idx2name={0: "head_weight"})
    with pytest.raises(FastPSError) as info:
        named.create_state_multi_precision(0, mx.nd.zeros((2, 3), dtype="float16"))
    assert "parameter 'head_weight' (float16[2, 3]) has dtype float16; supported: float32, " in str(
        info.value
    )


def test_warmup_and_frozen_variance_against_numpy() -> None:
    """Warm-up: torch's Adam (ε outside the bias-corrected √v), in float64; then v frozen
    and x ← x − lr/(1−β₁ᵗ)·m/D with the local momentum (no exchange in one process)."""
    from fastps.mxnet.algorithms import OneBitAdam

    freeze, lr, b1, b2, eps, wd = 5, 0.01, 0.9, 0.999, 1e-8, 0.01
    net = _net()
    opt = OneBitAdam(learning_rate=lr, freeze_step=freeze, wd=wd)
    trainer = gluon.Trainer(net.collect_params(), opt, kvstore=None)
    params = trainer._params  # in the trainer's order: the optimizer's indices
    x = {p.name: p.data().asnumpy().copy() for p in params}
    m = {k: np.zeros_like(v) for k, v in x.items()}
    v = {k: np.zeros_like(a) for k, a in x.items()}
    for t in range(1, freeze + 7):
        grads = _step(net, trainer, t)
        for k in x:
            g = grads[k] / 16 + wd * x[k]  # rescale_grad = 1 / batch size, then L2
            m[k] = m[k] + (1 - b1) * (g - m[k])
            if t <= freeze:
                v[k] = v[k] * b2 + (1 - b2) * g * g
                denom = np.sqrt(v[k]) / np.sqrt(1 - b2**t) + eps
            else:
                denom = np.sqrt(v[k]) / np.sqrt(1 - b2**freeze) + eps
            x[k] = x[k] - lr / (1 - b1**t) * (m[k] / denom)
        for i, p in enumerate(params):
            state = trainer._updaters[0].states[i]
            np.testing.assert_allclose(p.data().asnumpy(), x[p.name], rtol=1e-12, atol=1e-15)
            np.testing.assert_allclose(state[0].asnumpy(), m[p.name], rtol=1e-12, atol=1e-15)
            assert np.array_equal(state[1].asnumpy(), v[p.name]), (t, p.name)


# ---------------------------------------------------------------- on real workers

_job: Dict[str, Any] = {}


def _run() -> Dict[str, Any]:
    """The one job every check below reads (started once)."""
    if not _job:
        res = fastpsrun(
            2, WORKERS / "onebit_adam_worker_mx.py", env={"FASTPS_SHM": "0"}, timeout=240
        )
        assert res.returncode == 0, res.stdout[-6000:]
        _job["out"] = res.stdout
        found = re.search(r"RESULT (\{.*\})", res.stdout)
        assert found, res.stdout[-6000:]
        _job["result"] = json.loads(found.group(1))
        _job["refused"] = [
            json.loads(line.split(" REFUSED ", 1)[1])
            for line in res.stdout.splitlines()
            if " REFUSED " in line
        ]
    return _job


def test_replicas_agree_through_trainer_and_optimizer() -> None:
    out = _run()["out"]
    for what in ("trainer", "optimizer"):
        assert len(re.findall(rf"rank \d ONEBIT OK {what}", out)) == 2, (what, out[-6000:])


def test_fewer_bytes_after_warmup_at_comparable_accuracy() -> None:
    result = _run()["result"]
    adam, onebit = result["adam"], result["onebitadam"]
    print(f"digits, 2 workers: adam {adam}\nonebitadam {onebit}")
    assert adam["rounds"] == onebit["rounds"] == 200
    ratio = adam["bytes_sent_after_freeze"] / onebit["bytes_sent_after_freeze"]
    assert ratio >= 4.0, (ratio, adam, onebit)
    assert onebit["accuracy"] >= adam["accuracy"] - 0.03, (adam, onebit)
    assert onebit["train_loss"] <= adam["train_loss"] + 0.1, (adam, onebit)


def test_refusals_name_the_culprit() -> None:
    refused: List[List[str]] = _run()["refused"]
    assert len(refused) == 2, refused
    for messages in refused:
        assert len(messages) == 5, messages
        wrong_opt, half, twice, adasum, local = messages
        assert (
            "OneBitAdamAlgorithm needs a fastps.mxnet.algorithms.OneBitAdam optimizer, got Adam"
            in wrong_opt
        )
        assert re.search(r"OneBitAdam: parameter '\w+' has dtype float16", half), half
        assert "algorithm OneBitAdamAlgorithm decides what it compresses" in twice, twice
        assert "algorithm OneBitAdamAlgorithm runs with op=Average only" in adasum, adasum
        assert "algorithm LocalSGD needs hvd.DistributedTrainer" in local, local
