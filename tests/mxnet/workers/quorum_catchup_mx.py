"""Worker: quorum rounds with a Gluon worker that is slower for good (docs/guide/async.md,
"Catch-up"), through ``fastps.mxnet.DistributedTrainer``.

Every rank trains a small Gluon model (one 256x256 weight that travels alone, the small
tensors fused) and the float64 ledger of tests/workers/catchup_ledger.py with SGD with
momentum, on data of its own; rank ``slow`` spends ``slow_s`` per step, the others
``fast_s``. The loop counts the rounds applied (``trainer.applied_rounds``), not its own
steps: the slow rank catches up on the rounds that closed without it, several per step.
Prints one ``CATCHUP`` line.

Usage: quorum_catchup_mx.py ROUNDS SLOW_RANK FAST_S SLOW_S
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workers"))

import fastps.mxnet as hvd  # noqa: E402
import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402
from catchup_ledger import LR, MOMENTUM, digest, ledger_gradient, report  # noqa: E402
from mxnet import autograd, gluon  # noqa: E402


class Model(gluon.Block):
    def __init__(self, rounds: int) -> None:
        super().__init__()
        with self.name_scope():
            self.net = gluon.nn.Sequential()
            self.net.add(gluon.nn.Dense(256, in_units=32, activation="tanh"))
            self.net.add(gluon.nn.Dense(256, in_units=256, activation="tanh"))
            self.net.add(gluon.nn.Dense(4, in_units=256))
            self.ledger = self.params.get("ledger", shape=(rounds,), dtype="float64", init="zeros")

    def forward(self, x, hot):  # noqa: ANN001
        return self.net(x), (self.ledger.data() * hot).sum()


def main() -> None:
    rounds, slow = int(sys.argv[1]), int(sys.argv[2])
    fast_s, slow_s = float(sys.argv[3]), float(sys.argv[4])
    hvd.init()
    rank = hvd.rank()
    mx.random.seed(1234)  # the same initial model everywhere
    model = Model(rounds)
    model.initialize(mx.init.Xavier())
    params = model.collect_params()
    trainer = hvd.DistributedTrainer(params, "sgd", {"learning_rate": LR, "momentum": MOMENTUM})
    data = np.random.RandomState(100 + rank)
    pause = slow_s if rank == slow else fast_s
    took = []
    while trainer.applied_rounds < rounds:
        start = time.perf_counter()
        x = mx.nd.array(data.normal(size=(16, 32)), dtype="float32")
        y = mx.nd.array(data.normal(size=(16, 4)), dtype="float32")
        # this step's push is of the round after those applied so far
        hot = mx.nd.array(ledger_gradient(rank, trainer.applied_rounds, rounds), dtype="float64")
        with autograd.record():
            out, ledger_loss = model(x, hot)
            fit = 0.01 * ((out - y) ** 2).mean()
        autograd.backward([fit, ledger_loss])
        time.sleep(pause)  # this worker's compute
        trainer.step(1)
        took.append(time.perf_counter() - start)
    states = trainer._updaters[0].states
    arrays = [p.data().asnumpy() for _, p in sorted(params.items())]
    arrays += [states[k].asnumpy() for k in sorted(states) if states[k] is not None]
    ledger = model.ledger.data().asnumpy()
    print(report(rank, trainer.applied_rounds, took, ledger, digest(arrays)), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
