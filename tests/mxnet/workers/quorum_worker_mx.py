"""Quorum rounds (FASTPS_ROUND_QUORUM, docs/guide/async.md) through DistributedTrainer's
gradient path (straight to the core): tests/workers/quorum_worker.py's steps, each the
gradient of ``sum(w * x)`` (exactly x) averaged by ``trainer.allreduce_grads()``, times
the number of workers (4: both scalings are exact). (``hvd.allreduce`` goes through the
negotiated collective layer, which waits for every rank before it starts: quorum rounds
are for gradients.) Arguments: steps slow at delay pace elems."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workers"))

import fastps  # noqa: E402
import fastps.mxnet as hvd  # noqa: E402
import mxnet as mx  # noqa: E402
from mxnet import autograd, gluon  # noqa: E402
from quorum_worker import run_steps  # noqa: E402


class Weights(gluon.Block):
    def __init__(self, elems: int) -> None:
        super().__init__()
        with self.name_scope():
            self.w = self.params.get("w", shape=(elems,), dtype="float64", init="zeros")

    def forward(self, x):  # noqa: ANN001 - d(sum(w * x))/dw = x
        return (self.w.data() * x).sum()


def main() -> None:
    hvd.init()
    rank = hvd.rank()

    n = hvd.size()
    elems = int(sys.argv[6])
    net = Weights(elems)
    net.initialize()
    trainer = hvd.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.0})

    def summed(x, _step):
        with autograd.record():
            loss = net(mx.nd.array(x, dtype="float64"))
        loss.backward()
        trainer.allreduce_grads()  # the average over the workers, in place
        return net.w.grad().asnumpy() * n

    run_steps(summed, rank, hvd.size(), sys.argv[1:])
    fastps.barrier()
    print(f"rank {rank} OK quorum", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
