"""A torch model that spends a GPU's compute time asleep.

Every layer of a :class:`~benchmarks.emulator.models.ModelSpec` becomes a module with the
layer's real parameter tensors. Its forward pass is one autograd Function that sleeps for the
layer's forward time; the Function's backward sleeps for the layer's backward time and returns
a deterministic gradient for every parameter (a constant per tensor and rank). So DDP's
reducer hooks, fastps's gradient hooks and forward pre-hooks see exactly what a real model
of that shape produces, in the same order and with the same timing, while the process uses
almost no CPU: with ``zero_grad(set_to_none=False)`` the gradients live in the same tensors
every step (zeroed, then the constant added), so no memory is allocated or faulted in per
step.

A one-element tensor carries the autograd chain from layer to layer.

``sparse_embedding=True`` (BERT): the word embedding's gradient is a sparse COO tensor
holding only the rows one batch of Zipf-distributed tokens touches (``models.sample_rows``;
~1,790 of 30,522 rows, 5.5 MB instead of 94 MB), as ``nn.Embedding(sparse=True)`` gives.
The table then sits in a layer of its own that takes no compute time, an
``nn.Embedding(sparse=True)`` (so DDP expects a sparse gradient for it); each rank cycles
through a few precomputed row sets, so nothing is sampled per step.
"""

from __future__ import annotations

import time
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch

from .models import BERT_CLS, SPARSE_PARAM, ModelSpec, layer_times, sample_rows, update_time

SPARSE_SETS = 4  # distinct row sets each rank cycles through


class _Clock:
    """The emulated GPU's timeline: when its queued work is done (``perf_counter`` time).

    A GPU runs a pass's kernels back to back while the host thread that launched them runs
    ahead, so the host's own time between layers (autograd, the gradient hooks of DDP or
    fastps, a late wake-up on a busy machine) does not stretch the pass. Here the host cannot
    run ahead: each layer's gradient must exist when autograd's hooks see it, so the thread
    sleeps until the layer's end on this timeline. Each layer starts where the previous one
    ended (``spend``), not where the host got to, so host time between layers and every
    sleep's overshoot are absorbed as a GPU would absorb them. Only a real dependency moves
    the timeline to the host's clock (``sync``): the start of a forward pass (the step before
    it may have waited for sums) and a layer whose forward pre-hooks blocked (cross-barrier
    waiting for that layer's update; applying it counts too, which a GPU would do in a
    fraction of the time). If the host falls behind the timeline for good, layers stop
    sleeping and the pass takes the host's time, as an overloaded host would on a GPU.

    The optimizer's update is GPU work too: its host time here (torch's SGD over the real
    parameters on the busy 2 cores, per layer with cross-barrier updates) is taken out of
    every ``sync``, and what a V100 would take for it (``models.update_time``) is added to
    the timeline once per pass. ``count_updates`` says where the host's update time is
    counted."""

    # Forward pre-hooks that took longer than this waited for something (or did real work)
    HOOK_WAIT_S = 2.5e-4

    def __init__(self) -> None:
        self.device_t = 0.0
        self.called_at: Optional[float] = None  # when EmulatedModel called the layer
        self.stepped_s = 0.0  # host seconds in synchronous optimizer steps (the caller adds)
        self._updates: Callable[[], float] = lambda: self.stepped_s
        self._seen = 0.0

    def count_updates(self, total_s: Optional[Callable[[], float]] = None) -> None:
        """From now on the host's update time is ``total_s()`` (a running total, e.g. the
        cross-barrier's ``update_s``); None: ``stepped_s``."""
        self._updates = total_s if total_s is not None else (lambda: self.stepped_s)
        self._seen = self._updates()

    def _host_updates(self) -> float:
        """Host seconds spent on updates since the last call."""
        total = self._updates()
        spent, self._seen = total - self._seen, total
        return max(0.0, spent)

    def sync(self, now: float) -> None:
        if now > self.device_t:
            self.device_t = now

    def start_pass(self, update_s: float) -> None:
        """A forward pass starts: on the host's clock less the host's update time since the
        last layer, then the GPU runs the optimizer's update (``update_s``)."""
        self.sync(time.perf_counter() - self._host_updates())
        self.device_t += update_s

    def spend(self, seconds: float) -> None:
        self.device_t += seconds
        wait = self.device_t - time.perf_counter()
        if wait > 0:
            time.sleep(wait)

    def before_forward(self) -> None:
        """In a layer's forward, after every forward pre-hook ran."""
        now = time.perf_counter() - self._host_updates()
        called = self.called_at
        self.called_at = None
        if called is None or now - called > self.HOOK_WAIT_S:
            self.sync(now)


CLOCK = _Clock()


class _Sleep(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        layer: EmulatedLayer,  # type: ignore[override]
        *params: torch.Tensor,
    ) -> torch.Tensor:
        ctx.layer = layer
        CLOCK.before_forward()
        CLOCK.spend(layer.forward_s)
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Any, ...]:  # type: ignore[override]
        layer: EmulatedLayer = ctx.layer
        CLOCK.spend(layer.backward_s)
        if layer.sparse_grads is not None:
            layer.turn = (layer.turn + 1) % len(layer.sparse_grads)
            return (grad, None, layer.sparse_grads[layer.turn])
        # A constant seen through a stride-0 view: autograd adds it into the existing
        # .grad (zero_grad(set_to_none=False)) without allocating a tensor per step.
        grads = [v.expand(p.shape) for p, v in zip(layer.param_list, layer.grad_scalars)]
        return (grad, None, *grads)


class EmulatedLayer(torch.nn.Module):
    def __init__(
        self,
        params: Sequence[Tuple[str, Tuple[int, ...]]],
        forward_s: float,
        backward_s: float,
        grad_values: Sequence[float],
    ) -> None:
        super().__init__()
        for name, shape in params:
            # zeros: every rank starts alike without a broadcast; pages are touched lazily
            self.register_parameter(name, torch.nn.Parameter(torch.zeros(shape)))
        self.param_list: List[torch.nn.Parameter] = [getattr(self, n) for n, _ in params]
        self.forward_s = forward_s
        self.backward_s = backward_s
        self.grad_values = list(grad_values)
        self.grad_scalars = [torch.tensor(v) for v in grad_values]
        self.sparse_grads: Optional[List[torch.Tensor]] = None

    def probe(self) -> List[float]:
        """One element of each parameter that every step updates (the last one)."""
        return [float(p.detach().reshape(-1)[-1]) for p in self.param_list]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Sleep.apply(x, self, *self.param_list)


class EmulatedTable(torch.nn.Embedding):
    """A word embedding whose gradient is sparse: the rows one batch of Zipf-distributed
    tokens uses (``models.sample_rows``), a constant per rank. No compute time (a lookup)."""

    def __init__(self, shape: Tuple[int, ...], grad_value: float, seed: int) -> None:
        super().__init__(shape[0], shape[1], sparse=True, _weight=torch.zeros(shape))
        self.param_list: List[torch.nn.Parameter] = [self.weight]
        self.forward_s = self.backward_s = 0.0
        self.grad_values = [grad_value]
        self.turn = 0
        self.sparse_grads: Optional[List[torch.Tensor]] = []
        for i in range(SPARSE_SETS):
            rows = torch.from_numpy(sample_rows(seed * SPARSE_SETS + i))
            values = torch.full((len(rows), shape[1]), float(grad_value))
            self.sparse_grads.append(
                torch.sparse_coo_tensor(rows[None], values, shape, check_invariants=True).coalesce()
            )

    def probe(self) -> List[float]:
        """The last element of the [CLS] row, which every batch uses."""
        return [float(self.weight.detach()[BERT_CLS, -1])]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return _Sleep.apply(x, self, self.weight)


class EmulatedModel(torch.nn.Module):
    """The layers of ``spec`` in forward order; compute per iteration ``iteration_s``."""

    def __init__(
        self, spec: ModelSpec, iteration_s: float, rank: int, sparse_embedding: bool = False
    ) -> None:
        super().__init__()
        self.spec = spec
        self.layers = torch.nn.ModuleDict()
        for i, (layer, (fwd, bwd)) in enumerate(zip(spec.layers, layer_times(spec, iteration_s))):
            # small, exactly representable, different per rank and tensor
            values = [(rank + 1) * (1 + (i + j) % 7) / 1024.0 for j in range(len(layer.params))]
            key = layer.name.replace(".", "_")
            params = list(layer.params)
            if sparse_embedding and params[0][0] == SPARSE_PARAM:
                # the table first, in a layer of its own (no compute: a lookup)
                self.layers[f"{key}_{SPARSE_PARAM}"] = EmulatedTable(
                    params[0][1], values[0], seed=1000 * (rank + 1)
                )
                params, values = params[1:], values[1:]
            self.layers[key] = EmulatedLayer(params, fwd, bwd, values)
        if sparse_embedding and not any(isinstance(m, EmulatedTable) for m in self.layers.values()):
            raise ValueError(f"{spec.name} has no {SPARSE_PARAM} to give a sparse gradient")
        # the GPU's time for one update: every dense parameter, the rows a sparse one uses
        numel = 0.0
        for layer in self.layers.values():
            if isinstance(layer, EmulatedTable) and layer.sparse_grads:
                numel += layer.sparse_grads[0].values().numel()
            else:
                numel += sum(p.numel() for p in layer.param_list)
        self.update_s = update_time(numel, iteration_s, spec)

    def probes(self) -> List[float]:
        """``EmulatedLayer.probe`` of every parameter, in ``parameters()`` order."""
        return [v for layer in self.layers.values() for v in layer.probe()]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        CLOCK.start_pass(self.update_s)  # a pass starts on the host's clock
        for layer in self.layers.values():
            CLOCK.called_at = time.perf_counter()  # pre-hooks from here to _Sleep.forward
            x = layer(x)
        return x


def expected_update(spec: ModelSpec, world: int, lr: float, steps: int) -> List[float]:
    """Every tensor's value after ``steps`` plain-SGD steps on the averaged gradients (all
    parameters start at zero): a check that every system really averaged and applied them."""
    out: List[float] = []
    for i, layer in enumerate(spec.layers):
        for j in range(len(layer.params)):
            mean = sum((r + 1) * (1 + (i + j) % 7) / 1024.0 for r in range(world)) / world
            out.append(-lr * mean * steps)
    return out
