"""FSDP2 (``fully_shard``) under torchrun (argv: backend, output folder, cases), on the
default process group's backend and, as the reference, on a gloo group of all the ranks.

Each case shards a small MLP over ``init_device_mesh("cpu", (world,))`` (the default
group; the reference: ``DeviceMesh.from_group`` of ``new_group(backend="gloo")``), every
Linear its own FSDP unit, then the root, trains it a few steps on batches of this rank's
own and saves the full parameters (``DTensor.full_tensor()``, an all-gather) and the
per-step losses to ``<out>/<case>.<backend>.<rank>.pt``; the test compares the two.
FSDP2 moves parameters with all_gather_into_tensor and gradients with
reduce_scatter_tensor; for float64 it sums (ReduceOp.SUM) and divides by the world size
itself, for float32 it asks the backend for ReduceOp.AVG.

Cases: ``sgd`` (float64, SGD-momentum), ``adam`` (float64, Adam, reshard_after_forward
False, a layer whose rows do not split evenly among the ranks: FSDP2 pads it), ``fp32``
(float32 parameters: ReduceOp.AVG) and ``premul`` (float32 with
``set_gradient_divide_factor(2 * world)``: ReduceOp.PREMUL_SUM(1 / (2 * world)); gloo
refuses that op, so on gloo the case adds ``set_force_sum_reduction_for_comms``: a SUM,
then FSDP2 divides; with a power-of-two factor both are exact scalings, the same bits).
With ``FSDP_TEST_DEVICE=cuda`` the backend's mesh and model live on this rank's GPU.
"""

from __future__ import annotations

import datetime
import os
import sys
import time
from pathlib import Path
from typing import List

from common import apply_data_path

apply_data_path()

import fastps.torch  # noqa: E402, F401 - registers the "fastps" backend
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh  # noqa: E402
from torch.distributed.fsdp import FSDPModule, fully_shard  # noqa: E402

STEPS = 6
BATCH = 16


def model(dtype: torch.dtype) -> nn.Sequential:
    torch.manual_seed(0)  # the same initial model on every rank (FSDP2 does not broadcast)
    return nn.Sequential(
        nn.Linear(12, 32),
        nn.ReLU(),
        nn.Linear(32, 33),  # 33 rows: uneven shards, FSDP2 pads
        nn.ReLU(),
        nn.Linear(33, 3),
    ).to(dtype)


def run_case(case: str, mesh: DeviceMesh, out: Path) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    backend = dist.get_backend(mesh.get_group())
    device = (
        torch.device(mesh.device_type, torch.cuda.current_device())
        if (mesh.device_type == "cuda")
        else torch.device("cpu")
    )
    dtype = torch.float32 if case in ("fp32", "premul") else torch.float64
    net = model(dtype).to(device)
    reshard = case != "adam"
    for layer in net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(net, mesh=mesh, reshard_after_forward=reshard)
    if case == "premul":
        for m in net.modules():  # each FSDP unit reduces its own gradients
            if isinstance(m, FSDPModule):
                m.set_gradient_divide_factor(2.0 * world)  # a mean over twice the ranks
                if backend == "gloo":  # gloo refuses PREMUL_SUM: FSDP2 sums, then divides
                    m.set_force_sum_reduction_for_comms(True)
    if case == "adam":
        opt: torch.optim.Optimizer = torch.optim.Adam(net.parameters(), lr=0.01)
    else:
        opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(100 + rank)
    losses: List[float] = []
    for _ in range(STEPS):
        x = torch.randn(BATCH, 12, generator=g, dtype=dtype).to(device)
        y = torch.randint(0, 3, (BATCH,), generator=g).to(device)
        opt.zero_grad()
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    full = [p.full_tensor().detach().reshape(-1).cpu() for p in net.parameters()]
    local = sum(p.to_local().numel() for p in net.parameters())
    torch.save(
        {
            "params": torch.cat(full).double(),
            "losses": torch.tensor(losses, dtype=torch.float64),
            "local_numel": local,
        },
        out / f"{case}.{backend}.{rank}.pt",
    )


def main() -> None:
    backend, out, cases = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=90))
    rank, world = dist.get_rank(), dist.get_world_size()
    # FSDP_TEST_DEVICE=cuda: the backend's mesh on this rank's GPU (the gloo reference
    # stays on the CPU: the test compares within rounding).
    on_cuda = os.environ.get("FSDP_TEST_DEVICE", "cpu") == "cuda"
    if on_cuda:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local % torch.cuda.device_count())
    meshes = [init_device_mesh("cuda" if on_cuda else "cpu", (world,))]
    if backend != "gloo":
        meshes.append(DeviceMesh.from_group(dist.new_group(backend="gloo"), "cpu"))
    for case in cases:
        for mesh in meshes:
            start = time.perf_counter()
            run_case(case, mesh, out)
            took = time.perf_counter() - start
            print(
                f"FSDP CASE {case} {dist.get_backend(mesh.get_group())} rank={rank} OK "
                f"{took:.1f} s",
                flush=True,
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
