"""An elastic Gluon training run the MXNet elastic test drives (GluonState, a worker
SIGKILLed mid-step and another inside a commit).

Least squares on a fixed stream of batches; every step's global batch (12 rows) is split
evenly over the current world, so the final parameters do not depend on which world ran
which step, only on every step being applied once to the committed state. Rank 0 prints
them with the parameters of the same steps run in one process by a plain gluon.Trainer.

Environment: STEPS (default 14), FAIL_AT (``slot@step@where``, comma-separated; where =
``backward``: after the backward pass, before the trainer's allreduce; ``commit``: after
saving, before the commit's collective).
"""

from __future__ import annotations

import json
import os
import signal
import time

import fastps.mxnet as hvd
import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

BATCH = 12
FEATURES = 6


def make_net() -> gluon.nn.Dense:
    mx.random.seed(0)
    net = gluon.nn.Dense(1, in_units=FEATURES, dtype="float64")
    net.initialize(mx.init.Normal(0.5))
    return net


def batch(step: int):
    rng = np.random.RandomState(1000 + step)
    x = rng.randn(BATCH, FEATURES)
    y = x @ (np.arange(1, FEATURES + 1) / FEATURES)[:, None] + 0.5 + 0.01 * rng.randn(BATCH, 1)
    return mx.nd.array(x, dtype="float64"), mx.nd.array(y, dtype="float64")


OPT = ("sgd", {"learning_rate": 0.05, "momentum": 0.9})


def train_step(net, trainer, x, y) -> None:
    with autograd.record():
        loss = ((net(x) - y) ** 2).sum()
    loss.backward()
    trainer.step(x.shape[0])


def reference(steps: int) -> list:
    net = make_net()
    trainer = gluon.Trainer(net.collect_params(), *OPT)
    for step in range(steps):
        train_step(net, trainer, *batch(step))
    return [p.data().asnumpy().ravel().tolist() for _, p in sorted(net.collect_params().items())]


def main() -> None:
    steps = int(os.environ.get("STEPS", "14"))
    me = os.environ.get("FASTPS_ELASTIC_ID", "")
    fail = {}
    for item in filter(None, os.environ.get("FAIL_AT", "").split(",")):
        slot, step, where = item.split("@")
        if slot == me:
            fail[int(step)] = where

    def die(where: str, step: int) -> None:
        print(f"KILL {me} step={step} where={where} t={time.time():.3f}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    hvd.init()
    net = make_net()
    trainer = hvd.DistributedTrainer(net.collect_params(), *OPT)
    state = hvd.elastic.GluonState(net, trainer, step=0)
    resets = []
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])

    @hvd.elastic.run
    def train(state) -> None:
        while state.step < steps:
            n, r = hvd.size(), hvd.rank()
            x, y = batch(state.step)
            rows = BATCH // n
            xs, ys = x[r * rows : (r + 1) * rows], y[r * rows : (r + 1) * rows]
            where = fail.pop(state.step, None)
            with autograd.record():
                loss = ((net(xs) - ys) ** 2).sum()
            loss.backward()
            if where == "backward":
                die(where, state.step)
            trainer.step(rows)
            state.step += 1
            if r == 0:
                print(f"STEP {state.step} size={n} t={time.time():.3f}", flush=True)
            if where == "commit":
                state.save()
                die(where, state.step)
            state.commit()

    train(state)
    if hvd.rank() == 0:
        got = [p.data().asnumpy().ravel().tolist() for _, p in sorted(net.collect_params().items())]
        print("RESULT " + json.dumps({"got": got, "want": reference(steps), "resets": resets}))
    print(f"DONE rank={hvd.rank()} size={hvd.size()}", flush=True)


if __name__ == "__main__":
    main()
