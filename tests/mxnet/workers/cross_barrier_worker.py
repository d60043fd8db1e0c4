"""DistributedTrainer(cross_barrier=True) must equal the synchronous trainer bit for bit.

Usage: cross_barrier_worker.py [steps]

Each case trains the same float64 Gluon network twice on every worker — once with
``cross_barrier=True`` (the engine waits for each sum; ``step()`` returns at once) and once
with ``cross_barrier=False`` — on the same batches, and checks that weights and optimizer
states are identical. Rank 1 sleeps before some steps, so rank 0's sums are not in when its
``step()`` returns: the check below sees the engine still owing rank 0 the update (the
weights cannot be read without waiting) while Python has moved on. Cases: SGD with
momentum and weight decay, Adam with an lr scheduler, SGD with global-norm gradient clipping
(``allreduce_grads`` + clip + ``update``) and fp16 compression of the wire.
"""

from __future__ import annotations

import sys
import time

import fastps.mxnet as hvd
import mxnet as mx
import numpy as np
from fastps.mxnet import engine_wait

B, FEATURES, HIDDEN, CLASSES = 8, 12, 32, 3
LATE_S = 0.4


def make_net() -> mx.gluon.nn.HybridSequential:
    net = mx.gluon.nn.HybridSequential()
    with net.name_scope():
        net.add(mx.gluon.nn.Dense(HIDDEN, activation="tanh", in_units=FEATURES))
        net.add(mx.gluon.nn.Dense(HIDDEN, activation="relu", in_units=HIDDEN))
        net.add(mx.gluon.nn.Dense(CLASSES, in_units=HIDDEN))
    net.cast("float64")
    net.initialize(mx.init.Normal(0.4))
    rng = np.random.RandomState(3)
    for p in net.collect_params().values():
        p.set_data(mx.nd.array(rng.normal(0, 0.4, p.shape), dtype="float64"))
    return net


def batches(steps: int) -> list:
    rng = np.random.RandomState(11 + hvd.rank())
    return [
        (
            mx.nd.array(rng.normal(size=(B, FEATURES)), dtype="float64"),
            mx.nd.array(rng.randint(0, CLASSES, size=B), dtype="float64"),
        )
        for _ in range(steps)
    ]


def trainer_for(case: str, net: mx.gluon.Block, cross: bool, prefix: str) -> mx.gluon.Trainer:
    params = net.collect_params()
    kw: dict = {"prefix": prefix, "cross_barrier": cross}
    if case == "sgd":
        return hvd.DistributedTrainer(
            params, "sgd", {"learning_rate": 0.05, "momentum": 0.9, "wd": 0.01}, **kw
        )
    if case == "adam-scheduler":
        sched = mx.lr_scheduler.FactorScheduler(step=2, factor=0.7, base_lr=0.01)
        return hvd.DistributedTrainer(
            params, "adam", {"learning_rate": 0.01, "lr_scheduler": sched}, **kw
        )
    if case == "clip-fp16":
        return hvd.DistributedTrainer(
            params, "sgd", {"learning_rate": 0.1}, compression=hvd.Compression.fp16, **kw
        )
    raise SystemExit(f"unknown case {case}")


def train(case: str, cross: bool, steps: int) -> tuple:
    net = make_net()
    net.hybridize()
    trainer = trainer_for(case, net, cross, f"cb.{case}.{int(cross)}.")
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    owed = 0
    for s, (x, y) in enumerate(batches(steps)):
        if hvd.rank() == 1 and s % 2 == 1:
            time.sleep(LATE_S)
        with mx.autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        if case == "clip-fp16":
            trainer.allreduce_grads()
            grads = [p.grad() for p in net.collect_params().values()]
            # Global-norm clipping as engine operations on the reduced gradients
            # (gluon's clip_global_norm mixes float32 into float64 arrays in MXNet 1.9).
            norm = mx.nd.sqrt(mx.nd.add_n(*[(g * g).sum() for g in grads]))
            scale = 0.5 / mx.nd.maximum(norm, 0.5)
            for g in grads:
                g[:] = mx.nd.broadcast_mul(g, scale)
            trainer.update(B)
        else:
            trainer.step(B)
        if cross and hvd.rank() == 0 and s % 2 == 1:
            # Rank 1 has not pushed yet: the engine still owes this step's waits.
            owed += engine_wait.pending()
    trainer.wait_for_updates()
    weights = [p.data().asnumpy() for p in net.collect_params().values()]
    states = trainer._updaters[0].get_states(dump_optimizer=False)
    return weights, states, owed, trainer._fastps_deferred


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    hvd.init()
    for case in ("sgd", "adam-scheduler", "clip-fp16"):
        w_cb, st_cb, owed, deferred = train(case, True, steps)
        w_ref, st_ref, _, none = train(case, False, steps)
        assert none == 0 and deferred > 0, (case, deferred, none)
        for a, b in zip(w_cb, w_ref):
            assert a.dtype == np.float64 and np.array_equal(a, b), (case, np.max(np.abs(a - b)))
        assert st_cb == st_ref, f"{case}: optimizer states differ"
        if hvd.rank() == 0:
            assert owed > 0, f"{case}: step() never returned before the sums were in"
        print(f"[worker {hvd.rank()}] CB EQUAL {case} owed={owed} deferred={deferred}", flush=True)
    print(f"[worker {hvd.rank()}] CB OK", flush=True)


if __name__ == "__main__":
    main()
