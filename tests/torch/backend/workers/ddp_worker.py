"""DDP under torchrun on the process group's backend (argv: backend, output folder, cases).

Every case trains a small float64 classifier (a BatchNorm layer, so DDP broadcasts buffers
every forward) with SGD-momentum from the model rank 0 broadcasts (each rank starts from a
seed of its own) on batches of its own, and saves this rank's initial and final parameters,
buffers and per-step losses to ``<out>/<case>.<rank>.pt``; the test compares them across
backends. Leaf gradients are rounded to multiples of 2^-40 before DDP sees them (and stay
below 2^8), so any sum of up to 16 of them is exact whatever the order: a backend's results
are bit-equal to gloo's at any world size, and a float32 detour (24 bits) would still show.

Cases: ``default``, ``bucket_view`` (gradient_as_bucket_view), ``no_sync`` (two
micro-batches, the first under no_sync), ``static_graph``, ``unused``
(find_unused_parameters, a branch each rank skips on different steps), ``buckets``
(bucket_cap_mb small enough for several buckets; on the fastps backend it also records the
fastps allreduces of each backward to ``<out>/priorities.<rank>.json``), and the comm hook
``hook_none``, ``hook_fp16``, ``hook_bf16``, ``hook_onebit_ef`` (fastps.torch.ddp_comm_hook).
With ``DDP_TEST_DEVICE=cuda`` the model, data and DDP live on this rank's GPU.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from common import apply_data_path

apply_data_path()

import fastps.torch as hvd  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

STEPS = 12
BATCH = 32
LR = 0.2
MOMENTUM = 0.9
GRID = 2.0**40  # gradients are rounded to multiples of 1 / GRID
BOUND = 2.0**8  # ... and must stay below this (then 16 of them sum exactly)
HOOKS: Dict[str, Any] = {
    "hook_none": None,
    "hook_fp16": hvd.Compression.fp16,
    "hook_bf16": hvd.Compression.bf16,
    "hook_onebit_ef": hvd.Compression.onebit(error_feedback=True),
}


class Net(nn.Module):
    """An MLP classifier with a side branch that ``forward(x, use_branch=False)`` skips."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(20, 64)
        self.norm = nn.BatchNorm1d(64)
        self.hidden = nn.Linear(64, 64)
        self.branch = nn.Linear(64, 64)
        self.out = nn.Linear(64, 3)

    def forward(self, x: torch.Tensor, use_branch: bool = True) -> torch.Tensor:
        h = F.relu(self.norm(self.inp(x)))
        h = F.relu(self.hidden(h))
        if use_branch:
            h = h + torch.tanh(self.branch(h))
        return self.out(h)


def quantize(g: torch.Tensor) -> torch.Tensor:
    if not bool(g.abs().max() < BOUND):
        raise AssertionError(f"a gradient reached {g.abs().max().item()}: sums may round")
    return torch.round(g * GRID) / GRID


def batches(rank: int) -> List[tuple]:
    """This rank's two batches (the steps cycle through them): labels from a fixed linear
    teacher, so the loss falls fast (from ~1.1 to ~0.1 in 12 steps)."""
    teacher = torch.randn(20, 3, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    g = torch.Generator().manual_seed(100 + rank)
    out = []
    for _ in range(2):
        x = torch.randn(BATCH, 20, generator=g, dtype=torch.float64)
        out.append((x, (x @ teacher).argmax(dim=1)))
    return out


class Recorder:
    """Wraps ``fastps.collectives.ops.allreduce_async`` (the fastps backend's allreduce) to
    record each call's name, priority, size and the allreduces in flight before it while
    ``on``."""

    def __init__(self) -> None:
        from fastps.collectives import ops

        self.ops = ops
        self.orig: Callable[..., Any] = ops.allreduce_async
        self.on = False
        self.calls: List[Dict[str, Any]] = []
        self.steps: List[List[Dict[str, Any]]] = []

        # How many earlier allreduces were in flight when the backend chose the priority
        # (the backend restarts its count at 0 exactly when none were).
        from fastps.torch.process_group import FastPSProcessGroup

        self.group_cls = FastPSProcessGroup
        self.orig_priority: Callable[..., int] = FastPSProcessGroup._allreduce_priority
        self.busy = -1

        def priority_of(group: Any) -> int:
            self.busy = group._allreduces_in_flight
            return self.orig_priority(group)

        def wrapped(a: Any, dtype: str, name: Optional[str] = None, *args: Any, **kw: Any) -> Any:
            if self.on:
                priority = kw.get("priority", args[4] if len(args) > 4 else 0)
                self.calls.append(
                    {"name": name, "priority": priority, "bytes": int(a.nbytes), "busy": self.busy}
                )
            return self.orig(a, dtype, name, *args, **kw)

        ops.allreduce_async = wrapped
        FastPSProcessGroup._allreduce_priority = priority_of  # type: ignore[method-assign]

    def end_step(self) -> None:
        if self.on:
            self.steps.append(self.calls)
        self.calls = []

    def close(self) -> None:
        self.ops.allreduce_async = self.orig
        self.group_cls._allreduce_priority = self.orig_priority  # type: ignore[method-assign]


def device() -> torch.device:
    """``DDP_TEST_DEVICE=cuda``: this rank's GPU (``LOCAL_RANK`` modulo the GPUs there are);
    the CPU otherwise."""
    if os.environ.get("DDP_TEST_DEVICE", "cpu") == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        return torch.device("cuda", local % torch.cuda.device_count())
    return torch.device("cpu")


def run_case(case: str, rank: int, out: Path, backend: str) -> None:
    torch.manual_seed(1000 + rank)  # different on each rank: DDP broadcasts rank 0's
    dev = device()
    model = Net().double().to(dev)
    for p in model.parameters():
        p.register_hook(quantize)
    kwargs: Dict[str, Any] = {}
    if case == "bucket_view":
        kwargs["gradient_as_bucket_view"] = True
    elif case == "static_graph":
        kwargs["static_graph"] = True
    elif case == "unused":
        kwargs["find_unused_parameters"] = True
    elif case == "buckets":
        kwargs["bucket_cap_mb"] = 0.01  # 3 buckets: out+branch, hidden, norm+inp
    if dev.type == "cuda":
        kwargs["device_ids"] = [dev.index]
    ddp = DDP(model, **kwargs)
    init = torch.cat([p.detach().reshape(-1) for p in model.parameters()])  # rank 0's
    if case in HOOKS:
        ddp.register_comm_hook(None, hvd.ddp_comm_hook(compression=HOOKS[case]))
    recorder = Recorder() if case == "buckets" and backend == "fastps" else None
    opt = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=MOMENTUM)
    data = [(x.to(dev), y.to(dev)) for x, y in batches(rank)]
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        if recorder is not None:
            recorder.on = step >= 2  # after DDP rebuilt its buckets (first iteration)
        if case == "no_sync":
            with ddp.no_sync():
                x, y = data[(step + 1) % 2]
                F.cross_entropy(ddp(x), y).backward()
        x, y = data[step % 2]
        use_branch = case != "unused" or (step + rank) % 3 != 0
        loss = F.cross_entropy(ddp(x, use_branch), y)
        loss.backward()
        opt.step()
        if recorder is not None:
            recorder.end_step()
        losses.append(loss.item())
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu()
    buffers = torch.cat([b.detach().double().reshape(-1) for b in model.buffers()]).cpu()
    torch.save(
        {"init": init.cpu(), "params": flat, "buffers": buffers, "losses": torch.tensor(losses)},
        out / f"{case}.{rank}.pt",
    )
    if recorder is not None:
        recorder.close()
        (out / f"priorities.{rank}.json").write_text(json.dumps(recorder.steps))


def main() -> None:
    backend, out, cases = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=90))
    rank = dist.get_rank()
    if device().type == "cuda":
        torch.cuda.set_device(device())
    for case in cases:
        start = time.perf_counter()
        run_case(case, rank, out, backend)
        print(f"DDP CASE {case} rank={rank} OK {time.perf_counter() - start:.1f} s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
