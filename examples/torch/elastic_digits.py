"""Elastic data-parallel training on scikit-learn's digits (8x8 images, 10 classes;
bundled with scikit-learn, nothing is downloaded): workers may die and join, and with
FASTPS_ELASTIC_SERVERS=1 summation servers too, while it trains (docs/guide/elastic.md).

    fastpsrun -np 2 --min-np 1 --max-np 4 --host-discovery-script "echo localhost:4" \\
        python examples/torch/elastic_digits.py

Horovod's elastic API with only the import line saying fastps: the model, the optimizer
and the sampler live in a ``TorchState`` committed every ``--commit-every`` batches and at
each epoch's end; a failure rolls every survivor back to the last commit, a worker that
joins gets the committed state from rank 0. ``ElasticSampler`` hands each rank its share
of the samples not yet processed this epoch, so a world that changes mid-epoch neither
repeats nor drops samples; the learning rate follows the world's size (a reset callback).
The test set is evaluated in shards and the counts summed; the script exits with status 1
if the accuracy is below ``--min-accuracy``.
"""

from __future__ import annotations

import argparse
import sys
import time

import fastps.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split


def build_model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(64, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 10),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=16, help="per rank")
    parser.add_argument("--lr", type=float, default=1e-3, help="per rank; scaled by size")
    parser.add_argument("--commit-every", type=int, default=5, help="batches per commit")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--min-accuracy", type=float, default=0.95)
    args = parser.parse_args()

    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, digits.target, test_size=0.25, random_state=0, stratify=digits.target
    )
    train_set = torch.utils.data.TensorDataset(torch.from_numpy(x_train), torch.from_numpy(y_train))
    x_test, y_test = torch.from_numpy(x_test), torch.from_numpy(y_test)
    sampler = hvd.elastic.ElasticSampler(train_set, shuffle=True, seed=args.seed)
    loader = torch.utils.data.DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)

    model = build_model()
    optimizer = hvd.DistributedOptimizer(
        torch.optim.Adam(model.parameters(), lr=args.lr * hvd.size()),
        named_parameters=model.named_parameters(),
    )
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0)

    def on_reset() -> None:
        # One step per round on the mean of size gradients: the rate follows the world.
        for group in optimizer.param_groups:
            group["lr"] = args.lr * hvd.size()

    state.register_reset_callbacks([on_reset])
    started = time.perf_counter()

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> float:
        while state.epoch < args.epochs:
            model.train()
            for i, (xb, yb) in enumerate(loader):
                optimizer.zero_grad()
                F.cross_entropy(model(xb), yb).backward()
                optimizer.step()
                sampler.record_batch(i, args.batch_size)
                if i % args.commit_every == args.commit_every - 1:
                    state.commit()
            if hvd.rank() == 0:
                print(f"epoch {state.epoch + 1:3d} done on {hvd.size()} workers", flush=True)
            state.epoch += 1
            sampler.set_epoch(state.epoch)
            state.commit()
        # Inside the elastic function: a failure during the evaluation is recovered too.
        model.eval()
        with torch.no_grad():
            xs, ys = x_test[hvd.rank() :: hvd.size()], y_test[hvd.rank() :: hvd.size()]
            correct = (model(xs).argmax(dim=1) == ys).sum()
            counts = torch.stack([correct, torch.tensor(len(ys))]).to(torch.int64)
        counts = hvd.allreduce(counts, name="test.counts", op=hvd.Sum)
        return float(counts[0]) / float(counts[1])

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
