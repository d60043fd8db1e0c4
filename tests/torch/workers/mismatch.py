"""Worker: ranks whose tensors differ get a FastPSError naming the tensor, never a hang.

Usage: mismatch.py MODE
  extra     rank 1's model has an extra layer (DistributedOptimizer)
  shape     one layer's shape differs on rank 1 (DistributedOptimizer)
  params    rank 1's model has an extra layer (broadcast_parameters)
  allreduce the same tensor name with different shapes (the collective layer's check);
  the job stays usable: the next allreduce works

Prints ``CAUGHT <ExceptionType>: <message>`` and exits 0 when the error arrived; exits 1 if
the mismatched call returned normally.
"""

from __future__ import annotations

import sys

import fastps.torch as hvd
import torch


class Net(torch.nn.Module):
    def __init__(self, hidden: int, extra: bool) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(4, hidden)
        self.fc2 = torch.nn.Linear(hidden, 2)
        if extra:
            self.extra = torch.nn.Linear(2, 2)


def main() -> int:
    mode = sys.argv[1]
    hvd.init()
    odd = hvd.rank() == 1
    try:
        if mode == "extra":
            model = Net(8, extra=odd)
            hvd.DistributedOptimizer(
                torch.optim.SGD(model.parameters(), lr=0.1),
                named_parameters=model.named_parameters(),
            )
        elif mode == "shape":
            model = Net(9 if odd else 8, extra=False)
            hvd.DistributedOptimizer(
                torch.optim.SGD(model.parameters(), lr=0.1),
                named_parameters=model.named_parameters(),
            )
        elif mode == "params":
            model = Net(8, extra=odd)
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        elif mode == "allreduce":
            hvd.allreduce(torch.zeros(6 if odd else 5), name="layer.weight")
        else:
            raise SystemExit(f"unknown mode {mode}")
    except hvd.FastPSError as exc:
        print(f"CAUGHT {type(exc).__name__}: {exc}", flush=True)
        after = hvd.allreduce(torch.ones(3), name="after.mismatch", op=hvd.Sum)
        assert torch.equal(after, torch.full((3,), float(hvd.size()))), after
        print("NEXT OP OK", flush=True)
        return 0
    print("NO ERROR", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
