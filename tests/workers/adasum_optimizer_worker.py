"""``DistributedOptimizer(op=hvd.Adasum)`` (Horovod's delta optimizer) against a numpy
reference: every rank simulates all ranks here (same seeds), steps each simulated rank's
own optimizer on its own batch, combines the ranks' updates with Adasum's pairwise formula
(written here, independently of core/collectives/adasum.py: recursive halves) and applies
``start + combined``. The distributed parameters must match after every step, for SGD with
momentum and for Adam (state kept per rank), with a parameter that only some ranks use.

argv: [passes] (backward passes per step, default 1)."""

from __future__ import annotations

import copy
import sys
from typing import Any, Callable, List

import fastps.torch as hvd
import numpy as np
import torch


def pair(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    dot = float((a * b).sum())
    na, nb = float((a * a).sum()), float((b * b).sum())
    ca = 1.0 - 0.5 * dot / na if na > 0 else 1.0
    cb = 1.0 - 0.5 * dot / nb if nb > 0 else 1.0
    return ca * a + cb * b


def adasum(rows: List[np.ndarray]) -> np.ndarray:
    """Power-of-two sizes: the left half's Adasum with the right half's, each half rounded
    to the rows' dtype (float32) as Horovod's buffers are."""
    if len(rows) == 1:
        return rows[0]
    half = len(rows) // 2
    left, right = adasum(rows[:half]), adasum(rows[half:])
    return pair(left.astype(np.float64), right.astype(np.float64)).astype(rows[0].dtype)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(6, 5)
        self.b = torch.nn.Linear(5, 3)
        self.extra = torch.nn.Linear(5, 3)  # used on some ranks and steps only

    def forward(self, x: torch.Tensor, use_extra: bool) -> torch.Tensor:
        h = torch.tanh(self.a(x))
        y = self.b(h)
        return y + self.extra(h) if use_extra else y


def batch(rank: int, step: int, micro: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * rank + 10 * step + micro)
    return torch.randn(4, 6, generator=g)


def uses_extra(rank: int, step: int) -> bool:
    return (rank + step) % 3 == 0


def backward(model: Net, rank: int, step: int, passes: int) -> None:
    for micro in range(passes):
        out = model(batch(rank, step, micro), uses_extra(rank, step))
        (out.pow(2).mean() + 0.1 * out.sum()).backward()


def run(
    make_opt: Callable[[List[torch.nn.Parameter]], torch.optim.Optimizer],
    label: str,
    passes: int,
    process_set: Any = None,
) -> None:
    """``process_set``: Adasum among its members only; a rank outside it trains alone."""
    rank, size = hvd.rank(), hvd.size()
    group = list(range(size)) if process_set is None else process_set.ranks
    if rank not in group:
        group = [rank]
    torch.manual_seed(7)
    init = Net()
    sims = [copy.deepcopy(init) for _ in group]
    sim_opts = [make_opt(list(m.parameters())) for m in sims]
    model = copy.deepcopy(init)
    opt = hvd.DistributedOptimizer(
        make_opt(list(model.parameters())),
        named_parameters=model.named_parameters(),
        op=hvd.Adasum,
        backward_passes_per_step=passes,
        process_set=process_set,
    )
    avg_model = copy.deepcopy(init)  # what plain gradient averaging would give
    avg_opt = make_opt(list(avg_model.parameters()))
    worst = 0.0
    for step in range(4):
        # The simulated ranks: local steps from the common start, updates combined.
        starts = [p.detach().clone() for p in sims[0].parameters()]
        deltas: List[List[np.ndarray]] = []
        for r, m, o in zip(group, sims, sim_opts):
            o.zero_grad()
            backward(m, r, step, passes)
            o.step()
            with torch.no_grad():
                deltas.append([(p - s).numpy().copy() for p, s in zip(m.parameters(), starts)])
        with torch.no_grad():
            for i, s in enumerate(starts):
                combined = torch.from_numpy(adasum([d[i] for d in deltas]))
                for m in sims:
                    list(m.parameters())[i].copy_(s + combined)
        # The average, for contrast.
        avg_opt.zero_grad()
        for r in group:
            backward(avg_model, r, step, passes)
        with torch.no_grad():
            for p in avg_model.parameters():
                if p.grad is not None:
                    p.grad /= len(group)
        avg_opt.step()
        # The real thing.
        opt.zero_grad()
        before = [p.detach().clone() for p in model.parameters()]
        backward(model, rank, step, passes)  # the hooks step locally and start the deltas
        for p, b in zip(model.parameters(), before):  # but nothing moves before step()
            assert torch.equal(p, b), (label, step)
        opt.step()
        for (name, got), want in zip(model.named_parameters(), sims[0].parameters()):
            err = float((got - want).detach().abs().max())
            worst = max(worst, err)
            scale = float(want.abs().max())
            assert err <= 1e-6 * max(1.0, scale), (label, step, name, err)
    far = max(
        float((p - q).detach().abs().max())
        for p, q in zip(model.parameters(), avg_model.parameters())
    )
    if len(group) > 1:
        assert far > 1e-4, (label, "Adasum gave the same as averaging", far)
    print(
        f"rank {rank} {label} matches the reference: max difference {worst:.3g} "
        f"(vs averaging: {far:.3g})",
        flush=True,
    )


def main() -> None:
    passes = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    hvd.init()
    run(lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), "sgd", passes)
    run(lambda ps: torch.optim.Adam(ps, lr=0.01), "adam", passes)
    if hvd.size() >= 3:  # among ranks 0 and 2 only; the others train alone
        subset = hvd.add_process_set([0, 2])
        run(lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), "sgd set [0, 2]", passes, subset)
    # Horovod's rules for this optimizer.
    model = Net()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters(),
        op=hvd.Adasum,
    )
    assert isinstance(opt, torch.optim.SGD)
    opt.synchronize()  # a no-op
    try:
        with opt.skip_synchronize():
            pass
    except AssertionError:
        pass
    else:
        raise AssertionError("skip_synchronize was accepted with Adasum")
    try:
        hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1),
            op=hvd.Adasum,
            gradient_predivide_factor=2.0,
        )
    except ValueError:
        pass
    else:
        raise AssertionError("gradient_predivide_factor was accepted with Adasum")
    print(f"rank {hvd.rank()} ADASUM OPTIMIZER OK", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
