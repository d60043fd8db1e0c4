"""A worker that allreduces forever, except rank ``--fail-rank``, which exits with status 3
after ``--after`` steps: the rest of the job must not train on (or hang) without it."""

from __future__ import annotations

import argparse
import sys

import fastps.torch as hvd
import torch


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail-rank", type=int, default=1)
    parser.add_argument("--after", type=int, default=5)
    args = parser.parse_args()
    hvd.init()
    x = torch.ones(1000)
    step = 0
    while True:
        if hvd.rank() == args.fail_rank and step == args.after:
            print(f"rank {hvd.rank()}: failing on purpose after {step} steps", flush=True)
            return 3
        hvd.allreduce(x, name="step")
        step += 1
        if hvd.rank() == 0 and step == 1:
            # Before the failing rank can fail: its later steps need this rank's.
            print("rank 0: first step done", flush=True)


if __name__ == "__main__":
    sys.exit(main())
