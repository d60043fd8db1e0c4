"""N-worker training must equal one process training on the N batches concatenated.

Every worker also trains the single-process reference itself (same seed, the whole global
batch), then compares its distributed parameters with it. Run under fastpsrun:

    train_worker.py ENTRY   with ENTRY one of trainer, trainer_fp16, optimizer, kvstore,
                            kvstore_local, kvstore_str, module
Prints ``TRAIN OK <entry> <rank> <max abs diff>``.
"""

from __future__ import annotations

import sys
from typing import List

import fastps.mxnet as hvd
import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

STEPS = 12
BATCH = 8  # per worker
FEATURES, CLASSES, HIDDEN = 10, 4, 16
OPT = {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-4}


def make_net(seed: int) -> gluon.nn.HybridSequential:
    mx.random.seed(seed)
    net = gluon.nn.HybridSequential()
    with net.name_scope():
        net.add(gluon.nn.Dense(HIDDEN, activation="tanh", in_units=FEATURES))
        net.add(gluon.nn.Dense(HIDDEN, activation="relu", in_units=HIDDEN))
        net.add(gluon.nn.Dense(CLASSES, in_units=HIDDEN))
    net.initialize(mx.init.Xavier())
    return net


def values(net: gluon.Block) -> List[np.ndarray]:
    return [p.data().asnumpy() for p in net.collect_params().values()]


def gluon_train(
    net: gluon.Block, trainer: gluon.Trainer, xs: np.ndarray, ys: np.ndarray, step_size: int
) -> None:
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for x, y in zip(xs, ys):
        with autograd.record():
            loss = loss_fn(net(mx.nd.array(x)), mx.nd.array(y))
        loss.backward()
        trainer.step(step_size)


def module_params(xs: np.ndarray, ys: np.ndarray, kvstore, seed: int) -> List[np.ndarray]:  # type: ignore[no-untyped-def]
    data = mx.sym.var("data")
    h = mx.sym.FullyConnected(data, num_hidden=HIDDEN, name="fc1")
    h = mx.sym.Activation(h, act_type="tanh")
    h = mx.sym.FullyConnected(h, num_hidden=CLASSES, name="fc2")
    out = mx.sym.SoftmaxOutput(h, name="softmax")
    mod = mx.mod.Module(out, data_names=["data"], label_names=["softmax_label"])
    mod.bind(data_shapes=[("data", xs.shape[1:])], label_shapes=[("softmax_label", ys.shape[1:])])
    mx.random.seed(seed)
    mod.init_params(mx.init.Xavier())
    mod.init_optimizer(kvstore=kvstore, optimizer="sgd", optimizer_params=dict(OPT))
    for x, y in zip(xs, ys):
        mod.forward_backward(mx.io.DataBatch([mx.nd.array(x)], [mx.nd.array(y)]))
        mod.update()
    args, _ = mod.get_params()
    return [args[k].asnumpy() for k in sorted(args)]


def main() -> int:
    entry = sys.argv[1]
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    rng = np.random.RandomState(0)
    xs = rng.randn(STEPS, n * BATCH, FEATURES).astype(np.float32)
    ys = rng.randint(0, CLASSES, size=(STEPS, n * BATCH)).astype(np.float32)
    mine = slice(r * BATCH, (r + 1) * BATCH)  # this worker's share of each global batch

    if entry == "module":
        want = module_params(xs, ys, None, 42)
        got = module_params(xs[:, mine], ys[:, mine], mx.kv.create("fastps"), 42 + r)
    else:
        ref = make_net(42)
        gluon_train(
            ref,
            gluon.Trainer(ref.collect_params(), "sgd", dict(OPT), kvstore=None),
            xs,
            ys,
            n * BATCH,
        )
        want = values(ref)

        # DistributedTrainer/Optimizer runs start from different parameters on each rank:
        # broadcast_parameters must align them. A Gluon Trainer hands parameters to its
        # KVStore only in its first step(), after the first backward (MXNet's behaviour,
        # dist_sync's too), so KVStore runs start from one seed everywhere, as MXNet's
        # parameter-server scripts do.
        net = make_net(42 if entry.startswith("kvstore") else 42 + r)
        params = net.collect_params()
        if entry in ("trainer", "trainer_fp16"):
            hvd.broadcast_parameters(params, root_rank=0)
            comp = hvd.Compression.fp16 if entry == "trainer_fp16" else hvd.Compression.none
            trainer = hvd.DistributedTrainer(params, "sgd", dict(OPT), compression=comp)
            step = BATCH
        elif entry == "optimizer":
            hvd.broadcast_parameters(params, root_rank=0)
            opt = hvd.DistributedOptimizer(mx.optimizer.SGD(**OPT))
            trainer = gluon.Trainer(params, opt, kvstore=None)
            step = BATCH
        elif entry in ("kvstore", "kvstore_local", "kvstore_str"):
            kv = "dist_sync_fastps" if entry == "kvstore_str" else mx.kv.create("fastps")
            update_on_kvstore = False if entry == "kvstore_local" else None
            trainer = gluon.Trainer(
                params, "sgd", dict(OPT), kvstore=kv, update_on_kvstore=update_on_kvstore
            )
            step = BATCH * n  # the store sums over workers, as dist_sync does
        else:
            raise SystemExit(f"unknown entry {entry}")
        gluon_train(net, trainer, xs[:, mine], ys[:, mine], step)
        got = values(net)
        if entry.startswith("kvstore"):
            assert trainer._kvstore is not None and "fastps" in trainer._kvstore.type
            expect_on_kv = entry != "kvstore_local"
            assert trainer._update_on_kvstore == expect_on_kv, trainer._update_on_kvstore

    tol = 2e-2 if entry == "trainer_fp16" else 1e-4
    worst = 0.0
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape, (i, g.shape, w.shape)
        worst = max(worst, float(np.abs(g - w).max()))
        assert np.allclose(g, w, rtol=tol, atol=tol), (
            f"{entry}: parameter {i} differs from single-process training by {np.abs(g - w).max()}"
        )
    # and every worker holds the same parameters
    for i, g in enumerate(got):
        every = hvd.allgather(mx.nd.array(g[None]), name=f"same.{i}").asnumpy()
        assert all(np.allclose(every[0], every[q], atol=1e-6) for q in range(n)), i
    moved = (
        max(float(np.abs(a - b).max()) for a, b in zip(want, values(make_net(42))))
        if entry != "module"
        else 1.0
    )
    assert moved > 1e-3, "training did not change the parameters"
    print(f"TRAIN OK {entry} {r} {worst:.2e}", flush=True)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
