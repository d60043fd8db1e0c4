"""Sufficient-factor broadcasting for ``nn.Linear`` weights (Poseidon, ATC'17 §3.2).

The weight gradient of ``y = x W^T + b`` over a step is ``G^T X``: G holds the rows of the
output gradient, X the rows of the input (every leading dimension flattened: batch,
sequence positions, repeated calls, accumulated backward passes). A forward hook keeps X
(the tensor autograd saves anyway) and a hook on the output keeps G; when the weight's
gradient is complete the rows ``[G | X]`` are allgathered through the core and every
worker rebuilds the summed gradient as one product ``G_all^T X_all`` into ``param.grad``.
Biases and every other parameter keep the servers.

Which layers do so is chosen once, by rank 0's first forward pass and the cost model in
``fastps.sfb`` (FASTPS_SFB=auto|on|off), and broadcast so that every rank agrees; the
decision for each layer is printed by rank 0. The exchange is an ordinary plugin ``Handle``
of the optimizer's entry, so ``synchronize()``, ``step()`` and cross-barrier updates wait
for it like for any gradient.

The rebuilt gradient equals the dense one only if the weight's gradient comes from its
module's forward calls alone. Weights shared with another module are left on the servers;
the first exchange of each layer compares the local factors with the local gradient, and a
difference (a loss term on the weight, a weight used outside its module) is an error that
names the layer.
"""

from __future__ import annotations

import sys
import time
import weakref
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
from fastps.collectives import ops as _collectives
from fastps.collectives import sfb as _cost
from fastps.errors import FastPSError
from fastps.torch.ops import Handle, _allgather_op
from fastps.worker import api as _api

__all__ = ["SufficientFactors"]

SFB_PREFIX = "sfb."

_TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4}


class _Layer:
    """One ``nn.Linear`` that may send its weight gradient as factors."""

    __slots__ = ("name", "module", "weight", "pairs", "rows_seen", "chosen", "checked", "hook")

    def __init__(self, name: str, module: torch.nn.Linear) -> None:
        self.name = name  # the weight's gradient name (the optimizer's, without "grad.")
        self.module = module
        self.weight = module.weight
        # [input rows, output-gradient rows or None] per forward call since the last
        # exchange; the gradient arrives in the backward pass.
        self.pairs: List[List[Optional[torch.Tensor]]] = []
        self.rows_seen = 0
        self.chosen = False
        self.checked = False
        self.hook: Any = None


class SufficientFactors:
    """The factor capture and exchange of one ``DistributedOptimizer``."""

    def __init__(
        self,
        model: torch.nn.Module,
        names: Dict[int, str],
        how: str,
        process_set: Any,
        direct: bool,
        passes_per_step: int,
        why_not: Optional[str] = None,
    ) -> None:
        """``names``: parameter id -> gradient name, for the parameters the optimizer
        synchronises. ``why_not``: a reason the whole optimizer cannot use factors
        (compression, elastic), printed instead of choosing."""
        if not isinstance(model, torch.nn.Module):
            raise TypeError(
                f"DistributedOptimizer(model=...): expected a torch.nn.Module, got "
                f"{type(model).__name__}"
            )
        self.how = how
        self.process_set = process_set
        self.direct = direct  # the global set: core broadcast and allgather by name
        self.passes_per_step = passes_per_step
        self.layers: List[_Layer] = []
        self.by_param: Dict[int, _Layer] = {}
        self.skipped: List[str] = []
        self.decided = False
        self.rebuild_s = 0.0  # time spent rebuilding gradients from factors (a statistic)
        if why_not is not None:
            self.skipped.append(f"all layers use the servers: {why_not}")
        uses: Dict[int, int] = {}
        for _, m in model.named_modules(remove_duplicate=False):
            for p in m.parameters(recurse=False):
                uses[id(p)] = uses.get(id(p), 0) + 1
        seen: set = set()
        for mname, m in model.named_modules():
            if not isinstance(m, torch.nn.Linear) or id(m) in seen:
                continue
            seen.add(id(m))
            w = m.weight
            name = names.get(id(w))
            label = mname or type(m).__name__
            if name is None or not w.requires_grad:
                continue  # not synchronised by this optimizer
            if type(m).forward is not torch.nn.Linear.forward:
                self.skipped.append(f"{label}: servers ({type(m).__name__} overrides forward)")
            elif uses.get(id(w), 0) > 1:
                self.skipped.append(f"{label}: servers (weight shared with another module)")
            elif w.layout != torch.strided or w.dtype not in (torch.float32, torch.float64):
                self.skipped.append(f"{label}: servers (weight dtype {w.dtype})")
            elif why_not is None:
                layer = _Layer(name, m)
                self.layers.append(layer)
                self.by_param[id(w)] = layer
        ref = weakref.ref(self)
        for layer in self.layers:
            layer.hook = layer.module.register_forward_hook(_forward_hook(ref, layer))

    # ---------------------------------------------------------------- capture

    def _captured(self, layer: _Layer, inputs: Tuple[Any, ...], output: Any) -> None:
        if not (torch.is_grad_enabled() and layer.module.training):
            return
        if not isinstance(output, torch.Tensor) or not output.requires_grad:
            return
        x = inputs[0].detach()
        pair: List[Optional[torch.Tensor]] = [x.reshape(-1, x.shape[-1]), None]
        layer.pairs.append(pair)
        layer.rows_seen += pair[0].shape[0]  # type: ignore[union-attr]
        rows = layer.weight.shape[0]

        def keep_grad(g: torch.Tensor) -> None:
            pair[1] = g.detach().reshape(-1, rows)

        output.register_hook(keep_grad)

    # ---------------------------------------------------------------- decision

    def decide(self, sync_id: int) -> None:
        """Collective (every rank of the set, at its first gradient): rank 0 of the set
        chooses from its own first forward pass, everyone adopts its choice."""
        if self.decided:
            return
        self.decided = True
        ps = self.process_set
        root = ps.ranks[0]
        if not self.layers:
            if _api.rank() == root:
                for line in _cost.report([], self.how, self.skipped):
                    print(line, file=sys.stderr, flush=True)
            return
        workers = ps.size()
        costs = [
            _cost.LayerCost(
                layer.name,
                int(layer.weight.shape[0]),
                int(layer.weight.shape[1]),
                layer.rows_seen * self.passes_per_step,
                workers,
                layer.weight.element_size(),
            )
            for layer in self.layers
        ]
        mine = np.array(
            [int(c.batch > 0 and c.use_factors(self.how)) for c in costs], dtype=np.int64
        )
        name = f"fastps.sfb.{sync_id}"
        if self.direct:
            agreed = _api.broadcast(mine, root, name=name)
        else:
            agreed = _collectives.broadcast_async(mine, "int64", root, name, ps).synchronize()
        for layer, flag in zip(self.layers, agreed):
            layer.chosen = bool(flag)
        if _api.rank() == root:
            for line in _cost.report(costs, self.how, self.skipped):
                print(line, file=sys.stderr, flush=True)
        for layer in self.layers:
            if not layer.chosen:
                self._release(layer)

    def chosen(self, param: torch.Tensor) -> bool:
        layer = self.by_param.get(id(param))
        return layer is not None and layer.chosen

    def chosen_names(self) -> List[str]:
        return [layer.name for layer in self.layers if layer.chosen]

    # ---------------------------------------------------------------- exchange

    def start(self, param: torch.Tensor, scale: float) -> Handle:
        """Starts the allgather of the weight's factors rows; the handle's finish writes
        ``scale`` times the rebuilt sum into ``param.grad``."""
        layer = self.by_param[id(param)]
        pairs: List[Tuple[torch.Tensor, torch.Tensor]] = [
            (x, g) for x, g in layer.pairs if x is not None and g is not None
        ]
        layer.pairs = []
        rows, cols = param.shape
        if pairs:
            grads = torch.cat([g for _, g in pairs]).to(param.dtype)
            inputs = torch.cat([x for x, _ in pairs]).to(param.dtype)
            factors = torch.cat([grads, inputs], dim=1)
        else:  # no forward reached the loss on this rank: no rows to add
            factors = torch.zeros((0, rows + cols), dtype=param.dtype, device=param.device)
        if not layer.checked:
            layer.checked = True
            self._check_local(layer, param, factors)
        ps = None if self.direct else self.process_set
        inner = _allgather_op(factors.contiguous(), SFB_PREFIX + layer.name, ps)

        def finish() -> torch.Tensor:
            gathered = inner.synchronize()
            started = time.perf_counter()
            summed = gathered[:, :rows].t().matmul(gathered[:, rows:])
            if scale != 1.0:
                summed.mul_(scale)
            summed = summed.to(param.device)
            if param.grad is None:
                param.grad = summed
            else:
                param.grad.copy_(summed)
            self.rebuild_s += time.perf_counter() - started
            return param.grad

        return Handle(SFB_PREFIX + layer.name, [inner], finish)

    def _check_local(self, layer: _Layer, param: torch.Tensor, factors: torch.Tensor) -> None:
        """The local factors must rebuild the local gradient, or the exchanged sum would
        differ from the dense one."""
        rows = param.shape[0]
        local = factors[:, :rows].t().matmul(factors[:, rows:])
        grad = param.grad
        if grad is None:
            grad = torch.zeros_like(param)
        tol = _TOLERANCE.get(param.dtype, 1e-3)
        scale = max(1.0, float(grad.abs().max()) if grad.numel() else 1.0)
        if grad.layout != torch.strided or not torch.allclose(
            local.to(grad.device), grad, rtol=tol, atol=tol * scale
        ):
            raise FastPSError(
                f"FASTPS_SFB: the gradient of '{layer.name}' is not the product of its "
                "nn.Linear's inputs and output gradients on rank "
                f"{_api.rank()} (the weight is used outside the module's forward, or a "
                "loss term or hook changes its gradient); set FASTPS_SFB=off or exclude "
                "the layer"
            )

    def drop_pending(self) -> None:
        """Forgets captured rows (elastic reset: the step they belong to is gone)."""
        for layer in self.layers:
            layer.pairs = []

    def _release(self, layer: _Layer) -> None:
        if layer.hook is not None:
            layer.hook.remove()
            layer.hook = None
        layer.pairs = []

    def close(self) -> None:
        for layer in self.layers:
            self._release(layer)


def _forward_hook(ref: weakref.ReferenceType[SufficientFactors], layer: _Layer) -> Any:
    def hook(module: torch.nn.Module, inputs: Tuple[Any, ...], output: Any) -> None:
        me = ref()
        if me is not None:
            me._captured(layer, inputs, output)

    return hook
