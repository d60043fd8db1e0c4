"""Local SGD and DiLoCo in the MXNet plugin on 2 workers, run by
tests/mxnet/test_mx_local_sgd.py.

Each parameter's loss is sum(w * c) with c drawn from (rank, step), so its gradient is c
and the inner SGD step (lr 0.5) is known exactly: every worker replays every worker's local
steps in numpy float64 and checks its parameters against that reference after every step.

1. ``LocalSGD(H=3)``, 7 steps (outer steps after steps 3 and 6, then an explicit
   ``outer_step()`` for the seventh): the mean of the workers' parameters; a float64 weight
   over several parts (FASTPS_PARTITION_BYTES) and a float32 bias. Every rank starts from
   rank 0's values, whatever its own were.
2. ``DiLoCo(H=2)`` (outer lr 0.7, Nesterov momentum 0.9), 6 steps: three outer steps of
   torch.optim.SGD's rule on the mean delta, momentum carried on the servers.
3. The same two with ``overlap=True``: each round's answer applied one round late, keeping
   the steps taken meanwhile, checked against the same replay with that rule; a last
   ``outer_step()`` lands the round in flight (and syncs the steps since, if any).
4. A Gluon net whose shapes are inferred at the first forward pass: the algorithm is set up
   at the first step; the replicas agree after the outer step.
5. Refusals, each naming the culprit.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Dict, List, Tuple

import fastps.mxnet as hvd
import mxnet as mx
import numpy as np
from fastps.errors import FastPSError
from fastps.mxnet.algorithms import DiLoCo, LocalSGD
from mxnet import autograd, gluon

LR = 0.5
SHAPES = {"w": ((40, 30), "float64"), "b": ((30,), "float32")}


class Linear(gluon.Block):
    """Two parameters, loss sum(w * cw) + sum(b * cb): the gradients are cw and cb."""

    def __init__(self, rank: int, prefix: str) -> None:
        super().__init__(prefix=prefix)
        with self.name_scope():
            for key, (shape, dtype) in SHAPES.items():
                start = np.random.RandomState(50 + rank).randn(*shape)  # differs per rank
                setattr(
                    self,
                    key,
                    self.params.get(key, shape=shape, dtype=dtype, init=mx.init.Constant(start)),
                )

    def forward(self, cw: Any, cb: Any) -> Any:  # noqa: D102
        bias = (self.b.data() * cb).sum().astype("float64")
        return (self.w.data() * cw).sum() + bias


def coefficients(rank: int, step: int) -> Dict[str, np.ndarray]:
    rng = np.random.RandomState(1000 * (rank + 1) + step)
    return {key: rng.randn(*shape).astype(dtype) for key, (shape, dtype) in SHAPES.items()}


def local_step(net: Linear, trainer: Any, rank: int, step: int) -> None:
    c = coefficients(rank, step)
    with autograd.record():
        loss = net(mx.nd.array(c["w"], dtype="float64"), mx.nd.array(c["b"], dtype="float32"))
    loss.backward()
    trainer.step(1)  # rescale 1: the step is w - lr * c


class Reference:
    """Every worker's parameters, replayed in numpy (float64 for the float64 weight; the
    float32 bias steps in float32, as the worker does, and the servers average in
    float64, as they do)."""

    def __init__(self, size: int, lr: float, momentum: float, nesterov: bool) -> None:
        start = {
            key: np.random.RandomState(50).randn(*shape).astype(dtype)
            for key, (shape, dtype) in SHAPES.items()
        }  # rank 0's
        self.size = size
        self.workers = [{k: v.copy() for k, v in start.items()} for _ in range(size)]
        self.master = {k: v.astype(np.float64) for k, v in start.items()}
        # Each worker's anchor (the same on every worker without overlap).
        self.anchors = [{k: v.copy() for k, v in start.items()} for _ in range(size)]
        self.buf = {k: np.zeros_like(v) for k, v in self.master.items()}
        self.lr, self.momentum, self.nesterov = lr, momentum, nesterov
        self.answer: Any = None  # overlap: the round in flight's answer

    def local(self, step: int) -> None:
        for r, params in enumerate(self.workers):
            c = coefficients(r, step)
            for k in params:
                params[k] = (params[k] - params[k].dtype.type(LR) * c[k]).astype(params[k].dtype)

    def _rule(self) -> Dict[str, np.ndarray]:
        """The servers' outer step on the mean delta; returns the new parameters."""
        out = {}
        for k in self.master:
            deltas = [(w[k] - a[k]).astype(np.float64) for w, a in zip(self.workers, self.anchors)]
            g = -(sum(deltas) / self.size)
            self.buf[k] = self.momentum * self.buf[k] + g
            u = g + self.momentum * self.buf[k] if self.nesterov else self.buf[k]
            self.master[k] = self.master[k] - self.lr * u
            out[k] = self.master[k].astype(self.anchors[0][k].dtype)
        return out

    def outer(self) -> None:
        value = self._rule()
        for w, a in zip(self.workers, self.anchors):
            for k in value:
                w[k] = value[k].copy()
                a[k] = value[k].copy()

    def land(self) -> None:
        """Overlap: every worker moves onto the round in flight's answer, keeping its
        steps since the round began (its anchor then)."""
        for w, a in zip(self.workers, self.anchors):
            for k in w:
                w[k] = (w[k] - a[k]) + self.answer[k]
                a[k] = self.answer[k].copy()
        self.answer = None

    def overlapped(self) -> None:
        """Overlap: land the round in flight, then begin one; training goes on."""
        if self.answer is not None:
            self.land()
        self.answer = self._rule()
        for w, a in zip(self.workers, self.anchors):
            for k in w:
                a[k] = w[k].copy()

    def check(self, net: Linear, rank: int, what: str) -> None:
        for k, (_shape, dtype) in SHAPES.items():
            got = getattr(net, k).data().asnumpy()
            want = self.workers[rank][k]
            tol = 1e-12 if dtype == "float64" else 1e-6
            if not np.allclose(got, want, rtol=tol, atol=tol):
                err = float(np.abs(got - want).max())
                raise AssertionError(f"rank {rank}: {what}: '{k}' off the reference by {err}")


def run(rank: int, size: int, algo: LocalSGD, steps: int, tag: str) -> Tuple[int, int]:
    net = Linear(rank, prefix=f"{tag}_")
    net.initialize()
    trainer = hvd.DistributedTrainer(
        net.collect_params(), "sgd", {"learning_rate": LR}, algorithm=algo
    )
    assert trainer.algorithm is algo
    c = algo.config
    ref = Reference(size, c.lr, c.momentum, c.nesterov)
    ref.check(net, rank, f"{tag} start (rank 0's parameters)")
    for step in range(steps):
        local_step(net, trainer, rank, step)
        ref.local(step)
        if (step + 1) % algo.H == 0:
            ref.overlapped() if algo.overlap else ref.outer()
        ref.check(net, rank, f"{tag} step {step + 1}")
    if not algo.synced:
        algo.outer_step()
        if ref.answer is not None:
            ref.land()
        if steps % algo.H:
            ref.outer()
        ref.check(net, rank, f"{tag} last outer step")
    return algo.outer_steps, algo.local_steps


def deferred(rank: int) -> None:
    """A net whose shapes Gluon infers at the first forward pass."""
    mx.random.seed(rank)  # different starts: the setup makes rank 0's everyone's
    net = gluon.nn.Dense(4)
    net.initialize()
    algo = LocalSGD(H=2)
    trainer = hvd.DistributedTrainer(
        net.collect_params(), "adam", {"learning_rate": 0.01}, algorithm=algo
    )
    loss_fn = gluon.loss.L2Loss()
    for step in range(4):
        rng = np.random.RandomState(10 * rank + step)
        x, y = mx.nd.array(rng.randn(8, 5)), mx.nd.array(rng.randn(8, 4))
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(8)
    assert algo.outer_steps == 2 and algo.local_steps == 0, (algo.outer_steps, algo.local_steps)
    for p in net.collect_params().values():
        both = hvd.allgather(p.data().expand_dims(0), name=f"deferred.{p.name}").asnumpy()
        assert np.array_equal(both[0], both[1]), p.name


def refusals(rank: int) -> List[str]:
    out: List[str] = []
    net = Linear(rank, prefix="refused_")
    net.initialize()
    params = net.collect_params()
    try:
        hvd.DistributedTrainer(params, "sgd", algorithm=LocalSGD(H=2), asynchronous=True)
    except ValueError as exc:
        out.append(str(exc))
    try:
        hvd.DistributedTrainer(params, "sgd", algorithm=DiLoCo(H=2), op=hvd.Adasum)
    except FastPSError as exc:
        out.append(str(exc))
    try:
        hvd.DistributedTrainer(
            params, "sgd", algorithm=LocalSGD(H=2), compression=hvd.Compression.fp16
        )
    except ValueError as exc:
        out.append(str(exc))
    try:
        hvd.DistributedOptimizer(mx.optimizer.SGD(), algorithm=DiLoCo(H=4))
    except FastPSError as exc:
        out.append(str(exc))
    try:
        hvd.DistributedTrainer(params, "sgd", algorithm="diloco")
    except TypeError as exc:
        out.append(str(exc))
    return out


def main() -> int:
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    outer, local = run(rank, size, LocalSGD(H=3), 7, "local")
    assert (outer, local) == (3, 0), (outer, local)
    print(f"rank {rank} LOCALSGD OK", flush=True)
    outer, local = run(rank, size, DiLoCo(H=2), 6, "diloco")
    assert (outer, local) == (3, 0), (outer, local)
    print(f"rank {rank} DILOCO OK", flush=True)
    outer, local = run(rank, size, LocalSGD(H=3, overlap=True), 7, "overlap")
    assert (outer, local) == (3, 0), (outer, local)
    print(f"rank {rank} OVERLAP OK", flush=True)
    outer, local = run(rank, size, DiLoCo(H=2, overlap=True), 6, "overlapdiloco")
    assert (outer, local) == (3, 0), (outer, local)
    print(f"rank {rank} OVERLAPDILOCO OK", flush=True)
    deferred(rank)
    print(f"rank {rank} DEFERRED OK", flush=True)
    print(f"rank {rank} REFUSED " + json.dumps(refusals(rank)), flush=True)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
