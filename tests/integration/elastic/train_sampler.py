"""An elastic training run over a dataset read through ``ElasticSampler`` (Horovod's
pattern: ``record_batch`` after each step, a commit after each step and each epoch).

Least squares on ``ROWS`` fixed rows, ``PER_RANK`` rows per worker and step, ``EPOCHS``
epochs, float64. ``reference(size)`` runs the same steps in one process, reading each
step's rows from every rank's shard as an undisturbed world of ``size`` workers does, so
a run whose ranks kept their shards (a spare that took a lost rank in place) must end
with its parameters.

Environment: ``FAIL_AT`` (``slot@step``: that worker SIGKILLs itself inside a gradient
hook of that global step), ``RESULT`` (rank 0 writes the final parameters, JSON).
Each worker prints ``RESTORE slot=...`` when its state is restored and ``RESET slot=...``
in its reset callback.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import torch

ROWS = 72
PER_RANK = 4
EPOCHS = 2
FEATURES = 5


def data():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(ROWS, FEATURES, generator=g, dtype=torch.float64)
    w = torch.arange(1, FEATURES + 1, dtype=torch.float64).unsqueeze(1)
    return x, x @ w + 0.1 * torch.randn(ROWS, 1, generator=g, dtype=torch.float64)


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(FEATURES, 1).double()


def make_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.5)


def reference(size: int) -> list:
    """The undisturbed run of ``size`` workers, in one process."""
    from fastps.torch.elastic import ElasticSampler

    x, y = data()
    model = make_model()
    opt = make_optimizer(model)
    samplers = []
    for r in range(size):
        s = ElasticSampler(range(ROWS), seed=3)
        s.num_replicas, s.rank = size, r
        samplers.append(s)
    for epoch in range(EPOCHS):
        for s in samplers:
            s.set_epoch(epoch)
        shards = [list(s) for s in samplers]
        for b in range(len(shards[0]) // PER_RANK):
            opt.zero_grad()
            loss = sum(
                ((model(x[idx]) - y[idx]) ** 2).mean()
                for idx in (sh[b * PER_RANK : (b + 1) * PER_RANK] for sh in shards)
            )
            (loss / size).backward()
            opt.step()
    return [p.detach().flatten().tolist() for p in model.parameters()]


def main() -> None:
    import fastps.torch as hvd

    me = os.environ.get("FASTPS_ELASTIC_ID", "")
    fail = {}
    for item in filter(None, os.environ.get("FAIL_AT", "").split(",")):
        slot, step = item.split("@")
        if slot == me:
            fail[int(step)] = True

    hvd.init()
    x, y = data()
    model = make_model()
    opt = hvd.DistributedOptimizer(make_optimizer(model), named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(range(ROWS), seed=3)
    loader = torch.utils.data.DataLoader(range(ROWS), batch_size=PER_RANK, sampler=sampler)
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=0, step=0)
    restore = state.restore

    def restore_and_say() -> None:
        print(f"RESTORE slot={me} step={state.step}", flush=True)
        restore()

    state.restore = restore_and_say
    state.register_reset_callbacks([lambda: print(f"RESET slot={me}", flush=True)])
    armed = [False]

    def hook(_grad):
        if armed[0]:
            print(f"KILL {me} step={state.step} t={time.time():.3f}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    model.weight.register_hook(hook)

    @hvd.elastic.run
    def train(state) -> None:
        while state.epoch < EPOCHS:
            for b, idx in enumerate(loader):
                armed[0] = fail.pop(state.step, False)
                opt.zero_grad()
                ((model(x[idx]) - y[idx]) ** 2).mean().backward()
                opt.step()
                sampler.record_batch(b, PER_RANK)
                state.step += 1
                if hvd.rank() == 0:
                    print(f"STEP {state.step} size={hvd.size()}", flush=True)
                state.commit()
            state.epoch += 1
            sampler.set_epoch(state.epoch)
            state.commit()

    train(state)
    if hvd.rank() == 0 and os.environ.get("RESULT"):
        with open(os.environ["RESULT"], "w") as f:
            json.dump({"params": [p.detach().flatten().tolist() for p in model.parameters()]}, f)
    hvd.shutdown()


if __name__ == "__main__":
    sys.exit(main())
