"""Functions the Spark tests run in the tasks (importable there: the test session's Python
workers get this folder on PYTHONPATH)."""

from __future__ import annotations

import os
from typing import Any, Dict


def rank_and_sum(scale: int, offset: int = 0) -> Dict[str, Any]:
    """Joins the job; the rank, the size and a sum over every rank through fastps."""
    import fastps.torch as hvd
    import torch

    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
    return {
        "rank": hvd.rank(),
        "size": hvd.size(),
        "sum": float(total[0]),
        "value": hvd.rank() * scale + offset,
        "pid": os.getpid(),
        "env_var": os.environ.get("FASTPS_TEST_MARK"),
    }


def fail_on_rank_1() -> int:
    import fastps.torch as hvd

    hvd.init()
    if hvd.rank() == 1:
        raise ValueError("rank 1 was told to fail")
    hvd.allreduce(__import__("torch").zeros(1))  # rank 0 waits here for the lost rank 1
    return hvd.rank()


def ddp_digits(epochs: int) -> Dict[str, Any]:
    """TorchDistributor's training function: DDP on the fastps backend, digits."""
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("fastps")
    backend = dist.get_backend()
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_tr, x_te, y_tr, y_te = train_test_split(x, digits.target, test_size=0.25, random_state=0)
    x_train, y_train = torch.from_numpy(x_tr), torch.from_numpy(y_tr)
    x_test, y_test = torch.from_numpy(x_te), torch.from_numpy(y_te)
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    )
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    for epoch in range(epochs):
        mine = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(epoch))
        mine = mine[rank::size]
        for i in range(len(x_train) // size // 16):
            idx = mine[i * 16 : (i + 1) * 16]
            opt.zero_grad()
            F.cross_entropy(model(x_train[idx]), y_train[idx]).backward()
            opt.step()
    with torch.no_grad():
        acc = torch.tensor([(model(x_test).argmax(1) == y_test).float().mean().item()])
    dist.all_reduce(acc)
    dist.destroy_process_group()
    return {"rank": rank, "size": size, "backend": backend, "accuracy": acc.item() / size}
