"""Averages a list of gradients over all workers, highest-priority layers first.

Used by :class:`~fastps.tensorflow.DistributedGradientTape` and the Keras
:func:`~fastps.tensorflow.keras.DistributedOptimizer`.

**Priorities.** Each gradient's push_pull carries a priority: the variable used earliest in
the forward pass gets the largest, so the core sends it first and the next forward pass can
start as soon as possible (P3, ByteScheduler). The caller gives the forward order: the tape
uses the order of its watched variables (TensorFlow reports them in variable creation order,
which for Keras layers is the order the layers were built, i.e. the forward order); the
optimizer uses the order of the variables it updates (``model.trainable_variables``, also
layer order).

**Overlap inside graphs.** In a ``tf.function`` each gradient gets a start op that depends
only on that gradient, and a finish op that the update of its variable consumes. All start
ops are created before all finish ops; ``tf.function``'s automatic control dependencies
chain stateful, resource-free ops in creation order, so the chain is: the consistency check
(first run only), then the starts in *reverse* forward order (the order backpropagation
produces the gradients, so each start fires as soon as its gradient exists while the rest of
the backward pass continues), then the finishes. The core reorders queued parts by priority.
Eagerly the gradients all exist already; they are started highest priority first.

**Groups.** With ``num_groups=k`` (> 0) the gradients, in backpropagation order, are cut
into k consecutive groups that each get one start op and one finish op: two Python calls per
group and step instead of two per gradient, which pays off for models with many small
tensors, at the cost of starting a group only when all its gradients exist. Eagerly
``num_groups`` changes nothing.

**Names.** ``<kind>.<digest>.<index>``, where the digest covers the shapes and dtypes of
the whole group (not the variable names: Keras numbers layers per process). Before the
first push_pull of a group the workers compare digests (one tiny push_pull), so a model
that differs between workers fails at once on all of them, naming the first differing
variable, instead of hanging.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple, Type

import tensorflow as tf
from fastps import api as _api

from . import _engine as E
from . import ops as O
from .compression import Compression, Compressor


class GradientReducer:
    def __init__(
        self,
        kind: str,
        compression: Type[Compressor] = Compression.none,
        op: int = O.Average,
        sparse_as_dense: bool = False,
        prescale_factor: float = 1.0,
        postscale_factor: float = 1.0,
        num_groups: int = 0,
    ) -> None:
        if num_groups < 0:
            raise ValueError("num_groups must be 0 (one operation per gradient) or positive")
        self.kind = kind
        self.num_groups = int(num_groups)
        self.compression = compression
        self.op = O._resolve_op(op, None)
        self.sparse_as_dense = sparse_as_dense
        self.prescale_factor = prescale_factor
        self.postscale_factor = postscale_factor

    @E.no_autograph
    def reduce(
        self,
        grads: Sequence[Any],
        variables: Sequence[Any],
        forward_order: Optional[Sequence[int]] = None,
    ) -> List[Any]:
        """Returns the reduced ``grads`` (None stays None).

        ``forward_order[i]`` is the position of ``variables[i]`` in the forward pass
        (0 = used first); default: list order.
        """
        grads = list(grads)
        n = len(grads)
        if forward_order is None:
            forward_order = list(range(n))
        scale_only = _api.size() == 1
        live = [i for i, g in enumerate(grads) if g is not None]
        if not live:
            return grads
        if scale_only:
            factor = self.prescale_factor * self.postscale_factor
            if factor == 1.0:
                return grads
            return [g if g is None else g * tf.cast(factor, g.dtype) for g in grads]

        group = E.group_of([variables[i] if i < len(variables) else grads[i] for i in live], live)
        names = {i: f"{self.kind}.{group.digest}.{i}" for i in live}
        what = f"the gradients reduced by {self.kind}"
        priority = {i: n - int(forward_order[i]) for i in live}
        scale = O._scale(self.op, self.prescale_factor, self.postscale_factor)
        out: List[Any] = list(grads)
        eager = E.executing_eagerly()
        if eager:
            E.check_same_everywhere(self.kind, group, what)
            order = sorted(live, key=lambda i: forward_order[i])
        else:
            E.refuse_xla(self.kind)
            E.check_op(self.kind, group, what)
            order = sorted(live, key=lambda i: forward_order[i], reverse=True)

        ready: List[Tuple[int, tf.Tensor, Any]] = []  # (index, compressed, ctx)
        for i in order:
            g = grads[i]
            if isinstance(g, tf.IndexedSlices):
                if not self.sparse_as_dense:
                    # Gathered, not summed; blocking, but sparse gradients are rare.
                    out[i] = O._push_pull_sparse(
                        g, self.op, names[i], self.prescale_factor * self.postscale_factor
                    )
                    continue
            g = tf.convert_to_tensor(g)
            E.check_dtype(g.dtype, f"gradient '{names[i]}'")
            compressed, ctx = self.compression.compress(g)
            ready.append((i, compressed, ctx))

        if eager or not self.num_groups:
            handles = {
                i: O.start(
                    c,
                    names[i],
                    priority=priority[i],
                    scale=scale,
                    post=_decompressor(self.compression, ctx),
                )
                for i, c, ctx in ready
            }
            for i in sorted(handles, key=lambda i: forward_order[i]):
                out[i] = handles[i].synchronize()
            return out

        # Grouped: consecutive gradients (in backpropagation order) share one start op and
        # one finish op, which saves Python calls per step at the cost of starting each
        # group only once all its gradients exist.
        if not ready:
            return out
        per_group = -(-len(ready) // self.num_groups)  # ceiling
        started = []
        for k in range(0, len(ready), per_group):
            members = ready[k : k + per_group]
            ids = E.start_group_op(
                [c for _, c, _ in members],
                [names[i] for i, _, _ in members],
                [priority[i] for i, _, _ in members],
                scale,
            )
            started.append((members, ids))
        for members, ids in reversed(started):  # the group holding the first layers first
            results = E.finish_group_op(
                ids,
                [c.dtype for _, c, _ in members],
                [c.shape for _, c, _ in members],
                names[members[0][0]],
            )
            for (i, _, ctx), r in zip(members, results):
                out[i] = self.compression.decompress(r, ctx)
        return out


def _decompressor(compression: Type[Compressor], ctx: Any) -> Any:
    return lambda t: compression.decompress(t, ctx)
