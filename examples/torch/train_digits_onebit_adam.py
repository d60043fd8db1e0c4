"""The digits example (train_digits.py) with 1-bit Adam against plain Adam
(docs/guide/algorithms.md):

    fastpsrun -np 2 python examples/torch/train_digits_onebit_adam.py --optimizer onebit-adam
    fastpsrun -np 2 python examples/torch/train_digits_onebit_adam.py --optimizer adam

``--freeze-step`` is 1-bit Adam's warm-up; with plain Adam it only marks the step from
which the bytes are counted, so both runs report the bytes each worker's data-plane sockets
sent after the same step (``_api.data_path_stats()["socket_bytes_sent"]``). Run with
FASTPS_SHM=0 for those bytes to include every push (pushes to a server on the same host
through shared memory are not socket bytes). Rank 0 prints one ``RESULT {json}`` line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import fastps.torch as hvd
import torch
import torch.nn.functional as F
from fastps.torch.algorithms import OneBitAdam
from fastps.worker import api as _api
from train_digits import build_model, load_data


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--optimizer", choices=("adam", "onebit-adam"), default="onebit-adam")
    parser.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=16, help="per rank")
    parser.add_argument("--lr", type=float, default=1e-3, help="per rank; scaled by size")
    parser.add_argument("--freeze-step", type=int, default=200)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--min-accuracy", type=float, default=0.0)
    args = parser.parse_args()

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    if "OMP_NUM_THREADS" not in os.environ:  # else the user's choice stands
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.local_size()))
    torch.manual_seed(args.seed)
    x_train, y_train, x_test, y_test = load_data()
    model = build_model(args.model)
    opt: torch.optim.Optimizer
    if args.optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=args.lr * size)
    else:
        opt = OneBitAdam(model.parameters(), lr=args.lr * size, freeze_step=args.freeze_step)
    # OneBitAdam names its algorithm: the wrapper runs it (warm-up, then 1-bit momentum).
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)

    def sent() -> int:
        return int(_api.data_path_stats()["socket_bytes_sent"])

    started = time.perf_counter()
    at_start, at_freeze = sent(), -1
    rounds = 0
    for epoch in range(args.epochs):
        model.train()
        order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(epoch))
        shard = order[rank::size]
        steps = len(order) // size // args.batch_size  # equal on every rank
        for step in range(steps):
            idx = shard[step * args.batch_size : (step + 1) * args.batch_size]
            opt.zero_grad()
            F.cross_entropy(model(x_train[idx]), y_train[idx]).backward()
            opt.step()
            rounds += 1
            if rounds == args.freeze_step:
                at_freeze = sent()
    at_end = sent()
    model.eval()
    with torch.no_grad():
        xs, ys = x_test[rank::size], y_test[rank::size]
        correct = (model(xs).argmax(dim=1) == ys).sum()
    totals = hvd.allreduce(
        torch.tensor(
            [float(correct), float(len(ys)), at_end - at_start, at_end - at_freeze],
            dtype=torch.float64,
        ),
        name="result.totals",
        op=hvd.Sum,
    )
    accuracy = float(totals[0] / totals[1])
    if rank == 0:
        result = {
            "optimizer": args.optimizer,
            "accuracy": accuracy,
            "rounds": rounds,
            "freeze_step": args.freeze_step,
            # per worker, averaged over the workers
            "bytes_sent": float(totals[2]) / size,
            "bytes_sent_after_freeze": float(totals[3]) / size if at_freeze >= 0 else None,
            "seconds": time.perf_counter() - started,
        }
        print("RESULT " + json.dumps(result), flush=True)
    hvd.shutdown()
    return 0 if accuracy >= args.min_accuracy else 1


if __name__ == "__main__":
    sys.exit(main())
