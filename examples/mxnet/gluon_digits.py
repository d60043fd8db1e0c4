"""Data-parallel Gluon training with fastps.mxnet.DistributedTrainer.

Trains a small MLP on scikit-learn's 8x8 digits; every worker trains on its own shard
of the training set and the gradients are averaged over all workers each step.

    fastpsrun -np 2 python examples/mxnet/gluon_digits.py

``--async`` (or FASTPS_MODE=async) trains asynchronously (docs/guide/async.md): the servers keep
the parameters, each worker applies its own steps and exchanges the deltas.

Prints the test accuracy (rank 0) and exits with status 1 if it is below --min-accuracy.
"""

from __future__ import annotations

import argparse
import sys
import time

import fastps.mxnet as hvd
import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split


def build_net(hidden: int, layers: int) -> gluon.nn.HybridSequential:
    net = gluon.nn.HybridSequential()
    with net.name_scope():
        in_units = 64
        for _ in range(layers):
            net.add(gluon.nn.Dense(hidden, activation="relu", in_units=in_units))
            in_units = hidden
        net.add(gluon.nn.Dense(10, in_units=in_units))
    return net


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--fp16", action="store_true", help="send gradients as float16")
    parser.add_argument("--min-accuracy", type=float, default=0.95)
    parser.add_argument("--async", dest="asynchronous", action="store_true")
    args = parser.parse_args()

    hvd.init()
    rank, size = hvd.rank(), hvd.size()

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0)
    x_train, y_train = x_train[rank::size], y_train[rank::size]  # this worker's shard

    mx.random.seed(1234 + rank)  # different on purpose: broadcast_parameters aligns them
    net = build_net(args.hidden, args.layers)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    params = net.collect_params()
    hvd.broadcast_parameters(params, root_rank=0)

    compression = hvd.Compression.fp16 if args.fp16 else hvd.Compression.none
    trainer = hvd.DistributedTrainer(
        params,
        "sgd",
        {"learning_rate": args.lr, "momentum": 0.9},
        compression=compression,
        asynchronous=args.asynchronous or None,  # None: FASTPS_MODE decides
    )
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    bs = args.batch_size
    steps = len(x_train) // bs
    rng = np.random.RandomState(rank)
    samples = 0
    start = time.perf_counter()
    for epoch in range(args.epochs):
        order = rng.permutation(len(x_train))
        total = 0.0
        for step in range(steps):
            idx = order[step * bs : (step + 1) * bs]
            data, label = mx.nd.array(x_train[idx]), mx.nd.array(y_train[idx])
            with autograd.record():
                loss = loss_fn(net(data), label)
            loss.backward()
            trainer.step(bs)  # per-worker batch: gradients are averaged over workers
            total += float(loss.mean().asscalar())
            samples += bs
        if rank == 0 and (epoch + 1) % 5 == 0:
            print(f"epoch {epoch + 1}: mean loss {total / max(steps, 1):.4f}", flush=True)
    mx.nd.waitall()
    elapsed = time.perf_counter() - start

    if args.asynchronous:
        hvd.barrier()  # every worker's last delta is on the servers: score those parameters
        trainer.pull_parameters()
    pred = net(mx.nd.array(x_test)).argmax(axis=1).asnumpy()
    accuracy = float((pred == y_test).mean())
    # Every worker has the same parameters; report the job's throughput from rank 0.
    throughput = hvd.allreduce(
        mx.nd.array([samples / elapsed]), average=False, name="samples_per_s"
    ).asscalar()
    if rank == 0:
        print(
            f"workers: {size}  test accuracy: {accuracy:.4f}  samples/s: {throughput:.1f}",
            flush=True,
        )
    hvd.shutdown()
    if accuracy < args.min_accuracy:
        print(f"accuracy {accuracy:.4f} is below {args.min_accuracy}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
