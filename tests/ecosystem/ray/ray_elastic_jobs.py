"""The elastic training function the Ray tests ship to the worker actors: least squares on a
fixed stream of batches, one commit per step.

Every step's batch (12 rows) is split evenly over the current world (1, 2, 3, 4 or 6
workers) and the gradients are averaged, so each step applies the whole batch's gradient
whoever computes it: the final parameters equal a single-process run of the same steps
(:func:`reference`) whatever the world did, provided every step is applied exactly once to
the committed state (a rollback redoes the step it lost, and no more).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

BATCH = 12
FEATURES = 8


def _model() -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Linear(FEATURES, 1).double()


def _optimizer(model: Any) -> Any:
    import torch

    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def _batch(step: int) -> Tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(BATCH, FEATURES, generator=g, dtype=torch.float64)
    w = torch.arange(1, FEATURES + 1, dtype=torch.float64).unsqueeze(1) / FEATURES
    y = x @ w + 0.5 + 0.01 * torch.randn(BATCH, 1, generator=g, dtype=torch.float64)
    return x, y


def _params(model: Any) -> List[float]:
    return [v for p in model.parameters() for v in p.detach().flatten().tolist()]


def reference(steps: int) -> List[float]:
    """The same steps in one process, on the whole batch."""
    model = _model()
    opt = _optimizer(model)
    for step in range(steps):
        x, y = _batch(step)
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
    return _params(model)


def elastic_least_squares(steps: int, progress: str, step_sleep: float = 0.05) -> Dict[str, Any]:
    """Trains ``steps`` steps with ``hvd.elastic.run``; after each commit, appends
    ``rank size step`` to ``<progress>/<slot>`` (the test picks the actor to kill by it).
    Returns this worker's slot, rank, size, final parameters, the sizes it trained at and
    when (wall clock) it began, joined its first generation and finished."""
    entered = time.time()
    import fastps.torch as hvd

    hvd.init()
    joined = time.time()
    slot = os.environ["FASTPS_ELASTIC_ID"]
    model = _model()
    opt = hvd.DistributedOptimizer(_optimizer(model), named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, opt, step=0)
    sizes: List[int] = []
    log = Path(progress) / slot.replace(":", "_")

    @hvd.elastic.run
    def train(state: Any) -> None:
        while state.step < steps:
            n, r = hvd.size(), hvd.rank()
            if not sizes or sizes[-1] != n:
                sizes.append(n)
            x, y = _batch(state.step)
            rows = BATCH // n
            xs, ys = x[r * rows : (r + 1) * rows], y[r * rows : (r + 1) * rows]
            opt.zero_grad()
            ((model(xs) - ys) ** 2).mean().backward()
            opt.step()
            state.step += 1
            state.commit()
            with open(log, "a") as f:
                f.write(f"{r} {n} {state.step}\n")
            time.sleep(step_sleep)

    train(state)
    return {
        "slot": slot,
        "rank": hvd.rank(),
        "size": hvd.size(),
        "step": state.step,
        "params": _params(model),
        "sizes": sizes,
        "job": os.environ["FASTPS_JOB_ID"],
        "entered": entered,  # wall clock: when the actor began the function
        "joined": joined,  # when its first generation formed (hvd.init returned)
        "finished": time.time(),
    }
