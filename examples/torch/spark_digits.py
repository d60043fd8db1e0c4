"""Data-parallel training on scikit-learn's digits in a Spark job, with Horovod's
``horovod.spark.run`` API (only the imports say fastps). Nothing is downloaded.

    python examples/torch/spark_digits.py --num-proc 2                   # local[2]
    python examples/torch/spark_digits.py --master spark://host:7077     # a cluster

One barrier stage, one task per rank; ``train_digits`` runs in every task and returns its
rank's accuracy, the seconds from submission to its first step and its peak memory.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Dict


def train_digits(
    epochs: int = 20, batch_size: int = 16, lr: float = 1e-3, submitted: float = 0.0
) -> Dict[str, Any]:
    """Trains an MLP on this rank's shard of digits; every rank returns the same accuracy."""
    import resource

    import fastps.torch as hvd
    import numpy as np
    import torch
    import torch.nn.functional as F
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.set_num_threads(1)  # Spark runs one task per core
    torch.manual_seed(42)
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, digits.target, test_size=0.25, random_state=0, stratify=digits.target
    )
    x_train, y_train = torch.from_numpy(x_tr), torch.from_numpy(y_tr)
    x_test, y_test = torch.from_numpy(x_te), torch.from_numpy(y_te)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    optimizer = hvd.DistributedOptimizer(
        torch.optim.Adam(model.parameters(), lr=lr * size),
        named_parameters=model.named_parameters(),
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    first_step = None
    for epoch in range(epochs):
        order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(epoch))
        mine = order[rank::size]
        steps = len(order) // size // batch_size  # the same number on every rank
        for i in range(steps):
            idx = mine[i * batch_size : (i + 1) * batch_size]
            optimizer.zero_grad()
            F.cross_entropy(model(x_train[idx]), y_train[idx]).backward()
            optimizer.step()
            if first_step is None:
                first_step = time.time()
    with torch.no_grad():
        shard = slice(rank, None, size)
        correct = (model(x_test[shard]).argmax(1) == y_test[shard]).sum().float()
        total = torch.tensor(float(len(y_test[shard])))
    correct = hvd.allreduce(correct, op=hvd.Sum)
    total = hvd.allreduce(total, op=hvd.Sum)
    return {
        "rank": rank,
        "size": size,
        "accuracy": float(correct / total),
        "startup_s": (first_step or time.time()) - submitted if submitted else None,
        "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--master", default=None, help="default: local[NUM_PROC]")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--min-accuracy", type=float, default=0.95)
    args = parser.parse_args()

    import fastps.spark
    from pyspark.sql import SparkSession

    master = args.master or f"local[{args.num_proc}]"
    spark = SparkSession.builder.master(master).appName("fastps-digits").getOrCreate()
    try:
        submitted = time.time()
        results = fastps.spark.run(
            train_digits,
            kwargs={"epochs": args.epochs, "submitted": submitted},
            num_proc=args.num_proc,
        )
    finally:
        spark.stop()
    for r in results:
        print(
            f"rank {r['rank']}/{r['size']}: accuracy {r['accuracy']:.4f}, first step "
            f"{r['startup_s']:.1f} s after submission, peak RSS {r['max_rss_mib']:.0f} MiB"
        )
    return 0 if results[0]["accuracy"] >= args.min_accuracy else 1


if __name__ == "__main__":
    sys.exit(main())
