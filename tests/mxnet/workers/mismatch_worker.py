"""Rank 1 disagrees with rank 0; every worker must fail with a clear error, not hang.

    mismatch_worker.py CASE   with CASE one of
      broadcast_shape   broadcast_parameters, one layer wider on rank 1
      broadcast_extra   broadcast_parameters, one more layer on rank 1
      trainer_shape     DistributedTrainer gradients of different shapes (no broadcast)
      trainer_extra     DistributedTrainer, one more layer on rank 1 (no broadcast)
      kvstore_shape     gluon.Trainer with kvstore=mx.kv.create('fastps'), wider on rank 1
      kvstore_extra     the same, one more layer on rank 1
      dtype             allreduce of one name as float32 on rank 0, float64 on rank 1

Prints ``CAUGHT <type>: <message>`` and exits 3 when fastps raised, 0 when nothing failed.
"""

from __future__ import annotations

import sys

import fastps.mxnet as hvd
import mxnet as mx
import numpy as np
from mxnet import autograd, gluon


def make_net(rank: int, wider: bool, extra: bool) -> gluon.nn.HybridSequential:
    net = gluon.nn.HybridSequential()
    hidden = 9 if (wider and rank == 1) else 8
    with net.name_scope():
        net.add(gluon.nn.Dense(hidden, activation="relu", in_units=5))
        if extra and rank == 1:
            net.add(gluon.nn.Dense(hidden, activation="relu", in_units=hidden))
        net.add(gluon.nn.Dense(3, in_units=hidden))
    net.initialize()
    return net


def train(net: gluon.Block, trainer: gluon.Trainer) -> None:
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for _ in range(3):
        with autograd.record():
            loss = loss_fn(net(mx.nd.ones((4, 5))), mx.nd.zeros((4,)))
        loss.backward()
        trainer.step(4)
    mx.nd.waitall()


def main() -> int:
    case = sys.argv[1]
    hvd.init()
    r = hvd.rank()
    try:
        if case.startswith("broadcast"):
            net = make_net(r, wider=case.endswith("shape"), extra=case.endswith("extra"))
            hvd.broadcast_parameters(net.collect_params(), root_rank=0)
        elif case.startswith("trainer"):
            net = make_net(r, wider=case.endswith("shape"), extra=case.endswith("extra"))
            train(net, hvd.DistributedTrainer(net.collect_params(), "sgd"))
        elif case.startswith("kvstore"):
            net = make_net(r, wider=case.endswith("shape"), extra=case.endswith("extra"))
            train(net, gluon.Trainer(net.collect_params(), "sgd", kvstore=mx.kv.create("fastps")))
        elif case == "dtype":
            hvd.allreduce(mx.nd.ones((4,), dtype=np.float32 if r == 0 else np.float64), name="x")
        else:
            raise SystemExit(f"unknown case {case}")
    except hvd.FastPSError as exc:
        print(f"CAUGHT {type(exc).__name__}: {exc}", flush=True)
        return 3
    print("NO ERROR", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
