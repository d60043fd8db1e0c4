"""1-bit Adam in the MXNet plugin on 2 workers, run by tests/mxnet/test_mx_onebit_adam.py
(FASTPS_SHM=0: every push crosses a socket, so the core's byte counters see it).

1. ``DistributedTrainer`` with a ``OneBitAdam`` optimizer (float64 MLP, each rank its own
   data): the trainer runs ``OneBitAdamAlgorithm`` by itself; after every compressed
   update the exchanged m / D has one magnitude per part (the onebit codec's output) and
   both replicas hold the same parameters and momentum.
2. The same through ``gluon.Trainer(params, hvd.DistributedOptimizer(OneBitAdam(...)))``.
3. The digits MLP (tanh) trained with MXNet's ``"adam"`` and with ``"onebitadam"`` (same data,
   same start): bytes each worker sent after the warm-up, final training loss and test
   accuracy, printed as ``RESULT {json}`` by rank 0.
4. Refusals, each naming the culprit.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Dict, List

import fastps.mxnet as hvd
import mxnet as mx
import numpy as np
from fastps.errors import FastPSError
from fastps.mxnet.algorithms import LocalSGD, OneBitAdam, OneBitAdamAlgorithm
from fastps.worker import api
from mxnet import autograd, gluon

FREEZE = 100  # warm-up rounds (the paper: 15-25% of a run; shorter ones diverge)
ROUNDS = 200
BATCH = 32


def sent() -> int:
    return int(api.data_path_stats()["socket_bytes_sent"])


def small_net(dtype: str = "float64") -> gluon.nn.HybridSequential:
    mx.random.seed(5)  # the same start on every rank
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(6, activation="tanh", in_units=7, dtype=dtype))
    net.add(gluon.nn.Dense(3, in_units=6, dtype=dtype))
    net.initialize(mx.init.Normal(0.5))
    return net


def small_batch(rank: int, step: int) -> Any:
    rng = np.random.RandomState(100 * rank + step)
    x = mx.nd.array(rng.randn(16, 7), dtype="float64")
    y = mx.nd.array(rng.randint(0, 3, 16), dtype="float64")
    return x, y


def same_everywhere(arr: Any, name: str) -> bool:
    both = hvd.allgather(arr.expand_dims(0), name=name).asnumpy()
    return bool(np.array_equal(both[0], both[1]))


def check_replicas(rank: int, trainer: Any, opt: OneBitAdam, net: Any, what: str) -> None:
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    params = list(net.collect_params().values())
    for step in range(6):
        x, y = small_batch(rank, step)  # each rank its own data
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(16)
        for i, p in enumerate(params):
            state = trainer._updaters[0].states[i]
            if step >= 2:  # compressed: one magnitude per part (each tensor is one part)
                mags = np.unique(np.abs(opt._buffers[i].asnumpy()))
                assert len(mags) == 1, (what, p.name, step, mags)
            else:
                assert i not in opt._buffers, (what, p.name, step)
            for kind, arr in (("param", p.data()), ("momentum", state[0])):
                name = f"{what}.{kind}.{p.name}.{step}"
                assert same_everywhere(arr, name), (what, kind, p.name, step)


def digits() -> Any:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    y = d.target.astype(np.float32)
    return train_test_split(x, y, test_size=0.25, random_state=0)


def train_digits(rank: int, size: int, optimizer: str, data: Any) -> Dict[str, Any]:
    x_train, x_test, y_train, y_test = data
    xs, ys = x_train[rank::size], y_train[rank::size]
    mx.random.seed(1234)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(64, activation="tanh", in_units=64))
    net.add(gluon.nn.Dense(10, in_units=64))
    net.initialize(mx.init.Xavier())
    params = net.collect_params()
    hvd.broadcast_parameters(params, root_rank=0, prefix=f"{optimizer}.broadcast.")
    settings: Dict[str, Any] = {"learning_rate": 1e-3 * size}
    if optimizer == "onebitadam":
        settings["freeze_step"] = FREEZE
    trainer = hvd.DistributedTrainer(params, optimizer, settings, prefix=f"{optimizer}.")
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    steps = len(xs) // BATCH
    rng = np.random.RandomState(rank)
    rounds = 0
    at_freeze = 0
    losses: List[float] = []
    while rounds < ROUNDS:
        step = rounds % steps
        if step == 0:
            order = rng.permutation(len(xs))
        idx = order[step * BATCH : (step + 1) * BATCH]
        with autograd.record():
            loss = loss_fn(net(mx.nd.array(xs[idx])), mx.nd.array(ys[idx]))
        loss.backward()
        trainer.step(BATCH)
        rounds += 1
        if rounds == FREEZE:
            at_freeze = sent()
        losses.append(float(loss.mean().asscalar()))
    after = sent() - at_freeze
    full = loss_fn(net(mx.nd.array(xs)), mx.nd.array(ys)).mean().asscalar()
    pred = net(mx.nd.array(x_test)).argmax(axis=1).asnumpy()
    acc = float((pred == y_test).mean())
    flat = np.concatenate([p.data().asnumpy().ravel() for p in params.values()])
    assert same_everywhere(mx.nd.array(flat), f"{optimizer}.replicas"), optimizer
    return {
        "rounds": rounds,
        "bytes_sent_after_freeze": after,
        "train_loss": float(full),
        "last_epoch_loss": float(np.mean(losses[-steps:])),
        "accuracy": acc,
    }


def refusals() -> List[str]:
    out: List[str] = []
    net = small_net()
    try:  # the algorithm of another optimizer
        hvd.DistributedTrainer(
            net.collect_params(), "adam", algorithm=OneBitAdamAlgorithm(), prefix="r1."
        )
    except TypeError as exc:
        out.append(str(exc))
    half = gluon.nn.Dense(2, in_units=3, dtype="float16")
    half.initialize()
    try:  # a dtype the exchange cannot carry
        hvd.DistributedTrainer(half.collect_params(), "onebitadam", prefix="r2.")
    except FastPSError as exc:
        out.append(str(exc))
    try:  # two compressors
        hvd.DistributedTrainer(
            net.collect_params(),
            "onebitadam",
            compression=hvd.Compression.fp16,
            prefix="r3.",
        )
    except ValueError as exc:
        out.append(str(exc))
    try:
        hvd.DistributedTrainer(net.collect_params(), "onebitadam", op=hvd.Adasum, prefix="r4.")
    except FastPSError as exc:
        out.append(str(exc))
    try:
        hvd.DistributedOptimizer(OneBitAdam(), algorithm=LocalSGD(H=2))
    except FastPSError as exc:
        out.append(str(exc))
    return out


def main() -> int:
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    assert size == 2, size

    net = small_net()
    opt = OneBitAdam(learning_rate=0.01, freeze_step=2)
    trainer = hvd.DistributedTrainer(net.collect_params(), opt, prefix="replicas.")
    assert isinstance(trainer.algorithm, OneBitAdamAlgorithm), trainer.algorithm
    check_replicas(rank, trainer, opt, net, "trainer")
    print(f"rank {rank} ONEBIT OK trainer", flush=True)

    net = small_net()
    opt = OneBitAdam(lr=0.01, freeze_step=2)  # torch's names work too
    wrapped = hvd.DistributedOptimizer(opt, prefix="wrapped.")
    check_replicas(
        rank, gluon.Trainer(net.collect_params(), wrapped, kvstore=None), opt, net, "opt"
    )
    print(f"rank {rank} ONEBIT OK optimizer", flush=True)

    data = digits()
    result = {name: train_digits(rank, size, name, data) for name in ("adam", "onebitadam")}
    if rank == 0:
        print("RESULT " + json.dumps(result), flush=True)

    out = refusals()
    print(f"rank {rank} REFUSED " + json.dumps(out), flush=True)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
