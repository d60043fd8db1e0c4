"""Worker: restoring a checkpoint that only rank 0 loads, with broadcast_parameters and
broadcast_optimizer_state.

Usage: checkpoint.py DIR   (a directory all ranks can read)
"""

from __future__ import annotations

import os
import sys
from typing import Any

import fastps.torch as hvd
import torch
import torch.nn.functional as F


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.ReLU(), torch.nn.Linear(12, 3))


def train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed + hvd.rank())
    for _ in range(steps):
        x = torch.randn(4, 6, generator=g)
        y = torch.randint(0, 3, (4,), generator=g)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()


def same(a: Any, b: Any, where: str = "state") -> None:
    """Exact equality of nested state (tensors compared by value)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), (where, sorted(a), sorted(b))
        for k in a:
            same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


def run(kind: str, directory: str) -> None:
    rank = hvd.rank()
    path = os.path.join(directory, f"{kind}.pt")

    def fresh() -> Any:
        torch.manual_seed(10 + rank)  # every rank starts different
        model = make_model()
        if kind == "adam":
            base = torch.optim.Adam(model.parameters(), lr=0.01, betas=(0.8, 0.9))
        else:
            base = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
        opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
        return model, opt

    # A first run trains and saves a checkpoint with a changed learning rate.
    model, opt = fresh()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    train(model, opt, 3, seed=1)
    if rank == 0:
        opt.param_groups[0]["lr"] *= 0.5
        torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, path)
    hvd.barrier()

    # The restarted job: only rank 0 loads the checkpoint, the others have no state.
    model, opt = fresh()
    if rank == 0:
        ckpt = torch.load(path)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
    else:
        assert len(opt.state_dict()["state"]) == 0
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)

    ckpt = torch.load(path)
    same(ckpt["model"], model.state_dict(), "model")
    same(ckpt["opt"], opt.state_dict(), "opt")
    assert opt.param_groups[0]["lr"] == ckpt["opt"]["param_groups"][0]["lr"]
    if kind == "adam":
        step = opt.state_dict()["state"][0]["step"]
        assert float(step) == 3.0, step

    # Training goes on identically everywhere.
    train(model, opt, 2, seed=5)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = hvd.allgather(flat.unsqueeze(0), name=f"after.{kind}")
    assert all(torch.equal(everyone[0], row) for row in everyone), "ranks diverged"

    # A root without state clears the others' state (a plain optimizer: training it on
    # one rank only involves no collective).
    model = make_model()
    plain = torch.optim.Adam(model.parameters(), lr=0.01)
    if rank != 0:
        model(torch.ones(2, 6)).sum().backward()
        plain.step()
    hvd.broadcast_optimizer_state(plain, root_rank=0)
    assert len(plain.state_dict()["state"]) == 0
    print(f"CHECKPOINT OK {kind}", flush=True)


def main() -> None:
    hvd.init()
    for kind in ("adam", "sgd"):
        run(kind, sys.argv[1])
    hvd.shutdown()


if __name__ == "__main__":
    main()
