"""Worker: sufficient-factor broadcasting of Gluon Dense weights gives the dense path's
gradients (float64), run by tests/mxnet/test_mx_sfb.py.

Each case builds the same model twice, once with FASTPS_SFB=off and once with the mode
under test, trains both on this rank's share of the same batches and compares:

* ``exact``: integer-valued weights and data, ReLU and a sum loss, so every gradient is an
  exact integer sum in float64: the averaged gradients must be bit-for-bit equal. The net
  has a Dense with its own activation on a 3-D input it flattens, a Dense applied twice, a
  ``flatten=False`` Dense on a sequence input and a bias-free Dense only rank 0 runs.
* ``train``: random float64 data, SGD-momentum for 5 steps: parameters equal the dense
  run's within 1e-12 and a one-process run on the whole batch within 1e-9.
* ``auto``: the cost model sends the wide layer as factors and the narrow head (whose
  shape Gluon infers at the first forward) through the servers, on every rank alike; two
  steps equal the dense path.
* ``fallbacks``: a hybridized net, a shared weight, ``grad_req='add'``, compression and no
  ``model=`` keep the servers (with the reason printed); a bad FASTPS_SFB fails clearly.
* ``outside`` / ``late``: a loss term on a weight, and hybridizing after the choice, are
  errors naming the layer.
* ``set`` (3 processes): within a process set of ranks 0 and 1, SFB equals the set's dense
  path; rank 2, outside it, trains alone.

Prints ``SFB OK <case>`` per case.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any, Dict, List, Tuple

import fastps.mxnet as hvd
import mxnet as mx
import numpy as np
from fastps.errors import FastPSError
from mxnet import autograd, gluon, nd
from mxnet.gluon import nn

F64 = "float64"


class Net(gluon.Block):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        with self.name_scope():
            # Flattens its [batch, 2, 5] input; the capture is before its own ReLU.
            self.stem = nn.Dense(width, activation="relu", in_units=10, dtype=F64)
            self.twice = nn.Dense(width, in_units=width, dtype=F64)  # two calls per forward
            self.seq = nn.Dense(8, flatten=False, in_units=width, dtype=F64)  # [batch, 3, width]
            self.extra = nn.Dense(8, use_bias=False, in_units=8, dtype=F64)
            self.head = nn.Dense(3, in_units=8, dtype=F64)

    def forward(self, x: Any, use_extra: bool = True) -> Any:  # noqa: FBT001, FBT002
        h = self.stem(x)
        h = nd.relu(self.twice(nd.relu(self.twice(h))))
        s = self.seq(nd.stack(h, 2 * h, -h, axis=1)).sum(axis=1)
        if use_extra:
            s = s + self.extra(s)
        return self.head(nd.relu(s))


DENSE_WEIGHTS = ["extra", "head", "seq", "stem", "twice"]


def build(seed: int, integer: bool = False) -> Net:
    net = Net()
    net.initialize(mx.init.Xavier())
    rng = np.random.RandomState(seed)
    for p in net.collect_params().values():
        if integer:
            value = rng.randint(-3, 4, p.shape)
        else:
            value = rng.standard_normal(p.shape) * 0.3
        p.set_data(nd.array(value, dtype=F64))
    return net


def make_trainer(net: gluon.Block, how: str, **kwargs: Any) -> hvd.DistributedTrainer:
    os.environ["FASTPS_SFB"] = how
    try:
        return hvd.DistributedTrainer(
            net.collect_params(), "sgd", {"learning_rate": 0.05, "momentum": 0.9}, **kwargs
        )
    finally:
        del os.environ["FASTPS_SFB"]


def shard(data: np.ndarray) -> np.ndarray:
    per = data.shape[0] // hvd.size()
    return data[hvd.rank() * per : (hvd.rank() + 1) * per]


def check(cond: bool, what: str) -> None:
    if not cond:
        print(f"rank {hvd.rank()}: FAILED {what}", flush=True)
        sys.exit(1)


def chosen_layers(net: Net, trainer: hvd.DistributedTrainer) -> List[str]:
    names = set(trainer._fastps_sfb.chosen_names()) if trainer._fastps_sfb else set()
    return sorted(a for a in DENSE_WEIGHTS if getattr(net, a).weight.name in names)


def grads_of(net: gluon.Block) -> Dict[str, np.ndarray]:
    return {k: p.grad().asnumpy().copy() for k, p in net.collect_params().items()}


def params_of(net: gluon.Block) -> List[np.ndarray]:
    return [p.data().asnumpy().copy() for p in net.collect_params().values()]


def case_exact() -> None:
    """Integer-valued everything: both paths compute exact sums."""
    x = shard(np.random.RandomState(7).randint(-4, 5, (8, 2, 5)).astype(F64))
    grads: List[List[np.ndarray]] = []
    for how in ("off", "on"):
        net = build(1, integer=True)
        trainer = make_trainer(net, how, model=net)
        with autograd.record():
            loss = net(nd.array(x, dtype=F64), hvd.rank() == 0).sum()
        loss.backward()
        trainer.allreduce_grads()
        grads.append(list(grads_of(net).values()))
        if how == "on":
            got = chosen_layers(net, trainer)
            check(got == DENSE_WEIGHTS, f"every Dense weight sends factors under on, got {got}")
    names = list(Net().collect_params().keys())
    for name, a, b in zip(names, grads[0], grads[1]):
        check(np.array_equal(a, b), f"exact: gradient of {name} differs: {np.abs(a - b).max()}")
    check(any(np.abs(g).max() > 0 for g in grads[1]), "exact: the gradients are all zero")
    print(f"rank {hvd.rank()}: SFB OK exact", flush=True)


def batches(steps: int, size: int) -> List[Tuple[np.ndarray, np.ndarray]]:
    rng = np.random.RandomState(11)
    return [
        (rng.standard_normal((size, 2, 5)), rng.randint(0, 3, size).astype(F64))
        for _ in range(steps)
    ]


def train(
    net: gluon.Block, trainer: gluon.Trainer, data: List[Tuple[np.ndarray, np.ndarray]]
) -> None:
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for x, y in data:
        with autograd.record():
            loss = loss_fn(net(nd.array(x, dtype=F64)), nd.array(y, dtype=F64))
        loss.backward()
        trainer.step(x.shape[0])


def case_train() -> None:
    data = batches(5, 8 * hvd.size())
    mine = [(shard(x), shard(y)) for x, y in data]
    results = []
    for how in ("off", "on"):
        net = build(3)
        trainer = make_trainer(net, how, model=net)
        train(net, trainer, mine)
        if how == "on":
            check(chosen_layers(net, trainer) == DENSE_WEIGHTS, "train: all layers chosen")
            if os.environ.get("FASTPS_CROSS_BARRIER") == "1":
                # The 4 biases' waits went to the engine, 5 steps; the factor weights' did not.
                check(trainer._fastps_cb, "train: cross-barrier is on")
                check(trainer._fastps_deferred == 5 * 4, f"deferred {trainer._fastps_deferred}")
        results.append(params_of(net))
    dense, sfb = results
    for a, b in zip(dense, sfb):
        err = float(np.abs(a - b).max())
        check(err < 1e-12, f"train: a parameter differs from the dense path by {err}")
    # One process on the whole batch.
    net = build(3)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05, "momentum": 0.9})
    train(net, trainer, data)
    for a, b in zip(params_of(net), sfb):
        err = float(np.abs(a - b).max())
        check(err < 1e-9, f"train: a parameter differs from one process by {err}")
    moved = max(float(np.abs(a - b).max()) for a, b in zip(params_of(build(3)), sfb))
    check(moved > 1e-3, f"train: the parameters hardly moved ({moved})")
    print(f"rank {hvd.rank()}: SFB OK train", flush=True)


class Wide(gluon.Block):
    def __init__(self) -> None:
        super().__init__()
        with self.name_scope():
            self.wide = nn.Dense(256, activation="tanh", in_units=256, dtype=F64, prefix="wide_")
            self.thin = nn.Dense(2, dtype=F64, prefix="thin_")  # shape deferred to the forward

    def forward(self, x: Any) -> Any:
        return self.thin(self.wide(x))


def case_auto() -> None:
    """4 rows per worker: the 256x256 layer's factors (2·4·512 numbers) beat the servers
    (2·65536); the 2x256 head's (2·4·258) do not (2·512)."""
    rng = np.random.RandomState(5)
    data = [(rng.standard_normal((4 * hvd.size(), 256)), rng.randint(0, 2, 4 * hvd.size()))]
    data = [(x, y.astype(F64)) for x, y in data * 2]
    results = []
    for how in ("off", "auto"):
        mx.random.seed(2)
        net = Wide()
        net.initialize(mx.init.Xavier())
        hvd.broadcast_parameters(net.collect_params(), prefix=f"auto.{how}.")
        trainer = make_trainer(net, how, model=net)
        train(net, trainer, [(shard(x), shard(y)) for x, y in data])
        if how == "auto":
            got = set(trainer._fastps_sfb.chosen_names())
            check(got == {net.wide.weight.name}, f"auto: chose {got}")
        results.append(params_of(net))
    for a, b in zip(*results):
        err = float(np.abs(a - b).max())
        check(err < 1e-12, f"auto: a parameter differs from the dense path by {err}")
    print(f"rank {hvd.rank()}: SFB OK auto", flush=True)


def case_fallbacks() -> None:
    x = shard(np.random.RandomState(3).standard_normal((8, 2, 5)))
    y = shard(np.random.RandomState(4).randint(0, 3, 8).astype(F64))
    # A hybridized net: its Dense layers never call hybrid_forward on NDArrays.
    results = []
    for how in ("off", "on"):
        mx.random.seed(6)
        hyb = nn.HybridSequential()
        with hyb.name_scope():
            hyb.add(nn.Dense(6, activation="relu", in_units=10, dtype=F64))
            hyb.add(nn.Dense(3, in_units=6, dtype=F64))
        hyb.initialize(mx.init.Xavier())
        hyb.hybridize()
        hvd.broadcast_parameters(hyb.collect_params(), prefix=f"hyb.{how}.")
        trainer = make_trainer(hyb, how, model=hyb)
        train(hyb, trainer, [(x, y), (x, y)])
        if how == "on":
            check(trainer._fastps_sfb.chosen_names() == [], "hybridized: nothing chosen")
        results.append(params_of(hyb))
    for a, b in zip(*results):
        check(np.array_equal(a, b), "hybridized: differs from the dense path")

    # A shared weight and a weight that accumulates keep the servers.
    shared = nn.Sequential()
    with shared.name_scope():
        first = nn.Dense(10, in_units=10, dtype=F64)
        shared.add(first, nn.Dense(10, in_units=10, dtype=F64, params=first.params))
        shared.add(nn.Dense(3, in_units=10, dtype=F64))
    shared.initialize()
    shared[2].weight.grad_req = "add"
    trainer = make_trainer(shared, "on", model=shared)
    train(shared, trainer, [(x, y)])
    check(trainer._fastps_sfb.chosen_names() == [], "shared/add: nothing chosen")

    # Compression: every layer on the servers; no model=: a warning.
    net = build(2)
    trainer = make_trainer(net, "on", model=net, compression=hvd.Compression.fp16)
    train(net, trainer, [(x, y)])
    check(trainer._fastps_sfb.chosen_names() == [], "compression: nothing chosen")
    net = build(2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = make_trainer(net, "auto")
    check(trainer._fastps_sfb is None, "no model: no SFB")
    check(any("model=" in str(w.message) for w in caught), "no model: a warning")
    try:
        make_trainer(build(2), "sometimes", model=net)
    except ValueError as exc:
        check("FASTPS_SFB" in str(exc), f"bad mode: {exc}")
    else:
        check(False, "FASTPS_SFB=sometimes was accepted")
    print(f"rank {hvd.rank()}: SFB OK fallbacks", flush=True)


def case_outside() -> None:
    """An L2 term on stem's weight: its gradient is no longer the factors' product."""
    net = build(4)
    trainer = make_trainer(net, "on", model=net)
    x = shard(np.random.RandomState(8).standard_normal((8, 2, 5)))
    with autograd.record():
        loss = net(nd.array(x, dtype=F64)).sum() + (net.stem.weight.data() ** 2).sum()
    loss.backward()
    try:
        trainer.allreduce_grads()
    except FastPSError as exc:
        check(net.stem.weight.name in str(exc), f"outside: the error names the layer: {exc}")
    else:
        check(False, "outside: a loss term on an SFB weight was accepted")
    print(f"rank {hvd.rank()}: SFB OK outside", flush=True)


def case_late() -> None:
    """Hybridizing after the choice would bypass the capture: an error naming a layer."""
    net = build(5)
    trainer = make_trainer(net, "on", model=net)
    x = shard(np.random.RandomState(9).standard_normal((8, 2, 5)))
    y = shard(np.random.RandomState(9).randint(0, 3, 8).astype(F64))
    train(net, trainer, [(x, y)])
    net.hybridize()
    try:
        train(net, trainer, [(x, y)])
    except FastPSError as exc:
        check("hybridized" in str(exc) and "_weight" in str(exc), f"late: {exc}")
    else:
        check(False, "late: hybridizing after the choice was accepted")
    print(f"rank {hvd.rank()}: SFB OK late", flush=True)


def case_set() -> None:
    """3 processes, a process set of ranks 0 and 1 (rank 2 builds the same trainers and
    trains alone): SFB through the set's broadcast and allgather equals the set's dense
    path."""
    ps = hvd.add_process_set([0, 1])
    inside = hvd.rank() in (0, 1)
    data = batches(3, 16)
    mine = [(x[8 * (hvd.rank() % 2) :][:8], y[8 * (hvd.rank() % 2) :][:8]) for x, y in data]
    results = []
    for how in ("off", "on"):
        net = build(6)
        trainer = make_trainer(net, how, model=net, process_set=ps)
        train(net, trainer, mine)
        if how == "on" and inside:
            check(chosen_layers(net, trainer) == DENSE_WEIGHTS, "set: all layers chosen")
        results.append(params_of(net))
    for a, b in zip(*results):
        err = float(np.abs(a - b).max())
        check(err < 1e-12, f"set: a parameter differs from the set's dense path by {err}")
    moved = max(float(np.abs(a - b).max()) for a, b in zip(params_of(build(6)), results[1]))
    check(moved > 1e-3, f"set: the parameters hardly moved ({moved})")
    print(f"rank {hvd.rank()}: SFB OK set", flush=True)


def main() -> int:
    hvd.init()
    warnings.simplefilter("ignore")
    cases = sys.argv[1:] or ["exact", "train", "auto", "fallbacks", "outside", "late"]
    for case in cases:
        globals()[f"case_{case}"]()
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
