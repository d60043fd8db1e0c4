"""Worker: data-parallel training equals one process training on the concatenated batches.

Every rank trains the same model on its half of each global batch with
DistributedOptimizer; rank 0 also trains a plain copy on the whole batches (no fastps)
and the parameters must agree. float64 keeps the comparison tight. Also checks that the
learned gradient priorities follow the forward order, not the registration order.

Usage: train_equiv.py [sgd|adam ...]   (default: both)
"""

from __future__ import annotations

import sys
from typing import Callable, List, Tuple

import fastps.torch as hvd
import torch
import torch.nn.functional as F

STEPS = 6
GLOBAL_BATCH = 8
FORWARD_ORDER = ["stem.weight", "stem.bias", "mid.weight", "mid.bias", "head.weight", "head.bias"]


class Net(torch.nn.Module):
    """Registers its layers in the reverse of the order its forward pass uses them."""

    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(8, 3)
        self.mid = torch.nn.Linear(16, 8)
        self.stem = torch.nn.Linear(10, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.mid(torch.tanh(self.stem(x)))))


def make_model() -> Net:
    torch.manual_seed(1234)
    return Net().double()


def make_data() -> List[Tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(99)
    return [
        (
            torch.randn(GLOBAL_BATCH, 10, generator=g, dtype=torch.float64),
            torch.randint(0, 3, (GLOBAL_BATCH,), generator=g),
        )
        for _ in range(STEPS)
    ]


def make_opt(kind: str, params: object) -> torch.optim.Optimizer:
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)  # type: ignore[arg-type]
    return torch.optim.Adam(params, lr=0.01)  # type: ignore[arg-type]


def reference(kind: str, data: List[Tuple[torch.Tensor, torch.Tensor]]) -> Net:
    model = make_model()
    opt = make_opt(kind, model.parameters())
    for x, y in data:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return model


def distributed(
    kind: str,
    passes: int,
    data: List[Tuple[torch.Tensor, torch.Tensor]],
    check_order: Callable[[List[str]], None],
) -> Net:
    rank, size = hvd.rank(), hvd.size()
    model = make_model()
    opt = hvd.DistributedOptimizer(
        make_opt(kind, model.parameters()),
        named_parameters=model.named_parameters(),
        backward_passes_per_step=passes,
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    share = GLOBAL_BATCH // size
    for step, (x, y) in enumerate(data):
        xs, ys = x[rank * share : (rank + 1) * share], y[rank * share : (rank + 1) * share]
        opt.zero_grad()
        micro = share // passes
        for i in range(passes):
            loss = F.cross_entropy(
                model(xs[i * micro : (i + 1) * micro]), ys[i * micro : (i + 1) * micro]
            )
            (loss / passes).backward()
        opt.step()
        if step == 0:
            check_order(opt.parameter_order())
    return model


def main() -> None:
    hvd.init()
    kinds = sys.argv[1:] or ["sgd", "adam"]
    data = make_data()

    def check_order(order: List[str]) -> None:
        registered = [n for n, _ in make_model().named_parameters()]
        assert registered != FORWARD_ORDER, registered
        assert order == FORWARD_ORDER, f"learned order {order}, expected {FORWARD_ORDER}"
        print(f"ORDER OK {order}")

    for kind in kinds:
        ref = reference(kind, data)
        for passes in (1, 2):
            model = distributed(kind, passes, data, check_order)
            worst = 0.0
            for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
                diff = float((p - q).abs().max())
                worst = max(worst, diff)
                assert diff < 1e-9, f"{kind} passes={passes}: {name} differs by {diff}"
            # Every rank ends with identical parameters.
            flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            gathered = hvd.allgather(flat.unsqueeze(0), name=f"final.{kind}.{passes}")
            assert torch.equal(gathered[0], gathered[-1]), "ranks disagree"
            print(f"EQUIV OK {kind} passes={passes} max_diff={worst:.3g}")
    hvd.shutdown()


if __name__ == "__main__":
    main()
