"""Elastic Gluon training on scikit-learn's 8x8 digits: workers may die and join while it
trains (docs/guide/elastic.md).

    fastpsrun -np 3 --min-np 1 --max-np 4 --host-discovery-script "echo localhost:4" \\
        python examples/mxnet/gluon_elastic_digits.py

fastps.mxnet's elastic API (Horovod has none for MXNet; this is ``TorchState``'s
counterpart): the network, the ``DistributedTrainer``'s optimizer state and the position
in the epoch live in a ``GluonState`` committed every ``--commit-every`` steps and at each
epoch's end. Every rank draws the same order of the training set for an epoch; a step
takes its next ``batch-size x size`` samples, each rank its own slice, so a world that
changes mid-epoch goes on from the last commit's position, with no sample repeated or
skipped (the last, partial step of an epoch is dropped, as the plain example does). The
test set is evaluated in shards and the counts summed; exits with status 1 if the
accuracy is below ``--min-accuracy``.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import fastps.mxnet as hvd
import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split


def build_net(hidden: int) -> gluon.nn.HybridSequential:
    net = gluon.nn.HybridSequential()
    with net.name_scope():
        net.add(gluon.nn.Dense(hidden, activation="relu", in_units=64))
        net.add(gluon.nn.Dense(10, in_units=hidden))
    return net


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--commit-every", type=int, default=4, help="steps per commit")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--min-accuracy", type=float, default=0.95)
    args = parser.parse_args()

    hvd.init()
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0)

    mx.random.seed(args.seed)
    net = build_net(args.hidden)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    trainer = hvd.DistributedTrainer(
        net.collect_params(), "sgd", {"learning_rate": args.lr, "momentum": 0.9}
    )
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    # offset: samples of this epoch's order already trained on (by the whole world).
    state = hvd.elastic.GluonState(net, trainer, epoch=0, offset=0)
    started = time.perf_counter()

    @hvd.elastic.run
    def train(state: Any) -> float:
        while state.epoch < args.epochs:
            rank, size = hvd.rank(), hvd.size()
            step_samples = args.batch_size * size
            order = np.random.RandomState(args.seed + state.epoch).permutation(len(x_train))
            steps = 0
            while state.offset + step_samples <= len(order):
                mine = order[state.offset : state.offset + step_samples][rank::size]
                data, label = mx.nd.array(x_train[mine]), mx.nd.array(y_train[mine])
                with autograd.record():
                    loss = loss_fn(net(data), label)
                loss.backward()
                trainer.step(len(mine))  # the mean over the world's samples of this step
                state.offset += step_samples
                steps += 1
                if steps % args.commit_every == 0:
                    state.commit()
            if rank == 0:
                print(f"epoch {state.epoch + 1:3d} done on {size} workers", flush=True)
            state.epoch += 1
            state.offset = 0
            state.commit()
        # Inside the elastic function: a failure during the evaluation is recovered too.
        rank, size = hvd.rank(), hvd.size()
        predicted = net(mx.nd.array(x_test[rank::size])).argmax(axis=1).asnumpy()
        correct = float((predicted == y_test[rank::size]).sum())
        counts = hvd.allreduce(
            mx.nd.array([correct, len(predicted)], dtype="float64"),
            average=False,
            name="test.counts",
        ).asnumpy()
        return float(counts[0] / counts[1])

    accuracy = train(state)
    if hvd.rank() == 0:
        print(
            f"test accuracy: {accuracy:.4f} after {args.epochs} epochs, {hvd.size()} workers "
            f"at the end, {time.perf_counter() - started:.1f}s",
            flush=True,
        )
    rank = hvd.rank()
    hvd.shutdown()
    if accuracy < args.min_accuracy:
        print(f"rank {rank}: accuracy {accuracy:.4f} is below {args.min_accuracy}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
