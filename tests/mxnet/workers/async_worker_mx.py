"""Async mode through DistributedTrainer, run with FASTPS_MODE=async by
tests/mxnet/test_mx_async.py: the mode comes from the environment, and the parameters the
servers keep are exactly rank 0's initial value plus every worker's SGD deltas (float64,
small integers: exact). ``pull_parameters`` reads them on any worker;
``push_parameters`` replaces them with rank 0's."""

from __future__ import annotations

import sys

import fastps
import fastps.mxnet as hvd
import mxnet as mx
import numpy as np
from fastps.worker import api
from mxnet import autograd, gluon

STEPS = 4


class Weights(gluon.Block):
    def __init__(self, value: float) -> None:
        super().__init__()
        with self.name_scope():
            self.w = self.params.get(
                "w", shape=(2, 3), dtype="float64", init=mx.init.Constant(value)
            )

    def forward(self, c):  # noqa: ANN001 - an NDArray; d(sum(w * c))/dw = c
        return (self.w.data() * c).sum()


def main() -> int:
    hvd.init()
    rank, n = hvd.rank(), hvd.size()
    assert api.mode() == "async", api.mode()
    net = Weights(1.0 + 4 * rank)
    net.initialize()
    trainer = hvd.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 1.0})
    ramp = np.arange(6, dtype=np.float64).reshape(2, 3)
    c = mx.nd.array((rank + 1) * ramp, dtype="float64")
    for _ in range(STEPS):
        with autograd.record():
            loss = net(c)
        loss.backward()
        trainer.step(1)
    fastps.barrier()
    want = 1.0 - STEPS * sum(r + 1 for r in range(n)) * ramp
    net.w.set_data(mx.nd.zeros((2, 3), dtype="float64"))
    trainer.pull_parameters()
    got = net.w.data().asnumpy()
    if not np.array_equal(got, want):
        print(f"rank {rank}: pulled {got.tolist()}, want {want.tolist()}", flush=True)
        return 1
    fastps.barrier()
    net.w.set_data(mx.nd.full((2, 3), 7.0 + rank, dtype="float64"))
    trainer.push_parameters()
    if not np.array_equal(net.w.data().asnumpy(), np.full((2, 3), 7.0)):
        print(f"rank {rank}: after push_parameters {net.w.data().asnumpy()}", flush=True)
        return 1
    print(f"rank {rank} ASYNC OK", flush=True)
    fastps.barrier()
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
