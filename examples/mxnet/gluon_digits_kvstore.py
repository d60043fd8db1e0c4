"""Data-parallel Gluon training through a KVStore: ``mx.kv.create('fastps')``.

The script is written the way MXNet's parameter-server scripts are: a plain
``gluon.Trainer`` given a distributed KVStore. Switching between fastps and MXNet's own
parameter server is the --kvstore string ('fastps' or 'dist_sync').

    fastpsrun -np 2 python examples/mxnet/gluon_digits_kvstore.py

Trains a small MLP on scikit-learn's 8x8 digits, each worker on its own shard. Prints the
test accuracy (rank 0) and exits with status 1 if it is below --min-accuracy.
"""

from __future__ import annotations

import argparse
import sys
import time

import fastps.mxnet  # noqa: F401  (registers the 'fastps' KVStore)
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
    parser.add_argument("--kvstore", default="fastps", help="'fastps' or 'dist_sync'")
    parser.add_argument("--min-accuracy", type=float, default=0.95)
    args = parser.parse_args()

    kv = mx.kv.create(args.kvstore)  # 'fastps' starts fastps (like 'dist_sync' starts ps-lite)
    rank, size = kv.rank, kv.num_workers

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0)
    x_train, y_train = x_train[rank::size], y_train[rank::size]  # this worker's shard

    # One seed on every worker: a Gluon Trainer hands the parameters to its KVStore (which
    # then copies rank 0's everywhere) only in the first step(), after the first backward.
    mx.random.seed(1234)
    net = build_net(args.hidden, args.layers)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    trainer = gluon.Trainer(
        net.collect_params(), "sgd", {"learning_rate": args.lr, "momentum": 0.9}, kvstore=kv
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
            # A distributed KVStore sums the gradients of all workers (dist_sync semantics),
            # so normalize by the global batch.
            trainer.step(bs * size)
            total += float(loss.mean().asscalar())
            samples += bs
        if rank == 0 and (epoch + 1) % 5 == 0:
            print(f"epoch {epoch + 1}: mean loss {total / max(steps, 1):.4f}", flush=True)
    mx.nd.waitall()
    elapsed = time.perf_counter() - start

    pred = net(mx.nd.array(x_test)).argmax(axis=1).asnumpy()
    accuracy = float((pred == y_test).mean())
    # The workers step in lockstep, so the job processes size times rank 0's samples.
    throughput = samples * size / elapsed
    if rank == 0:
        print(
            f"workers: {size}  test accuracy: {accuracy:.4f}  samples/s: {throughput:.1f}",
            flush=True,
        )
    if accuracy < args.min_accuracy:
        print(f"accuracy {accuracy:.4f} is below {args.min_accuracy}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
