"""Synthetic training throughput: random 32x32 images through a VGG-like or ResNet-like
network, in the style of Horovod's ``pytorch_synthetic_benchmark.py``.

fastps (one process per worker, started by fastpsrun)::

    fastpsrun -np 2 python examples/torch/synthetic_benchmark.py --model vgg

The same model under PyTorch DDP with the Gloo backend, for comparison; either torchrun
starts the processes (``RANK``/``WORLD_SIZE``/``MASTER_ADDR`` set) or this script spawns
``--ddp-np`` of them itself::

    python examples/torch/synthetic_benchmark.py --ddp --ddp-np 2 --model vgg
    torchrun --nproc-per-node 2 examples/torch/synthetic_benchmark.py --ddp --model vgg

Prints images/second per worker and in total, and one machine-readable ``RESULT`` line.
Models are sized for a few CPU cores: ``vgg`` has large fully connected layers
(3.3M parameters, communication-heavy), ``resnet`` is ResNet-20-like (0.27M parameters in
many small tensors, compute-heavy).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from typing import Any, Callable, List, Tuple

import torch
import torch.nn.functional as F
from torch import nn

# ------------------------------------------------------------------------------- models


class VGGLike(nn.Module):
    """Five 3x3 convolutions in three pooled stages, then three fully connected layers
    (2048 -> 1024 -> 1024 -> 10) holding most of the weights, as in VGG."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()

        def conv(cin: int, cout: int) -> List[nn.Module]:
            return [nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(inplace=True)]

        self.features = nn.Sequential(
            *conv(3, 32),
            *conv(32, 32),
            nn.MaxPool2d(2),
            *conv(32, 64),
            *conv(64, 64),
            nn.MaxPool2d(2),
            *conv(64, 128),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(128 * 4 * 4, 1024),
            nn.ReLU(inplace=True),
            nn.Linear(1024, 1024),
            nn.ReLU(inplace=True),
            nn.Linear(1024, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNetLike(nn.Module):
    """ResNet-20 for 32x32 inputs: three stages of three basic blocks (16, 32, 64)."""

    def __init__(self, num_classes: int = 10, blocks: int = 3) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(inplace=True)
        )
        layers: List[nn.Module] = []
        cin = 16
        for i, width in enumerate((16, 32, 64)):
            for b in range(blocks):
                layers.append(BasicBlock(cin, width, 2 if (b == 0 and i > 0) else 1))
                cin = width
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layers(self.stem(x))
        return self.fc(F.adaptive_avg_pool2d(out, 1).flatten(1))


MODELS = {"vgg": VGGLike, "resnet": ResNetLike}

# ------------------------------------------------------------------------------- timing


def benchmark(
    args: argparse.Namespace,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    log: Callable[[str], None],
) -> List[float]:
    """Runs warmup then ``num_iters`` timed iterations; returns images/second per iter."""
    data = torch.randn(args.batch_size, 3, 32, 32)
    target = torch.randint(0, 10, (args.batch_size,))

    def one_batch() -> None:
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()

    for _ in range(args.num_warmup_batches):
        one_batch()
    rates: List[float] = []
    for it in range(args.num_iters):
        start = time.perf_counter()
        for _ in range(args.num_batches_per_iter):
            one_batch()
        rate = args.batch_size * args.num_batches_per_iter / (time.perf_counter() - start)
        log(f"Iter #{it}: {rate:.1f} img/sec per worker")
        rates.append(rate)
    return rates


def mean_ci(values: List[float]) -> Tuple[float, float]:
    t = torch.tensor(values, dtype=torch.float64)
    std = float(t.std()) if len(values) > 1 else 0.0
    return float(t.mean()), 1.96 * std


def report(
    args: argparse.Namespace,
    system: str,
    size: int,
    rates: List[float],
    total_mean: float,
    log: Callable[[str], None],
) -> None:
    mean, ci = mean_ci(rates)
    log(f"Img/sec per worker: {mean:.1f} +-{ci:.1f}")
    log(f"Total img/sec on {size} worker(s): {total_mean:.1f} +-{ci * size:.1f}")
    log(
        f"RESULT system={system} model={args.model} batch_size={args.batch_size} "
        f"workers={size} per_worker={mean:.2f} total={total_mean:.2f}"
    )


def threads_for(local_size: int, requested: int) -> int:
    return requested or max(1, (os.cpu_count() or 1) // max(1, local_size))


# ------------------------------------------------------------------------------- fastps


def run_fastps(args: argparse.Namespace) -> None:
    import fastps.torch as hvd

    hvd.init()
    torch.set_num_threads(threads_for(hvd.local_size(), args.threads))
    torch.manual_seed(0)
    model = MODELS[args.model]()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(
        optimizer,
        named_parameters=model.named_parameters(),
        compression=compression,
        op=hvd.Adasum if args.use_adasum else hvd.Average,
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    def log(msg: str) -> None:
        if hvd.rank() == 0:
            print(msg, flush=True)

    describe(args, hvd.size(), "fastps", model, log)
    rates = benchmark(args, model, optimizer, log)
    mean, _ = mean_ci(rates)
    total = float(
        hvd.allreduce(torch.tensor(mean, dtype=torch.float64), name="bench.total", op=hvd.Sum)
    )
    report(args, "fastps", hvd.size(), rates, total, log)
    hvd.shutdown()


# ------------------------------------------------------------------------------- DDP


def run_ddp_worker(args: argparse.Namespace) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", size))
    torch.set_num_threads(threads_for(local_size, args.threads))
    torch.manual_seed(0)
    model = MODELS[args.model]()
    ddp = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01 * size, momentum=0.9)
    if args.fp16_allreduce:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)

    def log(msg: str) -> None:
        if rank == 0:
            print(msg, flush=True)

    describe(args, size, "ddp-gloo", model, log)
    rates = benchmark(args, ddp, optimizer, log)
    mean, _ = mean_ci(rates)
    total = torch.tensor(mean, dtype=torch.float64)
    dist.all_reduce(total)
    report(args, "ddp-gloo", size, rates, float(total), log)
    dist.barrier()  # no rank tears Gloo down while another still talks to it
    dist.destroy_process_group()


def _spawned(index: int, args: argparse.Namespace, port: int) -> None:
    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(index),
            "LOCAL_RANK": str(index),
            "WORLD_SIZE": str(args.ddp_np),
            "LOCAL_WORLD_SIZE": str(args.ddp_np),
        }
    )
    run_ddp_worker(args)


def run_ddp(args: argparse.Namespace) -> None:
    if all(v in os.environ for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
        run_ddp_worker(args)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    import torch.multiprocessing as mp

    mp.spawn(_spawned, args=(args, port), nprocs=args.ddp_np, join=True)


# ------------------------------------------------------------------------------- main


def describe(
    args: argparse.Namespace, size: int, system: str, model: nn.Module, log: Callable[[str], None]
) -> None:
    params = sum(p.numel() for p in model.parameters())
    log(f"System: {system}")
    log(f"Model: {args.model} ({params / 1e6:.2f}M parameters)")
    log(f"Batch size: {args.batch_size} per worker")
    log(f"Number of workers: {size}, torch threads per worker: {torch.get_num_threads()}")


def parse(argv: Any = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Synthetic training throughput (fastps or DDP)")
    p.add_argument("--model", choices=sorted(MODELS), default="vgg")
    p.add_argument("--batch-size", type=int, default=32, help="per worker")
    p.add_argument("--num-warmup-batches", "--num-warmup", type=int, default=5)
    p.add_argument("--num-batches-per-iter", type=int, default=5)
    p.add_argument("--num-iters", type=int, default=5)
    p.add_argument("--fp16-allreduce", action="store_true")
    p.add_argument("--use-adasum", action="store_true", help="refused: fastps only sums")
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads per worker (default: cores / local workers)",
    )
    p.add_argument("--ddp", action="store_true", help="run under torch DDP (Gloo) instead")
    p.add_argument(
        "--ddp-np",
        type=int,
        default=2,
        help="processes to spawn for --ddp when not started by torchrun",
    )
    return p.parse_args(argv)


def main() -> int:
    args = parse()
    if args.ddp:
        run_ddp(args)
    else:
        run_fastps(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
