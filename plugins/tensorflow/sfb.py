"""Sufficient-factor broadcasting for Keras 3 ``Dense`` kernels (Poseidon, ATC'17 §3.2).

``Dense`` computes ``y = activation(x K + b)`` with the kernel K of shape N×M. Over a step
the kernel's gradient is ``Xᵀ G``: X holds the rows of the input, G the rows of the
gradient of ``x K`` (before the bias and the activation), every leading dimension
flattened. The layer's ``call`` is replaced, on the instance, by the same computation
whose matmul goes through a ``tf.custom_gradient``: its backward function computes the
usual gradients and keeps the pair (X, G). When the reducer reaches the kernel's gradient,
the rows ``[X | G]`` are allgathered through the collective layer and every worker rebuilds
the summed gradient as one product ``X_allᵀ G_all``. Biases and every other variable keep
the servers.

Eagerly the pairs are eager tensors; inside a ``tf.function`` (``model.fit``, a compiled
custom loop) they are the traced graph's tensors, which the reducer uses in the same trace
(the backward pass and the update are traced into one graph). Pairs of another graph (a
gradient computed in one ``tf.function`` and applied in another) are not usable; such a
reduction is an error, not a silently different gradient.

Which layers do so is chosen once, at the first reduction, by rank 0's rows and the cost
model in ``fastps.sfb`` (FASTPS_SFB=auto|on|off), broadcast so every rank agrees, and
printed by rank 0. The first exchange of each layer checks that the local factors rebuild
the local gradient (a kernel regularizer or a loss term on the kernel would break that).
"""

from __future__ import annotations

import itertools
import sys
import warnings
import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
from fastps.collectives import ops as C
from fastps.collectives import sfb as _cost
from fastps.collectives.basics import sfb_choice
from fastps.errors import FastPSError
from fastps.tensorflow import _engine as E
from fastps.tensorflow import ops as O
from fastps.worker import api as _api

__all__ = ["SufficientFactors", "SFB_PREFIX"]

SFB_PREFIX = "sfb."

_TOLERANCE = {"float64": 1e-9, "float32": 1e-4}
_instances = itertools.count()
_WAIT = 2  # reductions without any captured rows that the choice waits for


class _Layer:
    """One ``Dense`` whose kernel gradient may travel as factors."""

    __slots__ = ("label", "layer", "pairs", "chosen", "checked", "patched", "uncaptured")

    def __init__(self, label: str, layer: Any) -> None:
        self.label = label  # for the start-up lines (Keras names differ between processes)
        self.layer = layer
        # (X rows, G rows) per backward pass through the layer since the last reduction.
        self.pairs: List[Tuple[tf.Tensor, tf.Tensor]] = []
        self.chosen = False
        self.checked = False
        self.patched = False
        self.uncaptured: Optional[str] = None  # why a call could not be captured


def _dense_classes() -> Tuple[Any, Any]:
    import keras

    return keras.layers.Dense, keras.layers.Layer


def _context_of(t: tf.Tensor) -> Any:
    """The graph a tensor belongs to, None for an eager tensor."""
    return t.graph if tf.is_symbolic_tensor(t) else None


def _current_context() -> Any:
    return None if E.executing_eagerly() else tf.compat.v1.get_default_graph()


class SufficientFactors:
    """The factor capture and exchange of one DistributedOptimizer or gradient tape."""

    def __init__(
        self, model: Any, how: str, process_set: Any, why_not: Optional[str] = None
    ) -> None:
        dense, base = _dense_classes()
        if not isinstance(model, base):
            raise TypeError(
                f"model=...: expected a Keras 3 layer or model (keras.layers.Layer), got "
                f"{type(model).__name__}"
            )
        self.how = how
        self.model = weakref.ref(model)
        self.process_set = process_set
        self.exchanges = 0  # factor allgathers started (a statistic, for tests and logs)
        self.layers: List[_Layer] = []
        self.skipped: List[str] = []
        self.decided = False
        self.waited = 0  # reductions that found nothing captured yet (see decide)
        self.sync_id = next(_instances)  # names the decision: creation order, like torch's
        if why_not is not None:
            self.skipped.append(f"all layers use the servers: {why_not}")
        for layer in model._flatten_layers(include_self=True, recursive=True):
            if not isinstance(layer, dense):
                continue
            reason = self._ineligible(layer, dense)
            if reason is None and "call" in layer.__dict__:
                reason = "its call is already replaced (another fastps optimizer or tape?)"
            if reason is not None:
                self.skipped.append(f"{layer.name}: servers ({reason})")
            elif why_not is None:
                entry = _Layer(f"{layer.name}/kernel", layer)
                self.layers.append(entry)
                self._patch(entry)

    @staticmethod
    def _ineligible(layer: Any, dense: Any) -> Optional[str]:
        if type(layer).call is not dense.call:
            return f"{type(layer).__name__} overrides call"
        if not layer.trainable:
            return "not trainable"
        if getattr(layer, "lora_enabled", False):
            return "LoRA enabled"
        if getattr(layer, "quantization_mode", None):
            return f"quantized ({layer.quantization_mode})"
        if layer.compute_dtype != layer.variable_dtype:
            return f"mixed precision ({layer.compute_dtype} on {layer.variable_dtype})"
        if layer.variable_dtype not in ("float32", "float64"):
            return f"kernel dtype {layer.variable_dtype}"
        if layer.kernel_regularizer is not None:
            return "a kernel regularizer adds a loss term on the kernel"
        return None

    # ---------------------------------------------------------------- capture

    def _patch(self, entry: _Layer) -> None:
        import keras

        ref = weakref.ref(self)
        layer = entry.layer

        def call(inputs: Any, training: Any = None) -> Any:
            me = ref()
            if me is None or not isinstance(inputs, (tf.Tensor, np.ndarray)):
                # a sparse input: Dense's own matmul, no factors (start() refuses it)
                if me is not None:
                    entry.uncaptured = f"input of type {type(inputs).__name__}"
                return type(layer).call(layer, inputs, training)
            y = _factored_matmul(me, entry, tf.convert_to_tensor(inputs), layer.kernel)
            if layer.bias is not None:
                y = keras.ops.add(y, layer.bias)
            if layer.activation is not None:
                y = layer.activation(y)
            return y

        object.__setattr__(layer, "call", call)  # no Keras tracking: not state to save
        entry.patched = True

    def _unpatch(self, entry: _Layer) -> None:
        if entry.patched:
            object.__delattr__(entry.layer, "call")
            entry.patched = False
        entry.pairs = []

    def _keep(self, entry: _Layer, x: tf.Tensor, g: tf.Tensor) -> None:
        entry.pairs.append((x, g))

    # ---------------------------------------------------------------- decision

    def _rows(self, entry: _Layer) -> Optional[int]:
        """This rank's factor rows of the current context, None when a graph does not
        know them when it is traced."""
        rows = 0
        here = _current_context()
        for x, _ in entry.pairs:
            if _context_of(x) is not here:
                continue
            n = x.shape[0]
            if n is None:
                return None
            rows += int(n)
        return rows

    def decide(self) -> None:
        """Collective (every rank of the set, at its reductions until decided, eagerly or
        while tracing): rank 0 chooses from its own rows, everyone adopts its choice.

        When rank 0 has no rows at all (the tape was made after the first forward pass
        ran, Horovod style, so nothing was captured yet), the choice waits for a later
        reduction, at most ``_WAIT`` times; this reduction uses the servers."""
        if self.decided:
            return
        ps = self.process_set
        root = ps.ranks[0]
        costs: List[_cost.LayerCost] = []
        # [wait?, choice per layer]
        mine = np.zeros(1 + len(self.layers), dtype=np.int64)
        unknown: List[str] = []
        unseen: List[str] = []
        skipped = list(self.skipped)
        for k, entry in enumerate(self.layers):
            if entry.uncaptured is not None:
                skipped.append(f"{entry.label}: servers ({entry.uncaptured})")
                continue
            rows = self._rows(entry)
            if rows is None:
                unknown.append(entry.label)
                mine[1 + k] = int(self.how == "on")
                continue
            n_in, n_out = (int(d) for d in entry.layer.kernel.shape)
            itemsize = tf.as_dtype(entry.layer.variable_dtype).size
            if rows == 0:
                unseen.append(entry.label)
                continue
            cost = _cost.LayerCost(entry.label, n_out, n_in, rows, ps.size(), itemsize)
            costs.append(cost)
            mine[1 + k] = int(cost.use_factors(self.how))
        if self.layers:
            captured = bool(unknown or costs)
            mine[0] = int(not captured and self.waited < _WAIT)
            name = f"fastps.sfb.tf.{self.sync_id}.{self.waited}"
            agreed = E.call(lambda: C.broadcast_async(mine, "int64", root, name, ps).synchronize())
            if agreed[0]:
                self.waited += 1
                self.drop_pending()
                if _api.rank() == root:
                    where = "this step" if E.executing_eagerly() else "the graph being traced"
                    print(
                        f"fastps SFB ({self.how}): no Dense rows captured yet (a tape made "
                        f"after the forward pass?): {where} uses the servers",
                        file=sys.stderr,
                        flush=True,
                    )
                return
            for entry, flag in zip(self.layers, agreed[1:]):
                entry.chosen = bool(flag) and entry.uncaptured is None
        self.decided = True
        if _api.rank() == root:
            lines = _cost.report(costs, self.how, skipped)
            considered = len(costs) + len(unknown) + len(unseen)
            lines[0] = f"fastps SFB ({self.how}): {considered} Dense layer(s) considered"
            if unknown:
                lines.append(
                    "fastps SFB   rows unknown when the graph was traced (no static batch "
                    "size), "
                    + ("sufficient factors" if self.how == "on" else "servers")
                    + ": "
                    + ", ".join(unknown)
                )
            if unseen:
                lines.append(
                    "fastps SFB   no rows in the first step, servers: " + ", ".join(unseen)
                )
            for line in lines:
                print(line, file=sys.stderr, flush=True)
        for entry in self.layers:
            if not entry.chosen:
                self._unpatch(entry)

    # ---------------------------------------------------------------- exchange

    def split(self, variables: Sequence[Any], live: Sequence[int]) -> Dict[int, _Layer]:
        """The indices among ``live`` whose gradient is a chosen kernel's (deciding first)."""
        self.decide()
        by_var: Dict[int, _Layer] = {}
        for entry in self.layers:
            if entry.chosen:
                kernel = entry.layer.kernel
                by_var[id(kernel)] = entry
                by_var[id(getattr(kernel, "value", kernel))] = entry
        return {
            i: by_var[id(variables[i])]
            for i in live
            if i < len(variables) and id(variables[i]) in by_var
        }

    def start(self, entry: _Layer, local: tf.Tensor, name: str, scale: float) -> O.Handle:
        """Starts the allgather of the layer's factor rows; the handle's result is
        ``scale`` times the rebuilt sum, shaped like the kernel."""
        if entry.uncaptured is not None:
            raise FastPSError(
                f"FASTPS_SFB: '{entry.label}' was called with an {entry.uncaptured} on rank "
                f"{_api.rank()}, whose factors cannot be captured; set FASTPS_SFB=off"
            )
        here = _current_context()
        pairs = [(x, g) for x, g in entry.pairs if _context_of(x) is here]
        stale = len(entry.pairs) - len(pairs)
        entry.pairs = []
        if stale and not pairs:
            raise FastPSError(
                f"FASTPS_SFB: the gradient of '{entry.label}' was computed in another "
                f"{'graph' if here is not None else 'tf.function'} than the one reducing it "
                f"(rank {_api.rank()}); compute and apply gradients in one tf.function, or "
                "set FASTPS_SFB=off"
            )
        n_in, n_out = (int(d) for d in local.shape)
        dtype = local.dtype
        if pairs:
            factors = tf.concat(
                [tf.concat([x for x, _ in pairs], 0), tf.concat([g for _, g in pairs], 0)], 1
            )
            factors = tf.cast(factors, dtype)
        else:  # the layer did not take part in this rank's loss: no rows to add
            factors = tf.zeros([0, n_in + n_out], dtype)
        wire = E.check_dtype(dtype, f"factors of '{entry.label}'")
        check = not entry.checked
        entry.checked = True
        ps = self.process_set
        label = entry.label

        checked: List[bool] = []  # a traced graph runs the starter every step: check once

        def starter(rows: np.ndarray, *grad: np.ndarray) -> E.Work:
            if grad and not checked:
                checked.append(True)
                _check_local(label, rows, grad[0], n_in, wire)
            self.exchanges += 1
            cop = C.allgather_async(E.to_numpy(rows, wire), E.wire(wire), name, ps)
            return E.Work([cop], lambda res: [E.from_numpy(res[0][0], wire)])

        def rebuild(outs: List[tf.Tensor]) -> tf.Tensor:
            gathered = outs[0]
            summed = tf.matmul(gathered[:, :n_in], gathered[:, n_in:], transpose_a=True)
            if scale != 1.0:
                summed = summed * tf.constant(scale, dtype)  # not via float32
            return tf.reshape(summed, [n_in, n_out])

        inputs = [factors, local] if check else [factors]
        return O._launch(
            starter, inputs, [dtype], [tf.TensorShape([None, n_in + n_out])], name, rebuild
        )

    def drop_pending(self) -> None:
        """Forgets captured pairs (a reduction that does not exchange them)."""
        for entry in self.layers:
            entry.pairs = []

    def close(self) -> None:
        for entry in self.layers:
            self._unpatch(entry)


def _check_local(label: str, rows: np.ndarray, grad: np.ndarray, n_in: int, wire: str) -> None:
    """The local factors must rebuild the local gradient, or the exchanged sum would differ
    from the dense one."""
    local = rows[:, :n_in].T @ rows[:, n_in:]
    grad = np.asarray(grad)
    tol = _TOLERANCE.get(wire, 1e-3)
    scale = max(1.0, float(np.abs(grad).max()) if grad.size else 1.0)
    if local.shape != grad.shape or not np.allclose(local, grad, rtol=tol, atol=tol * scale):
        raise FastPSError(
            f"FASTPS_SFB: the gradient of '{label}' is not the product of its Dense layer's "
            f"inputs and output gradients on rank {_api.rank()} (the kernel is used outside "
            "the layer's call, or a loss term changes its gradient, or a gradient through the "
            "layer was computed and not reduced); set FASTPS_SFB=off or exclude the layer"
        )


def _factored_matmul(owner: SufficientFactors, entry: _Layer, x: tf.Tensor, kernel: Any) -> Any:
    """``x @ kernel`` as Keras's Dense computes it, whose backward pass also hands the
    flattened input and output-gradient rows to ``owner``."""
    import keras

    k = tf.convert_to_tensor(kernel)
    if x.dtype != k.dtype:
        x = tf.cast(x, k.dtype)
    n_in, n_out = int(k.shape[0]), int(k.shape[1])

    @tf.custom_gradient
    def matmul(x: tf.Tensor, k: tf.Tensor) -> Any:
        y = keras.ops.matmul(x, k)

        def grad(dy: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
            xs = tf.reshape(x, [-1, n_in])
            gs = tf.reshape(tf.convert_to_tensor(dy), [-1, n_out])
            owner._keep(entry, xs, gs)
            dx = tf.reshape(tf.matmul(gs, k, transpose_b=True), tf.shape(x))
            dk = tf.matmul(xs, gs, transpose_a=True)
            return dx, dk

        return y, grad

    return matmul(x, k)


def attach(reducer: Any, model: Any, who: str, why_not: Optional[str] = None) -> None:
    """Gives ``reducer`` the factor exchange of ``model``'s Dense layers under
    FASTPS_SFB=auto|on (nothing under off): the plugins' shared decision
    (``fastps.collectives.basics.sfb_choice``), then the Keras checks. ``why_not``: the
    caller's reason for every layer to use the servers, ahead of the shared ones."""
    from fastps.tensorflow.compression import Compression

    choice = sfb_choice(
        who,
        model,
        "Dense layers",
        compressed=reducer.core is not None or reducer.compression is not Compression.none,
        op=None if reducer.op in (O.Average, O.Sum) else reducer.op.name,
        elastic=E.world_may_change(),
        stacklevel=3,
    )
    if choice is None:
        return
    how = choice.how
    _, base = _dense_classes()
    if not isinstance(model, base) and type(model).__module__.startswith("tf_keras"):
        warnings.warn(
            f"fastps: FASTPS_SFB={how} covers Keras 3 Dense layers; {who}(model=...) got a "
            "Keras 2 (tf_keras) model, whose gradients all use the servers",
            stacklevel=3,
        )
        return
    if why_not is None:
        why_not = choice.why_not
    # One capture per model: a training loop makes a new tape every step, and the layers
    # must be patched and the choice made (and printed) once.
    key = (id(model), how, id(reducer.process_set), why_not)
    sfb = _shared.get(key)
    if sfb is None or sfb.model() is not model:
        sfb = _shared[key] = SufficientFactors(model, how, reducer.process_set, why_not)
        weakref.finalize(model, _shared.pop, key, None)  # the cache holds the layers
    reducer.sfb = sfb


_shared: Dict[Tuple[int, str, int, Optional[str]], SufficientFactors] = {}
