"""The digits example's training with sparsified gradients, simulated in one process.

A reference for why random-k falls short of uncompressed accuracy (docs/results/compression.md,
docs/guide/compression.md "Random-k and the optimizer"): it runs exactly
the data order, sharding, model and optimizer of examples/torch/train_digits.py for
``--workers`` simulated workers, but averages their gradients with a numpy/torch
re-implementation of the compressors instead of fastps, so the algorithm can be told
apart from the implementation and tried with another optimizer:

- ``none``: the plain mean;
- ``randomk:K:ef`` (Stich et al. 2018, "Sparsified SGD with memory"): every worker adds
  its gradient to its residual e, sends e at k indices drawn for the round (the same on
  every worker), keeps the rest; the mean of the sent values lands at those indices;
- ``topk:K:ef`` (Aji & Heafield 2017): every worker sends the top k of its e; the server
  sums, adds its own residual and answers the top k of that (two-way, as fastps).

k is ceil(K · n) per tensor, as in fastps (each of the example's tensors is one part).
``--warmup-epochs W`` adds Deep Gradient Compression's sparsity warm-up as fastps's
``:warmup=ROUNDS`` does it (W epochs' rounds, 4 stages keeping K^((s+1)/5)).

    python -m benchmarks.sparsified_digits --specs none randomk:0.01:ef --seeds 42 43
    python -m benchmarks.sparsified_digits --optimizer sgd --specs none randomk:0.01:ef
    python -m benchmarks.sparsified_digits --specs randomk:0.01:ef --warmup-epochs 10

Prints the test accuracy per spec and seed, and their means.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import statistics
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "torch" / "train_digits.py"


def _example_module():
    spec = importlib.util.spec_from_file_location("train_digits", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


Averager = Callable[[int, List[List[torch.Tensor]]], List[torch.Tensor]]


def warmup_fraction(frac: float, rnd: int, warmup_rounds: int, steps: int) -> float:
    """Deep Gradient Compression's sparsity warm-up (Lin et al. 2018, §3.3): the kept
    fraction falls exponentially from all values to ``frac``, one step per
    ``warmup_rounds // steps`` rounds, over the first ``warmup_rounds`` rounds."""
    if rnd >= warmup_rounds or steps <= 0:
        return frac
    stage = rnd * steps // warmup_rounds  # 0 .. steps-1
    return float(frac ** ((stage + 1) / (steps + 1)))


def make_averager(
    spec: str, workers: int, seed: int, warmup_rounds: int = 0, warmup_steps: int = 0
) -> Averager:
    """A function (round, grads[worker][tensor]) -> the averaged tensors, per ``spec``."""
    fields = spec.split(":")
    name = fields[0]
    if name == "none":
        return lambda _round, grads: [sum(gs) / workers for gs in zip(*grads)]
    if name not in ("randomk", "cyclick", "topk") or len(fields) != 3 or fields[2] != "ef":
        raise ValueError(f"unknown spec {spec!r} (none, randomk:K:ef, topk:K:ef)")
    frac = float(fields[1])
    residual: Dict[int, List[torch.Tensor]] = {}  # tensor -> one per worker
    server: Dict[int, torch.Tensor] = {}

    def average(rnd: int, grads: List[List[torch.Tensor]]) -> List[torch.Tensor]:
        out: List[torch.Tensor] = []
        for t in range(len(grads[0])):
            shape = grads[0][t].shape
            n = grads[0][t].numel()
            kept = warmup_fraction(frac, rnd, warmup_rounds, warmup_steps)
            k = min(n, max(1, math.ceil(kept * n)))
            res = residual.setdefault(t, [torch.zeros(n) for _ in range(workers)])
            total = torch.zeros(n)
            if name == "randomk":
                rng = np.random.default_rng([seed, rnd, t])
                idx = torch.from_numpy(rng.choice(n, size=k, replace=False))
            elif name == "cyclick":  # without replacement across rounds: a permutation's slices
                period = -(-n // k)
                perm = np.random.default_rng([seed, rnd // period, t]).permutation(n)
                idx = torch.from_numpy(perm[(rnd % period) * k : (rnd % period + 1) * k])
            for w in range(workers):
                e = res[w] + grads[w][t].reshape(-1)
                if name == "topk":
                    idx = torch.topk(e.abs(), k, sorted=False).indices
                total[idx] += e[idx]
                e[idx] = 0.0  # sent: it leaves the residual
                res[w] = e
            if name == "topk":  # the server's top k of its sum, with its own residual
                acc = server.get(t, torch.zeros(n)) + total
                idx = torch.topk(acc.abs(), k, sorted=False).indices
                total = torch.zeros(n)
                total[idx] = acc[idx]
                acc[idx] = 0.0
                server[t] = acc
            out.append((total / workers).reshape(shape))
        return out

    return average


def train(args: argparse.Namespace, spec: str, seed: int) -> float:
    ex = _example_module()
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    torch.manual_seed(seed)
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, digits.target, test_size=0.25, random_state=0, stratify=digits.target
    )
    x_train, y_train = torch.from_numpy(x_train), torch.from_numpy(y_train)
    x_test, y_test = torch.from_numpy(x_test), torch.from_numpy(y_test)
    model = ex.build_model("mlp")
    params = list(model.parameters())
    size = args.workers
    lr = args.lr * size  # the example's synchronous scaling
    if args.optimizer == "adam":
        opt: torch.optim.Optimizer = torch.optim.Adam(params, lr=lr)
    else:
        opt = torch.optim.SGD(params, lr=lr, momentum=args.momentum)
    per_epoch = len(x_train) // size // args.batch_size
    average = make_averager(
        spec, size, seed, int(args.warmup_epochs * per_epoch), args.warmup_steps
    )
    rnd = 0
    for epoch in range(args.epochs):
        order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(epoch))
        steps = per_epoch
        for step in range(steps):
            grads = []
            for w in range(size):
                shard = order[w::size]
                idx = shard[step * args.batch_size : (step + 1) * args.batch_size]
                loss = F.cross_entropy(model(x_train[idx]), y_train[idx])
                grads.append([g.detach() for g in torch.autograd.grad(loss, params)])
            for p, g in zip(params, average(rnd, grads)):
                p.grad = g
            opt.step()
            rnd += 1
    with torch.no_grad():
        return float((model(x_test).argmax(dim=1) == y_test).float().mean())


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--specs", nargs="+", default=["none", "randomk:0.01:ef", "topk:0.01:ef"])
    p.add_argument("--seeds", nargs="+", type=int, default=[42, 43, 44])
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16, help="per worker")
    p.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    p.add_argument(
        "--lr", type=float, default=None, help="per worker (adam 1e-3, sgd 1e-2 by default)"
    )
    p.add_argument("--momentum", type=float, default=0.9, help="sgd only")
    p.add_argument(
        "--warmup-epochs",
        type=float,
        default=0.0,
        help="sparsity warm-up (DGC): the kept fraction falls from 1 to K over these epochs",
    )
    p.add_argument("--warmup-steps", type=int, default=4, help="stages of the warm-up")
    args = p.parse_args(argv)
    if args.lr is None:
        args.lr = 1e-3 if args.optimizer == "adam" else 1e-2
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    print(
        f"sparsified_digits: {args.optimizer} lr {args.lr} x {args.workers} workers, "
        f"{args.epochs} epochs",
        flush=True,
    )
    for spec in args.specs:
        accs = []
        for seed in args.seeds:
            accs.append(train(args, spec, seed))
            print(f"  {spec:18s} seed {seed}: {accs[-1]:.4f}", flush=True)
        print(f"  {spec:18s} mean {statistics.mean(accs):.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
