"""Onebit with error feedback on the CIFAR-like task, simulated in one process.

A reference for docs/results/compression.md ("Time to accuracy per compressor"): the training
of ``benchmarks/bench_compression_accuracy.py --tasks cifar`` (same data, model, seed
order, sharding, Adam) for 2 simulated workers, with the gradients averaged by a torch
re-implementation of fastps's onebit instead of fastps, so the algorithm can be told
apart from the implementation:

- ``twoway`` (fastps): each worker adds its gradient to its residual, sends
  sign × mean |x| of every 65,536-value part (256 KiB of float32) and keeps the rest;
  the server sums the workers' parts, adds its own residual, answers sign × mean |x| of
  that and keeps the rest; the average is the answer / 2;
- ``oneway``: the same without the server's recompression (the plain sum of the
  workers' compressed parts);
- ``none``: the plain mean.

    python -m benchmarks.onebit_reference --mode twoway --seed 42

Prints the test accuracy after every epoch.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

if __package__ in (None, ""):  # run as a file: make `benchmarks.*` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks import compression_tasks as ct  # noqa: E402

PART_VALUES = 65536  # fastps's part: 256 KiB of float32
WORKERS = 2


def onebit(x: torch.Tensor, residual: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(decoded output, new residual) of onebit with error feedback on a flat tensor."""
    x = x + residual
    out = torch.empty_like(x)
    for start in range(0, x.numel(), PART_VALUES):
        part = x[start : start + PART_VALUES]
        out[start : start + PART_VALUES] = torch.where(part >= 0, 1.0, -1.0) * part.abs().mean()
    return out, x - out


def train(mode: str, seed: int, epochs: int) -> List[float]:
    torch.set_num_threads(1)
    torch.manual_seed(seed)  # before the model, as the benchmark's workers do
    task = ct.make_task("cifar")
    model = task.build_model()
    params = list(model.parameters())
    optimizer = torch.optim.Adam(params, lr=task.lr * WORKERS)
    worker_res = [[torch.zeros(p.numel()) for p in params] for _ in range(WORKERS)]
    server_res = [torch.zeros(p.numel()) for p in params]
    steps = len(task.x_train) // WORKERS // task.batch_size
    accuracies = []
    for epoch in range(epochs):
        model.train()
        order = torch.randperm(len(task.x_train), generator=torch.Generator().manual_seed(epoch))
        for step in range(steps):
            grads = []
            for w in range(WORKERS):
                idx = order[w::WORKERS][step * task.batch_size : (step + 1) * task.batch_size]
                model.zero_grad()
                F.cross_entropy(model(task.x_train[idx]), task.y_train[idx]).backward()
                grads.append([p.grad.detach().flatten().clone() for p in params])
            for i, p in enumerate(params):
                if mode == "none":
                    total = sum(g[i] for g in grads)
                else:
                    total = torch.zeros(p.numel())
                    for w in range(WORKERS):
                        sent, worker_res[w][i] = onebit(grads[w][i], worker_res[w][i])
                        total += sent
                    if mode == "twoway":
                        total, server_res[i] = onebit(total, server_res[i])
                p.grad = (total / WORKERS).view_as(p)
            optimizer.step()
        model.eval()
        with torch.no_grad():
            acc = float((model(task.x_test).argmax(dim=1) == task.y_test).float().mean())
        accuracies.append(acc)
        print(f"{mode} seed {seed} epoch {epoch + 1}: test accuracy {acc:.4f}", flush=True)
    return accuracies


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=("twoway", "oneway", "none"), default="twoway")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--epochs", type=int, default=10)
    args = p.parse_args(argv)
    train(args.mode, args.seed, args.epochs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
