"""Plain PyTorch DDP on the fastps backend: scikit-learn's digits, the model of
train_digits.py, no Horovod API and no fastpsrun.

    torchrun --standalone --nproc-per-node 2 examples/torch/ddp_digits.py
    torchrun --standalone --nproc-per-node 2 examples/torch/ddp_digits.py --fp16-hook

The only fastps line is the backend's name (``--backend gloo`` runs the same script on
Gloo). ``--fp16-hook`` sends DDP's buckets in float16 through ``fastps.torch.ddp_comm_hook``.
Every rank prints the same test accuracy; the exit status is 1 below ``--min-accuracy``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_digits import build_model, load_data  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="fastps")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=16, help="per rank")
    parser.add_argument("--lr", type=float, default=1e-3, help="per rank; scaled by size")
    parser.add_argument("--fp16-hook", action="store_true")
    parser.add_argument("--min-accuracy", type=float, default=0.95)
    args = parser.parse_args()

    dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=120))
    rank, size = dist.get_rank(), dist.get_world_size()
    if "OMP_NUM_THREADS" not in os.environ:  # else the user's choice stands
        torch.set_num_threads(
            max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        )
    torch.manual_seed(42)
    x_train, y_train, x_test, y_test = load_data()
    model = DDP(build_model("mlp"))  # DDP broadcasts rank 0's weights
    if args.fp16_hook:
        import fastps.torch as hvd

        model.register_comm_hook(None, hvd.ddp_comm_hook(compression=hvd.Compression.fp16))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr * size)

    for epoch in range(args.epochs):
        model.train()
        order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(epoch))
        shard = order[rank::size]
        steps = len(order) // size // args.batch_size  # equal on every rank
        total = torch.zeros(2)
        for step in range(steps):
            idx = shard[step * args.batch_size : (step + 1) * args.batch_size]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x_train[idx]), y_train[idx])
            loss.backward()
            optimizer.step()
            total += torch.tensor([loss.item(), 1.0])
        dist.all_reduce(total)
        if rank == 0 and (epoch % 5 == 4 or epoch == args.epochs - 1):
            print(f"epoch {epoch + 1:3d}  train loss {float(total[0] / total[1]):.4f}", flush=True)

    model.eval()
    with torch.no_grad():
        xs, ys = x_test[rank::size], y_test[rank::size]
        counts = torch.tensor([int((model(xs).argmax(1) == ys).sum()), len(ys)], dtype=torch.int64)
    dist.all_reduce(counts)
    accuracy = float(counts[0]) / float(counts[1])
    if rank == 0:
        print(
            f"test accuracy: {accuracy:.4f} ({int(counts[0])}/{int(counts[1])}) on {size} "
            f"ranks, backend {dist.get_backend()}",
            flush=True,
        )
    dist.destroy_process_group()
    return 0 if accuracy >= args.min_accuracy else 1


if __name__ == "__main__":
    sys.exit(main())
