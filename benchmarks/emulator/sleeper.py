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
"""

from __future__ import annotations

import time
from typing import Any, List, Sequence, Tuple

import torch

from .models import ModelSpec, layer_times


class _Clock:
    """Sleeps for compute time. ``time.sleep`` overshoots (by ~0.1 ms idle, more on a busy
    machine); the overshoot is carried over and taken off the next sleeps, so a pass of
    hundreds of short layers still lasts what the layers add up to."""

    def __init__(self) -> None:
        self.carry = 0.0

    def spend(self, seconds: float) -> None:
        want = seconds - self.carry
        if want <= 0:
            self.carry = -want
            return
        t0 = time.perf_counter()
        time.sleep(want)
        self.carry = time.perf_counter() - t0 - want


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
        CLOCK.spend(layer.forward_s)
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Any, ...]:  # type: ignore[override]
        layer: EmulatedLayer = ctx.layer
        CLOCK.spend(layer.backward_s)
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Sleep.apply(x, self, *self.param_list)


class EmulatedModel(torch.nn.Module):
    """The layers of ``spec`` in forward order; compute per iteration ``iteration_s``."""

    def __init__(self, spec: ModelSpec, iteration_s: float, rank: int) -> None:
        super().__init__()
        self.spec = spec
        self.layers = torch.nn.ModuleDict()
        for i, (layer, (fwd, bwd)) in enumerate(zip(spec.layers, layer_times(spec, iteration_s))):
            # small, exactly representable, different per rank and tensor
            values = [(rank + 1) * (1 + (i + j) % 7) / 1024.0 for j in range(len(layer.params))]
            self.layers[layer.name.replace(".", "_")] = EmulatedLayer(
                layer.params, fwd, bwd, values
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers.values():
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
