"""Data-parallel training of a small network on scikit-learn's digits (8x8 images, 10
classes; bundled with scikit-learn, nothing is downloaded).

    fastpsrun -np 2 python examples/torch/train_digits.py

Each rank trains on its own shard of every epoch's shuffled training set; gradients are
averaged by fastps while backward runs. The test set is evaluated in shards too and the
counts are summed, so every rank prints the same test accuracy. The script exits with
status 1 if the accuracy is below ``--min-accuracy``. Written against Horovod's API: only
the import line says fastps.

``--async`` (or FASTPS_MODE=async) trains asynchronously (docs/guide/async.md): the servers keep
the parameters, each rank's optimizer steps on its own gradients and pushes the change;
FASTPS_STALENESS=s bounds how far a rank may run ahead of the slowest. Each rank then makes its own
steps at the per-rank learning rate instead of one step at ``lr * size`` per round.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Tuple

import fastps
import fastps.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split


def build_model(kind: str) -> torch.nn.Module:
    if kind == "cnn":
        return torch.nn.Sequential(
            torch.nn.Unflatten(1, (1, 8, 8)),
            torch.nn.Conv2d(1, 16, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.Conv2d(16, 32, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Flatten(),
            torch.nn.Linear(32 * 4 * 4, 64),
            torch.nn.ReLU(),
            torch.nn.Linear(64, 10),
        )
    return torch.nn.Sequential(
        torch.nn.Linear(64, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 10),
    )


def load_data() -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x_train, y_train, x_test, y_test: pixels scaled to [0, 1], a fixed stratified split
    (the same on every rank and every run)."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, digits.target, test_size=0.25, random_state=0, stratify=digits.target
    )
    return (
        torch.from_numpy(x_train),
        torch.from_numpy(y_train),
        torch.from_numpy(x_test),
        torch.from_numpy(y_test),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=16, help="per rank")
    parser.add_argument("--lr", type=float, default=1e-3, help="per rank; scaled by size")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--fp16-allreduce", action="store_true")
    parser.add_argument(
        "--compression",
        default="",
        help="a core compressor spec, e.g. onebit:ef or topk:0.01:ef (docs/guide/compression.md)",
    )
    parser.add_argument("--backward-passes-per-step", type=int, default=1)
    parser.add_argument("--min-accuracy", type=float, default=0.95)
    parser.add_argument("--async", dest="asynchronous", action="store_true")
    args = parser.parse_args()

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    # This host's cores shared by its workers, unless OMP_NUM_THREADS says otherwise.
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.local_size()))
    torch.manual_seed(args.seed)

    x_train, y_train, x_test, y_test = load_data()
    model = build_model(args.model)
    # Synchronous: one step per round on the mean of size gradients, at lr * size.
    # Asynchronous: every rank steps on its own gradient at lr; size steps per round.
    lr = args.lr if args.asynchronous else args.lr * size
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    optimizer = hvd.DistributedOptimizer(
        optimizer,
        named_parameters=model.named_parameters(),
        compression=(
            fastps.Compression.from_spec(args.compression)
            if args.compression
            else hvd.Compression.fp16
            if args.fp16_allreduce
            else hvd.Compression.none
        ),
        backward_passes_per_step=args.backward_passes_per_step,
        asynchronous=args.asynchronous or None,  # None: FASTPS_MODE decides
    )
    # Start from rank 0's weights and optimizer state on every rank.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    started = time.perf_counter()
    passes = args.backward_passes_per_step
    for epoch in range(args.epochs):
        model.train()
        order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(epoch))
        shard = order[rank::size]
        # Equal step counts on every rank (each step is a collective).
        steps = len(order) // size // (args.batch_size * passes)
        total = torch.zeros(2)
        for step in range(steps):
            optimizer.zero_grad()
            for p in range(passes):
                start = (step * passes + p) * args.batch_size
                idx = shard[start : start + args.batch_size]
                loss = F.cross_entropy(model(x_train[idx]), y_train[idx])
                (loss / passes).backward()
                total += torch.tensor([loss.item(), 1.0])
            optimizer.step()
        mean_loss = hvd.allreduce(total, name="train.loss", op=hvd.Sum)
        if rank == 0 and (epoch % 5 == 4 or epoch == args.epochs - 1):
            print(
                f"epoch {epoch + 1:3d}  train loss {float(mean_loss[0] / mean_loss[1]):.4f}",
                flush=True,
            )

    if hasattr(optimizer, "pull_parameters"):
        # Every rank's last update reached the servers before its loss allreduce above
        # returned: read the parameters they hold, the same on every rank.
        optimizer.pull_parameters()
    model.eval()
    with torch.no_grad():
        xs, ys = x_test[rank::size], y_test[rank::size]
        correct = (model(xs).argmax(dim=1) == ys).sum()
        counts = torch.stack([correct, torch.tensor(len(ys))]).to(torch.int64)
    counts = hvd.allreduce(counts, name="test.counts", op=hvd.Sum)
    accuracy = float(counts[0]) / float(counts[1])
    elapsed = time.perf_counter() - started
    if rank == 0:
        print(
            f"test accuracy: {accuracy:.4f} ({int(counts[0])}/{int(counts[1])}) after "
            f"{args.epochs} epochs on {size} workers in {elapsed:.1f}s",
            flush=True,
        )
    hvd.shutdown()
    if accuracy < args.min_accuracy:
        print(f"rank {rank}: accuracy {accuracy:.4f} is below {args.min_accuracy}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
