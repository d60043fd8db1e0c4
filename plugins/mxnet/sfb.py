"""Sufficient-factor broadcasting for Gluon ``Dense`` weights (Poseidon, ATC'17 §3.2).

The weight gradient of a ``Dense`` layer (``y = act(x W^T + b)``) over a step is
``G^T X``: G holds the rows of the gradient of the pre-activation output, X the rows of
the input (``flatten=True``: one row per sample, the other input axes flattened;
``flatten=False``: one row per position of every leading axis), over every call of the
step. The layer's ``hybrid_forward`` is replaced on the instance by the same
``FullyConnected`` followed by an identity ``autograd.Function`` whose backward keeps G;
the input NDArray is kept as it is (no copy). When ``DistributedTrainer`` reduces the
gradients, the rows ``[G | X]`` of each chosen weight are allgathered through the
collective layer and every worker rebuilds the summed gradient as one product
``G_all^T X_all`` into the gradient array. Biases and every other parameter keep the
servers. The torch plugin does the same for ``nn.Linear`` (plugins/torch/sfb.py).

Which layers do so is chosen once, at the first step, by rank 0 of the trainer's process
set from the rows of its forward passes so far and the cost model in ``fastps.sfb``
(FASTPS_SFB=auto|on|off), and broadcast so that every rank agrees; rank 0 prints the
decision per layer.

Layers that stay on the servers, with the reason printed: a hybridized block (its cached
graph never calls ``hybrid_forward`` on NDArrays), a subclass that overrides
``hybrid_forward`` or ``forward``, a weight shared with another block, a weight with
``grad_req='add'`` (its gradient may hold earlier steps' terms), a dtype other than
float32/float64, numpy-array mode (``npx.set_np()``), and every layer when the trainer
compresses gradients, uses op=Adasum or async mode, or the job is elastic.

The rebuilt gradient equals the dense one only if the weight's gradient comes from its
block's forward calls alone: the first exchange of each layer compares the local factors
with the local gradient, and a difference (a loss term on the weight, the weight read
outside its block) is an error that names the layer and the rank.
"""

from __future__ import annotations

import sys
import time
import weakref
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import mxnet as mx
import numpy as np
from fastps.collectives import ops as C
from fastps.collectives import sfb as _cost
from fastps.collectives.ops import ProcessSet
from fastps.errors import FastPSError
from fastps.mxnet.ops import MXHandle
from fastps.worker import api as _api

if TYPE_CHECKING:  # mxnet has no type information: its classes are Any here
    from typing_extensions import TypeAlias

NDArray: TypeAlias = mx.nd.NDArray

__all__ = ["SufficientFactors"]

_TOLERANCE = {np.dtype(np.float64): 1e-9, np.dtype(np.float32): 1e-4}


class _KeepOutputGradient(mx.autograd.Function):
    """Identity on a Dense's pre-activation output; its backward keeps the gradient."""

    def __init__(self, pair: List[Optional[NDArray]]) -> None:
        super().__init__()
        self._pair = pair

    def forward(self, out: NDArray) -> NDArray:
        return out.copy()  # a Function's output must be a new array

    def backward(self, grad: NDArray) -> NDArray:
        # MXNet runs this on its engine; the buffer may be reused after it returns.
        self._pair[1] = grad.copy()
        return grad


class _Layer:
    """One Gluon ``Dense`` that may send its weight gradient as factors."""

    __slots__ = (
        "name",
        "index",
        "block",
        "weight",
        "flatten",
        "pairs",
        "rows_seen",
        "chosen",
        "checked",
        "installed",
        "ready",
    )

    def __init__(self, index: int, block: Any) -> None:
        self.name = str(block.weight.name)
        self.index = index  # the weight's position in the trainer's parameters
        self.block = block
        self.weight = block.weight
        self.flatten = bool(block._flatten)
        # [input rows, output-gradient rows or None] per forward call since the last
        # exchange; the gradient arrives in the backward pass.
        self.pairs: List[List[Optional[NDArray]]] = []
        self.rows_seen = 0
        self.chosen = False
        self.checked = False
        self.installed = False
        self.ready: Optional[np.ndarray] = None  # factors prepare() built for start()


def _blocks(root: Any) -> List[Any]:
    """Every block under ``root`` (itself included), each once, in registration order."""
    out: List[Any] = []
    seen: set = set()
    stack = [root]
    while stack:
        block = stack.pop()
        if id(block) in seen:
            continue
        seen.add(id(block))
        out.append(block)
        children = list(getattr(block, "_children", {}).values())
        stack.extend(reversed([c() if isinstance(c, weakref.ref) else c for c in children]))
    return out


def _dense_why_not(block: Any) -> Optional[str]:
    """Why this Dense cannot capture its factors (None: it can)."""
    dense = mx.gluon.nn.Dense
    cls = type(block)
    if cls.hybrid_forward is not dense.hybrid_forward or cls.forward is not dense.forward:
        return f"{cls.__name__} overrides hybrid_forward or forward"
    if not all(hasattr(block, a) for a in ("_flatten", "_units", "act", "weight")):
        return f"{cls.__name__} lacks the Dense attributes this MXNet version should have"
    return None


class SufficientFactors:
    """The factor capture and exchange of one ``DistributedTrainer``."""

    def __init__(
        self,
        model: Any,
        indices: Dict[int, int],
        how: str,
        process_set: ProcessSet,
        priorities: List[int],
        why_not: Optional[str] = None,
    ) -> None:
        """``indices``: parameter id -> position in the trainer's parameters.
        ``why_not``: a reason the whole trainer cannot use factors (compression, Adasum,
        async, elastic), printed instead of choosing."""
        if not isinstance(model, mx.gluon.Block):
            raise TypeError(
                f"DistributedTrainer(model=...): expected a gluon.Block, got {type(model).__name__}"
            )
        self.how = how
        self.process_set = process_set
        self.priorities = priorities
        self.layers: List[_Layer] = []
        self.by_index: Dict[int, _Layer] = {}
        self.skipped: List[str] = []
        self.decided = False
        self.rebuild_s = 0.0  # time spent rebuilding gradients from factors (a statistic)
        if why_not is not None:
            self.skipped.append(f"all layers use the servers: {why_not}")
        blocks = _blocks(model)
        uses: Dict[int, int] = {}
        for b in blocks:
            for p in getattr(b, "_reg_params", {}).values():
                uses[id(p)] = uses.get(id(p), 0) + 1
        seen: set = set()
        for b in blocks:
            if not isinstance(b, mx.gluon.nn.Dense) or id(b.weight) in seen:
                continue
            w = b.weight
            seen.add(id(w))
            index = indices.get(id(w))
            if index is None or w.grad_req == "null":
                continue  # not synchronised by this trainer
            reason = _dense_why_not(b)
            if reason is None and uses.get(id(w), 0) > 1:
                reason = "weight shared with another block"
            if reason is None and w.grad_req != "write":
                reason = f"grad_req={w.grad_req!r}: the gradient may hold earlier steps' terms"
            if reason is None and np.dtype(w.dtype) not in _TOLERANCE:
                reason = f"weight dtype {np.dtype(w.dtype).name}"
            if reason is not None:
                self.skipped.append(f"{w.name}: servers ({reason})")
            elif why_not is None:
                layer = _Layer(index, b)
                self.layers.append(layer)
                self.by_index[index] = layer
        for layer in self.layers:
            self._install(layer)

    # ---------------------------------------------------------------- capture

    def _install(self, layer: _Layer) -> None:
        """Replaces the block's ``hybrid_forward`` (on the instance only) by one that
        keeps the factors while recording for training on NDArrays."""
        block = layer.block
        original = type(block).hybrid_forward
        ref = weakref.ref(self)

        def hybrid_forward(F: Any, x: Any, weight: Any, bias: Any = None) -> Any:
            me = ref()
            if (
                me is None
                or F is not mx.nd
                or not (mx.autograd.is_recording() and mx.autograd.is_training())
            ):
                return original(block, F, x, weight, bias)
            return me._forward(layer, x, weight, bias)

        # Past Block.__setattr__, which registers blocks and parameters only.
        block.__dict__["hybrid_forward"] = hybrid_forward
        layer.installed = True

    def _forward(self, layer: _Layer, x: NDArray, weight: NDArray, bias: Any) -> NDArray:
        block = layer.block
        out = mx.nd.FullyConnected(
            x,
            weight,
            bias,
            no_bias=bias is None,
            num_hidden=block._units,
            flatten=layer.flatten,
        )
        pair: List[Optional[NDArray]] = [x, None]
        layer.pairs.append(pair)
        layer.rows_seen += _rows(x, layer.flatten)
        out = _KeepOutputGradient(pair)(out)
        return block.act(out) if block.act is not None else out

    # ---------------------------------------------------------------- decision

    def decide(self, name: str) -> None:
        """Collective (every rank of the set, at its first step): rank 0 of the set
        chooses from its own forward passes so far, everyone adopts its choice."""
        if self.decided:
            return
        self.decided = True
        ps = self.process_set
        root = ps.ranks[0]
        blocked: set = set()  # layers that cannot capture now: servers, reason printed
        for layer in self.layers:
            why = None
            if layer.block._active:
                why = "hybridized: the cached graph bypasses the capture"
            elif mx.util.is_np_array():
                why = "numpy-array mode (npx.set_np)"
            if why is not None:
                blocked.add(layer.name)
                self.skipped.append(f"{layer.name}: servers ({why})")
        costs = [
            _cost.LayerCost(
                layer.name,
                int(layer.weight.shape[0]),
                int(layer.weight.shape[1]),
                layer.rows_seen,
                ps.size(),
                np.dtype(layer.weight.dtype).itemsize,
            )
            for layer in self.layers
        ]
        mine = np.array(
            [int(c.batch > 0 and c.name not in blocked and c.use_factors(self.how)) for c in costs],
            dtype=np.int64,
        )
        if self.layers:
            agreed = C.broadcast_async(mine, "int64", root, name, ps).synchronize()
            for layer, flag in zip(self.layers, agreed):
                layer.chosen = bool(flag)
        if _api.rank() == root:
            shown = [c for c in costs if c.name not in blocked]
            for line in _cost.report(shown, self.how, self.skipped):
                print(line, file=sys.stderr, flush=True)
        for layer in self.layers:
            if not layer.chosen:
                self._release(layer)

    def chosen(self, index: int) -> bool:
        layer = self.by_index.get(index)
        return layer is not None and layer.chosen

    def chosen_names(self) -> List[str]:
        return [layer.name for layer in self.layers if layer.chosen]

    # ---------------------------------------------------------------- exchange

    def prepare(self, chosen: List[Tuple[int, NDArray, bool]]) -> None:
        """Before any gradient of the step is sent (an error later would leave the others'
        sums waiting): checks every chosen layer can still capture and, at a layer's first
        exchange, that its factors rebuild its local gradient. ``chosen``: (index,
        gradient, whether backward wrote it this step) of the chosen weights."""
        for index, _, _ in chosen:
            layer = self.by_index[index]
            if layer.block._active:
                raise FastPSError(
                    f"FASTPS_SFB: '{layer.name}' was hybridized after its gradient was chosen "
                    f"to travel as sufficient factors (rank {_api.rank()}); hybridize before "
                    "the first step or set FASTPS_SFB=off"
                )
        for index, grad, fresh in chosen:
            layer = self.by_index[index]
            if layer.checked:
                continue
            factors = self._factors(layer, grad)
            layer.ready = factors
            if fresh or factors.shape[0]:  # (an unused, stale gradient is not checked)
                layer.checked = True
                self._check_local(layer, grad, factors)

    def _factors(self, layer: _Layer, grad: NDArray) -> np.ndarray:
        """This step's rows ``[G | X]`` of the layer (none if no forward reached the loss
        on this rank); forgets them."""
        grad.wait_to_read()  # backward reached the layer: its captures have run
        pairs = [(x, g) for x, g in layer.pairs if x is not None and g is not None]
        layer.pairs = []
        rows, cols = (int(d) for d in layer.weight.shape)
        dtype = np.dtype(layer.weight.dtype)
        if not pairs:
            return np.zeros((0, rows + cols), dtype=dtype)
        blocks = [
            np.concatenate([g.asnumpy().reshape(-1, rows), _as_rows(x, layer.flatten, cols)], 1)
            for x, g in pairs
        ]
        return np.ascontiguousarray(np.concatenate(blocks).astype(dtype, copy=False))

    def start(self, index: int, grad: NDArray, scale: float, name: str) -> MXHandle:
        """Starts the allgather (named ``name``) of the weight's factor rows; the handle's
        finish writes ``scale`` times the rebuilt sum into ``grad``."""
        layer = self.by_index[index]
        factors = layer.ready if layer.ready is not None else self._factors(layer, grad)
        layer.ready = None
        rows = int(layer.weight.shape[0])
        dtype = np.dtype(layer.weight.dtype)
        op = C.allgather_async(factors, dtype.name, name, self.process_set, self.priorities[index])

        def finish() -> NDArray:
            gathered, _ = op.synchronize()
            started = time.perf_counter()
            summed = gathered[:, :rows].T @ gathered[:, rows:]
            if scale != 1.0:
                summed *= scale
            grad[:] = summed.astype(dtype, copy=False)
            self.rebuild_s += time.perf_counter() - started
            return grad

        return MXHandle(op.name, [op], finish, keep=[factors])

    def _check_local(self, layer: _Layer, grad: NDArray, factors: np.ndarray) -> None:
        """The local factors must rebuild the local gradient, or the exchanged sum would
        differ from the dense one."""
        rows = int(layer.weight.shape[0])
        local = factors[:, :rows].T @ factors[:, rows:]
        dense = grad.asnumpy()
        tol = _TOLERANCE[np.dtype(layer.weight.dtype)]
        scale = max(1.0, float(np.abs(dense).max()) if dense.size else 1.0)
        if not np.allclose(local, dense, rtol=tol, atol=tol * scale):
            raise FastPSError(
                f"FASTPS_SFB: the gradient of '{layer.name}' is not the product of its "
                f"Dense's inputs and output gradients on rank {_api.rank()} (the weight is "
                "used outside the block's forward, or a loss term changes its gradient); "
                "set FASTPS_SFB=off or exclude the layer"
            )

    def _release(self, layer: _Layer) -> None:
        if layer.installed:
            layer.block.__dict__.pop("hybrid_forward", None)
            layer.installed = False
        layer.pairs = []
        layer.ready = None

    def close(self) -> None:
        for layer in self.layers:
            self._release(layer)


def _rows(x: NDArray, flatten: bool) -> int:
    """Factor rows one forward call adds: its samples (flatten) or positions."""
    shape = tuple(int(d) for d in x.shape)
    if not shape:
        return 1
    if flatten:
        return shape[0]
    return int(np.prod(shape[:-1], dtype=np.int64))


def _as_rows(x: NDArray, flatten: bool, cols: int) -> np.ndarray:
    """The input as FullyConnected multiplies it: (samples, features) when flattening,
    else (every leading position, last axis)."""
    a = x.asnumpy()
    if flatten:
        return a.reshape(a.shape[0] if a.ndim else 1, -1)
    return a.reshape(-1, cols)
