"""The algorithm API (plugins/torch/algorithms/base.py, docs/guide/algorithms.md) on 2 real
workers (``fastpsrun``), over TCP and over shared memory:

* the guide's worked example, ``KeepLocal`` (every gradient averaged except the named
  parameters', which each worker keeps to itself), trains to the parameters of a one-process
  reference of both workers (float64): the averaged parameters equal on both ranks, the
  local ones different and each equal to its own worker's reference;
* tensor fusion follows what the algorithm averages: one bucket a round once the set is
  known, and a round averaging another set (a layer kept local every other round) replaces
  the plan without a hang or a wrong sum;
* the hooks run in the documented order, once per round (before_backward, one on_gradient
  per parameter, after_backward, after_step), and an algorithm that averages through
  ``ctx.push_pull`` into buffers of its own, plus ``ctx.allreduce`` in ``after_step``, gives
  the parameters of the built-in averaging;
* ``GradientAveraging()`` is today's path (no runner), and bad input is refused naming the
  culprit: not an Algorithm, an unknown server rule, compression given twice, a parameter
  name the algorithm does not know.

This file is also the worker: ``python test_algorithms.py worker``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Dict, List, Set

import pytest

HERE = Path(__file__).resolve().parent
PATHS = {"tcp": {"FASTPS_SHM": "0"}, "shm": {"FASTPS_SHM": "1"}}


# ---------------------------------------------------------------- the worked example


def keep_local_class() -> Any:
    from fastps.torch.algorithms import Algorithm, Context, Param

    class KeepLocal(Algorithm):
        """Averages every gradient except those of the parameters named in ``local``,
        which each worker keeps to itself (e.g. a per-worker head)."""

        def __init__(self, local: Set[str]) -> None:
            self.local = set(local)

        def setup(self, ctx: Context) -> None:
            super().setup(ctx)
            unknown = self.local - {p.name for p in ctx.params}
            if unknown:
                raise ValueError(f"KeepLocal: no parameter named {sorted(unknown)}")

        def on_gradient(self, p: Param) -> None:
            if p.name not in self.local:
                self.ctx.average(p)

    return KeepLocal


# ---------------------------------------------------------------- the worker


def _model() -> Any:
    import torch

    torch.manual_seed(3)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3)
    ).double()


def _batch(rank: int, step: int) -> Any:
    import torch

    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(8, 6, generator=g, dtype=torch.float64), torch.randint(
        0, 3, (8,), generator=g
    )


def _reference_step(refs: List[Any], step: int, local: Set[str]) -> None:
    """One SGD step (lr 0.1) of every worker's model in this process: the parameters named
    in ``local`` on their own worker's gradient, the others on the mean gradient."""
    import torch
    import torch.nn.functional as F

    grads: List[Dict[str, Any]] = []
    for r, ref in enumerate(refs):
        ref.zero_grad()
        xr, yr = _batch(r, step)
        F.cross_entropy(ref(xr), yr).backward()
        grads.append({n: p.grad.clone() for n, p in ref.named_parameters()})
    with torch.no_grad():
        for r, ref in enumerate(refs):
            for n, p in ref.named_parameters():
                g = grads[r][n] if n in local else sum(gr[n] for gr in grads) / len(refs)
                p.add_(g, alpha=-0.1)


def check_worked_example(rank: int, size: int) -> None:
    import fastps.torch as hvd
    import torch
    import torch.nn.functional as F

    local = {"2.weight", "2.bias"}
    model = _model()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters(),
        algorithm=keep_local_class()(local),
    )
    # The reference: every worker's model in this process, shared parameters stepped on
    # the mean gradient, local ones on their own worker's.
    refs = [_model() for _ in range(size)]
    for step in range(4):
        opt.zero_grad()
        x, y = _batch(rank, step)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        _reference_step(refs, step, local)
    mine = dict(model.named_parameters())
    gathered = {n: hvd.allgather(p.detach().unsqueeze(0), name=f"ex.{n}") for n, p in mine.items()}
    for n, p in mine.items():
        torch.testing.assert_close(
            p.detach(), dict(refs[rank].named_parameters())[n].detach(), rtol=1e-12, atol=1e-12
        )
        same = bool(torch.equal(gathered[n][0], gathered[n][1]))
        assert same == (n not in local), (n, same)
    print(f"rank {rank} ALGO OK worked-example", flush=True)


def check_fusion_follows_averaged(rank: int, size: int) -> None:
    """Tensor fusion under an algorithm: the gradients it averages through ``ctx.average``
    travel fused from its second round on, and a round that averages another set (here,
    the output layer kept local every other round) replaces the plan without a hang and
    without touching the sums (float64 reference)."""
    import fastps.torch as hvd
    import torch
    import torch.nn.functional as F
    from fastps.torch.algorithms import Algorithm, Param
    from fastps.worker import api

    head = {"2.weight", "2.bias"}

    class Alternate(Algorithm):
        def __init__(self, alternate: bool) -> None:
            self.alternate = alternate

        def on_gradient(self, p: Param) -> None:
            if not (self.alternate and self.ctx.step % 2 == 1 and p.name in head):
                self.ctx.average(p)

    def pushes() -> int:  # parts this worker handed on, whichever path took them
        st = api.data_path_stats()
        keys = ("pushed_shm", "pushed_socket", "reduced_locally", "contributed_shm")
        return sum(int(st[k]) for k in keys + ("contributed_socket",))

    for alternate in (False, True):
        model = _model()
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1),
            named_parameters=model.named_parameters(),
            algorithm=Alternate(alternate),
        )
        refs = [_model() for _ in range(size)]
        counts = []
        for step in range(6):
            before = pushes()
            opt.zero_grad()
            x, y = _batch(rank, step)
            F.cross_entropy(model(x), y).backward()
            opt.step()
            counts.append(pushes() - before)
            _reference_step(refs, step, head if alternate and step % 2 == 1 else set())
        for n, q in model.named_parameters():
            torch.testing.assert_close(
                q.detach(), dict(refs[rank].named_parameters())[n].detach(), rtol=1e-12, atol=1e-12
            )
        if not alternate:
            # Four gradients pushed alone in the first round, one bucket after.
            assert counts[0] == 4 and max(counts[1:]) == 1, counts
        else:
            # Odd rounds: two of the four, so the plan of all four is replaced (its bucket
            # pushed half zeros); even rounds: the two-member plan's bucket and two alone.
            assert counts == [4, 1, 3, 1, 3, 1], counts
    print(f"rank {rank} ALGO OK fusion", flush=True)


def check_hooks_and_push_pull(rank: int, size: int) -> None:
    import fastps.torch as hvd
    import torch
    import torch.nn.functional as F
    from fastps.torch.algorithms import Algorithm, Param

    calls: List[str] = []

    class ViaPushPull(Algorithm):
        """Averaging through ctx.push_pull into buffers of its own, recording the hooks."""

        def setup(self, ctx: Any) -> None:
            super().setup(ctx)
            self.bufs: Dict[int, torch.Tensor] = {}
            self.workers = 0.0

        def before_backward(self) -> None:
            calls.append("before_backward")

        def on_gradient(self, p: Param) -> None:
            calls.append("on_gradient")
            buf = self.bufs.setdefault(p.index, torch.empty_like(p.tensor))
            buf.copy_(p.tensor.grad)
            self.ctx.push_pull(p, buf, "viapp")

        def after_backward(self) -> None:
            calls.append("after_backward")
            for p in self.ctx.params:
                p.tensor.grad.copy_(self.bufs[p.index])

        def after_step(self) -> None:
            calls.append("after_step")
            ones = torch.ones(1, dtype=torch.float64)
            self.workers = float(
                self.ctx.allreduce(ones, f"viapp.count.{self.ctx.step}", average=False)
            )

    def run(algorithm: Any) -> Dict[str, torch.Tensor]:
        model = _model()
        opt = hvd.DistributedOptimizer(
            torch.optim.Adam(model.parameters(), lr=0.01),
            named_parameters=[(f"{tag}.{n}", p) for n, p in model.named_parameters()],
            algorithm=algorithm,
        )
        for step in range(3):
            opt.zero_grad()
            x, y = _batch(rank, step)
            F.cross_entropy(model(x), y).backward()
            opt.step()
        if algorithm is not None:
            assert (opt._fastps.runner is None) == (type(algorithm).__name__ == "GradientAveraging")
        return {n: p.detach().clone() for n, p in model.named_parameters()}

    tag = "builtin"
    from fastps.torch.algorithms import GradientAveraging

    builtin = run(GradientAveraging())
    tag = "custom"
    algo = ViaPushPull()
    custom = run(algo)
    n = len(builtin)
    round_calls = ["before_backward"] + ["on_gradient"] * n + ["after_backward", "after_step"]
    assert calls == round_calls * 3, calls
    assert algo.workers == size, algo.workers
    for name in builtin:
        torch.testing.assert_close(custom[name], builtin[name], rtol=1e-12, atol=1e-12)
    print(f"rank {rank} ALGO OK hooks-push-pull", flush=True)


def check_refusals(rank: int) -> None:
    import fastps
    import fastps.torch as hvd
    import torch
    from fastps.torch.algorithms import Algorithm, GradientAveraging, ServerRule

    def refused(exc: type, needle: str, **kwargs: Any) -> None:
        model = _model()
        with pytest.raises(exc) as info:
            hvd.DistributedOptimizer(
                torch.optim.SGD(model.parameters(), lr=0.1),
                named_parameters=model.named_parameters(),
                **kwargs,
            )
        assert needle in str(info.value), (needle, str(info.value))

    class OuterAdam(Algorithm):
        def server_rule(self) -> ServerRule:
            return ServerRule("outer_adam", {"lr": 0.7})

    refused(TypeError, "got str", algorithm="onebit")
    refused(ValueError, "server rule 'outer_adam' is not available", algorithm=OuterAdam())
    refused(
        ValueError,
        "name two compressors",
        algorithm=GradientAveraging(fastps.Compression.onebit(error_feedback=True)),
        compression=hvd.Compression.fp16,
    )
    refused(
        ValueError,
        "decides what it compresses",
        algorithm=OuterAdam.__base__(),
        compression=hvd.Compression.fp16,
    )
    refused(
        ValueError,
        "no parameter named ['head.weight']",
        algorithm=keep_local_class()({"head.weight"}),
    )
    print(f"rank {rank} ALGO OK refusals", flush=True)


def worker() -> int:
    import fastps.torch as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    check_worked_example(rank, size)
    check_fusion_follows_averaged(rank, size)
    check_hooks_and_push_pull(rank, size)
    check_refusals(rank)
    hvd.shutdown()
    return 0


# ---------------------------------------------------------------- the test


@pytest.mark.parametrize("path", sorted(PATHS))
def test_algorithm_api(subprocess_env: Dict[str, str], path: str) -> None:
    from torchjobs import fastpsrun, lines_of

    env = dict(subprocess_env, **PATHS[path])
    res = fastpsrun(Path(__file__), "worker", env=env, timeout=240)
    assert res.returncode == 0, res.stdout[-6000:]
    for what in ("worked-example", "fusion", "hooks-push-pull", "refusals"):
        assert len(lines_of(res.stdout, f"ALGO OK {what}")) == 2, (what, res.stdout[-6000:])


if __name__ == "__main__":
    if sys.argv[1:] == ["worker"]:
        sys.exit(worker())
    sys.exit(f"usage: {sys.argv[0]} worker")
