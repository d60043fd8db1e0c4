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

**The direct path.** Like the torch optimizer's, this is the one place that goes straight to
the core (``fastps.api.push_pull_raw``) instead of through ``fastps.collectives``: a Sum or
Average over the global set of gradients whose names are fixed by the model, on the hot
path, where the layer's per-op announcement would add a control-plane round trip per
tensor and step. Its "same tensors everywhere" check is the group check below. Other
reductions (Min/Max/Product, a process set, sparse gradients) go through the layer.

**Fusion.** The direct path's gradients of one ``reduce`` call form one plan of the core's
tensor fusion (``core/worker/fusion_plan.py``, ``FASTPS_FUSION_THRESHOLD``): the small ones travel
packed in buckets that keep their place in the priority order. The plan (name, bytes, dtype,
priority of each gradient) is known when the graph is traced (static shapes) and is set by
the first start that runs, before any of its gradients is pushed, identically on every
rank; its name covers the group digest, so other gradients make another plan. A bucket is
pushed once all its members were started, which holds here: every start of a call runs
before any of its finishes waits (``tf.function`` chains them in that order, TensorFlow 1
graphs never wait on an executor thread, eagerly there is one start).

**Names.** ``<kind>.<digest>.<index>``, where the digest covers the shapes and dtypes of
the whole group (not the variable names: Keras numbers layers per process). Before the
first push_pull of a group the workers compare digests (one tiny push_pull), so a model
that differs between workers fails at once on all of them, naming the first differing
variable, instead of hanging.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Type

import numpy as np
import tensorflow as tf
from fastps.collectives import ops as C
from fastps.tensorflow import _engine as E
from fastps.tensorflow import _graph as G
from fastps.tensorflow import ops as O
from fastps.tensorflow.compression import Compression, Compressor
from fastps.tensorflow.sfb import SFB_PREFIX, SufficientFactors
from fastps.worker import api as _api
from fastps.worker import catch_up as CU
from fastps.worker.buffers import raw_buffer
from fastps.worker.fusion_plan import FusionPlan, Row
from fastps.worker.waitable import Waitable


class _Direct(Waitable):
    """A gradient's Sum over the global set, straight on the core (see "The direct path")."""

    def __init__(
        self,
        arr: np.ndarray,
        dtype: str,
        name: str,
        priority: int,
        scale: float,
        core: Any = None,
        lags: Optional[CU.RoundLag] = None,
        quorum: bool = True,
    ):
        self._out = np.empty(arr.shape, dtype=arr.dtype)
        self._lags = lags  # where the wait reports the quorum lag (catch-up)
        if arr.size == 0:
            self._handle: Any = None
            return
        if dtype == "bool":
            scale = 1.0  # booleans combine with logical OR; there is nothing to scale
        src = raw_buffer(arr, f"gradient '{name}'", dtype=dtype)
        dst = raw_buffer(self._out, f"output of gradient '{name}'", writable=True, dtype=dtype)
        self._handle = _api.push_pull_raw(
            src,
            dst,
            name,
            int(priority),
            float(scale),
            out=self._out,
            keep=(arr,),
            compression=core,
            # a gradient: a quorum round under FASTPS_ROUND_QUORUM, unless the sum becomes
            # replicated state (an algorithm's momentum), which needs every worker's push
            quorum=quorum,
        )

    def poll(self) -> bool:
        return self._handle is None or bool(self._handle.poll())

    def synchronize(self, timeout: Optional[float] = None) -> np.ndarray:
        if self._handle is not None:
            self._handle.synchronize(timeout)  # raises again if called again after a failure
            if self._lags is not None:
                self._lags.note(self._handle.lag)
                self._lags = None  # noted once
        return self._out

    wait = synchronize


class RoundFetch:
    """The catch-up fetch of one ``reduce`` call's gradients (docs/guide/async.md, "Catch-up";
    ``fastps.catch_up``): under quorum rounds, the sums of their next round, which closed
    without this worker, as the arrays the reduction would have returned. Made when the
    call is traced (names, shapes, priorities are fixed by then) and run at every step
    that fell behind; only for calls whose every gradient took the direct path
    uncompressed, with a static shape: a round is applied whole or not at all."""

    def __init__(
        self,
        indices: Sequence[int],
        names: Sequence[str],
        tf_dtypes: Sequence[tf.DType],
        shapes: Sequence[Tuple[int, ...]],
        priorities: Sequence[int],
        scale: float,
        average: bool,
    ) -> None:
        self.indices = list(indices)
        self.names = list(names)
        self.tf_dtypes = list(tf_dtypes)
        self.dtypes = [E.check_dtype(d, n) for d, n in zip(tf_dtypes, names)]
        self.shapes = [tuple(s) for s in shapes]
        self.priorities = list(priorities)
        self.scale = float(scale)
        self.average = bool(average)

    def fetch(self) -> List[np.ndarray]:
        """The next round's sums, each times the scale its push carried."""
        factor = self.scale / C.global_process_set.size() if self.average else self.scale
        arrays = [np.empty(s, dtype=d.as_numpy_dtype) for s, d in zip(self.shapes, self.tf_dtypes)]
        targets: List[CU.Target] = []
        for arr, dt, shape, name, prio in zip(
            arrays, self.dtypes, self.shapes, self.names, self.priorities
        ):
            host = E.to_numpy(arr, dt)  # a view: bfloat16 as its bits
            if host.size:
                targets.append(
                    CU.Target(host.ctypes.data, host.nbytes, dt, shape, name, prio, factor)
                )
        CU.fetch_round(targets)
        return arrays


class GradientFusion:
    """One ``reduce`` call's rows for the core's fusion plan (``core/worker/fusion_plan.py``),
    set by :meth:`ensure` once per process and core session."""

    _lock = threading.Lock()
    # Plan name -> (the core session it belongs to, its plan).
    _plans: Dict[str, Tuple[Any, FusionPlan]] = {}

    def __init__(self, name: str, rows: Sequence[Row]) -> None:
        self.name = name
        self.rows = list(rows)

    def ensure(self) -> None:
        st = _api.session()
        with self._lock:
            current = self._plans.get(self.name)
            if current is None or current[0] is not st:  # a new session has no plans
                current = self._plans[self.name] = (st, FusionPlan(self.name))
            current[1].update(self.rows)

    @classmethod
    def buckets(cls) -> int:
        """Buckets of the plans set in this session (for tests and logs)."""
        st = _api.session()
        with cls._lock:
            return sum(plan.buckets for s, plan in cls._plans.values() if s is st)


def _direct_starter(
    dtypes: Sequence[str],
    names: Sequence[str],
    priorities: Sequence[int],
    scale: float,
    average: bool,
    plan: Optional[GradientFusion] = None,
    core: Any = None,
    lags: Optional[CU.RoundLag] = None,
    quorum: bool = True,
) -> Callable[..., E.Work]:
    """Starts the sums, times ``scale`` (and divided by the world's size when it starts,
    for an average: a graph traced in one world may run in the next, docs/guide/elastic.md);
    their waits report the quorum lag to ``lags``."""

    def start(*arrs: np.ndarray) -> E.Work:
        if plan is not None:
            plan.ensure()
        factor = scale / C.global_process_set.size() if average else scale
        with _api.submission_batch():
            parts = [
                _Direct(E.to_numpy(a, dt), dt, n, p, factor, core, lags, quorum)
                for a, dt, n, p in zip(arrs, dtypes, names, priorities)
            ]
        return E.Work(parts, lambda res: [E.from_numpy(r, dt) for r, dt in zip(res, dtypes)])

    return start


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
        process_set: Any = None,
        settings: Sequence[str] = (),
    ) -> None:
        if num_groups < 0:
            raise ValueError("num_groups must be 0 (one operation per gradient) or positive")
        self.kind = kind
        self.num_groups = int(num_groups)
        self.compression = compression
        # A fastps.Compression choice: the core compresses on the wire (docs/guide/compression.md).
        self.core = compression if hasattr(compression, "spec_for") else None
        self.op = O._resolve_op(op, None)
        self.sparse_as_dense = sparse_as_dense
        self.prescale_factor = prescale_factor
        self.postscale_factor = postscale_factor
        self.process_set = C.global_process_set if process_set is None else process_set
        # Settings every worker must share besides the tensors (e.g. the passes per step of
        # local aggregation): part of the group check and of the names.
        self.settings = [str(x) for x in settings]
        # Dense kernels that may travel as sufficient factors (sfb.py); set by the
        # optimizer or tape given model=... under FASTPS_SFB=auto|on.
        self.sfb: Optional[SufficientFactors] = None
        # Quorum catch-up (the optimizer's, docs/guide/async.md): the direct path's waits report
        # their lag here, and each reduce call leaves the fetch of its next round (None
        # when a gradient took another path). None: nobody catches up (the tape).
        self.lags: Optional[CU.RoundLag] = None
        self.last_fetch: Optional[RoundFetch] = None
        # False: every sum waits for every worker's push even under FASTPS_ROUND_QUORUM
        # (the sums are replicated state, e.g. 1-bit Adam's momentum).
        self.quorum = True

    def _group(self, grads: Sequence[Any], variables: Sequence[Any], live: List[int]) -> E.Group:
        group = E.group_of([variables[i] if i < len(variables) else grads[i] for i in live], live)
        return E.Group(group.keys + self.settings, group.labels + self.settings)

    def _direct(self) -> bool:
        return self.op in (O.Sum, O.Average) and self.process_set is C.global_process_set

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
        self.last_fetch = None
        if forward_order is None:
            forward_order = list(range(n))
        live = [i for i, g in enumerate(grads) if g is not None]
        if not live:
            return grads
        ps = self.process_set
        eager = E.executing_eagerly()
        # Alone, nothing to reduce; but a graph traced alone in an elastic job may run
        # in a bigger world later, so it reduces anyway (a sum over one rank).
        if ps.size() == 1 and (eager or not E.world_may_change()):
            if self.sfb is not None:
                self.sfb.drop_pending()
            factor = self.prescale_factor * self.postscale_factor
            if factor == 1.0:
                return grads
            return [g if g is None else g * tf.cast(factor, g.dtype) for g in grads]

        group = self._group(grads, variables, live)
        names = {i: f"{self.kind}.{group.digest}.{i}" for i in live}
        what = f"the gradients reduced by {self.kind}"
        priority = {i: C.priority_for(int(forward_order[i]), n) for i in live}
        out: List[Any] = list(grads)
        if eager:
            E.check_same_everywhere(self.kind, group, what, process_set=ps)
            order = sorted(live, key=lambda i: forward_order[i])
        else:
            E.refuse_xla(self.kind)
            G.check_op(self.kind, group, what)
            order = sorted(live, key=lambda i: forward_order[i], reverse=True)

        # Chosen Dense kernels: their factor rows are allgathered instead (sfb.py).
        factored = self.sfb.split(variables, live) if self.sfb is not None else {}
        exchanges: List[Tuple[int, O.Handle]] = []
        ready: List[Tuple[int, tf.Tensor, Any]] = []  # (index, compressed, ctx)
        for i in order:
            g = grads[i]
            if i in factored:
                assert self.sfb is not None
                name = SFB_PREFIX + names[i]
                handle = self.sfb.start(factored[i], tf.convert_to_tensor(g), name, self._scale())
                exchanges.append((i, handle))
                continue
            if isinstance(g, tf.IndexedSlices):
                if not self.sparse_as_dense:
                    # Allgathered, not summed (Horovod's IndexedSlices path).
                    out[i] = O.allreduce(
                        g,
                        op=self.op,
                        name=names[i],
                        process_set=ps,
                        prescale_factor=self.prescale_factor,
                        postscale_factor=self.postscale_factor,
                    )
                    continue
                g = tf.convert_to_tensor(g)
            g = tf.convert_to_tensor(g)
            E.check_dtype(g.dtype, f"gradient '{names[i]}'")
            compressed, ctx = (g, None) if self.core else self.compression.compress(g)
            ready.append((i, compressed, ctx))
        if self.sfb is not None:
            self.sfb.drop_pending()  # rows of layers whose gradient is not reduced here
        if len(ready) == len(live):
            self.last_fetch = self._round_fetch(ready, names, priority)
        if not ready:
            for i, handle in exchanges:
                out[i] = handle.synchronize()
            return out

        # Eagerly: one start for all; in a graph: one start op per gradient (each fires
        # when its gradient exists) or per group of consecutive gradients.
        per_group = len(ready)
        if not eager:
            per_group = -(-len(ready) // self.num_groups) if self.num_groups else 1
        # Compressed gradients travel alone (a fused bucket is one plain tensor).
        plan = None if self.core else self._fusion_plan(ready, names, priority, group.digest)
        started = []
        for k in range(0, len(ready), per_group):
            members = ready[k : k + per_group]
            started.append((members, self._start(members, names, priority, plan)))
        for members, handle in reversed(started) if not eager else started:
            for (i, _, ctx), r in zip(members, handle.synchronize()):
                out[i] = r if self.core else self.compression.decompress(r, ctx)
        for i, handle in exchanges:
            out[i] = handle.synchronize()
        return out

    def _round_fetch(
        self, ready: Sequence[Tuple[int, tf.Tensor, Any]], names: Any, priority: Any
    ) -> Optional[RoundFetch]:
        """The catch-up fetch of this call's gradients, when every one of them takes the
        direct path uncompressed with a static shape (see :class:`RoundFetch`)."""
        if self.lags is None or not self._direct():
            return None
        if self.core is not None or self.compression is not Compression.none:
            return None
        if any(not c.dtype.is_floating or not c.shape.is_fully_defined() for _, c, _ in ready):
            return None
        order = sorted(i for i, _, _ in ready)
        by_index = {i: c for i, c, _ in ready}
        return RoundFetch(
            order,
            [names[i] for i in order],
            [by_index[i].dtype for i in order],
            [tuple(by_index[i].shape.as_list()) for i in order],
            [priority[i] for i in order],
            float(self.prescale_factor) * float(self.postscale_factor),
            self.op == O.Average,
        )

    def _scale(self) -> float:
        """What the sum of a gradient is multiplied by (Average: divided by the set size,
        fixed here: factors are not used where the world may change)."""
        scale = float(self.prescale_factor) * float(self.postscale_factor)
        return scale / self.process_set.size() if self.op == O.Average else scale

    @E.no_autograph
    def start_each(
        self, grads: Sequence[Any], variables: Sequence[Any]
    ) -> Optional[List[Optional[Arriving]]]:
        """Eagerly, starts the reduction of every gradient and returns, per gradient, an
        :class:`Arriving` that polls and waits for that gradient alone (None stays None),
        for cross-barrier updates. None when not every gradient can take the direct path
        (a process set, Min/Max, a sparse or integer gradient; compression done by the
        plugin's Compressor is fine): the caller then reduces synchronously."""
        if not E.executing_eagerly() or not self._direct() or self.sfb is not None:
            return None
        grads = list(grads)
        live = [i for i, g in enumerate(grads) if g is not None]
        if any(isinstance(grads[i], tf.IndexedSlices) for i in live):
            return None
        if any(not tf.as_dtype(grads[i].dtype).is_floating for i in live):
            return None
        out: List[Optional[Arriving]] = [None] * len(grads)
        if not live:
            return out
        if self.process_set.size() == 1:
            reduced = self.reduce(grads, variables)
            for i in live:
                out[i] = Arriving(None, reduced[i], None, None)
            return out
        group = self._group(grads, variables, live)
        E.check_same_everywhere(
            self.kind, group, f"the gradients reduced by {self.kind}", process_set=self.process_set
        )
        names = {i: f"{self.kind}.{group.digest}.{i}" for i in live}
        priority = {i: C.priority_for(i, len(grads)) for i in live}
        ready: List[Tuple[int, tf.Tensor, Any]] = []
        for i in live:
            g = tf.convert_to_tensor(grads[i])
            compressed, ctx = (g, None) if self.core else self.compression.compress(g)
            ready.append((i, compressed, ctx))
        plan = None if self.core else self._fusion_plan(ready, names, priority, group.digest)
        dtypes = [E.check_dtype(c.dtype, f"gradient '{names[i]}'") for i, c, _ in ready]
        scale = float(self.prescale_factor) * float(self.postscale_factor)
        starter = _direct_starter(
            dtypes,
            [names[i] for i, _, _ in ready],
            [priority[i] for i, _, _ in ready],
            scale,
            self.op == O.Average,
            plan,
            self.core,
        )
        work = E.call(starter, *[c.numpy() for _, c, _ in ready])
        for (i, c, ctx), part, dt in zip(ready, work._ops, dtypes):
            out[i] = Arriving(part, None, (dt, c.dtype), None if self.core else (self, ctx))
        return out

    def _fusion_plan(
        self,
        ready: Sequence[Tuple[int, tf.Tensor, Any]],
        names: Any,
        priority: Any,
        digest: str,
    ) -> Optional[GradientFusion]:
        """The plan of the gradients that take the direct path, or None (fusion off, a
        shape only known when the graph runs, or a TF1 graph: a ``Session.run`` may fetch
        some of the gradients only, and a fused bucket would wait for the others)."""
        if not (self._direct() and _api.fusion_enabled()):
            return None
        if not E.executing_eagerly() and not G.ordered(tf.compat.v1.get_default_graph()):
            return None
        rows = []
        for i, c, _ in ready:
            if not c.dtype.is_floating:
                continue
            if not c.shape.is_fully_defined():
                return None
            nbytes = c.shape.num_elements() * c.dtype.size
            rows.append((names[i], nbytes, E.check_dtype(c.dtype, names[i]), priority[i]))
        return GradientFusion(f"tf.{self.kind}.{digest}", rows) if len(rows) > 1 else None

    def _start(
        self,
        members: Sequence[Tuple[int, tf.Tensor, Any]],
        names: Any,
        priority: Any,
        plan: Optional[GradientFusion] = None,
    ) -> O.Handle:
        tensors = [c for _, c, _ in members]
        dtypes = [E.check_dtype(c.dtype, f"gradient '{names[i]}'") for i, c, _ in members]
        label = names[members[0][0]]
        floats = all(c.dtype.is_floating for c in tensors)
        if self._direct() and floats:
            scale = float(self.prescale_factor) * float(self.postscale_factor)
            starter = _direct_starter(
                dtypes,
                [names[i] for i, _, _ in members],
                [priority[i] for i, _, _ in members],
                scale,
                self.op == O.Average,
                plan,
                self.core,
                self.lags,
                self.quorum,
            )
        else:
            starter = self._layer_starter(members, dtypes, names, priority)
        return O._launch(
            starter, tensors, [c.dtype for c in tensors], [c.shape for c in tensors], label
        )

    def _layer_starter(
        self, members: Any, dtypes: Sequence[str], names: Any, priority: Any
    ) -> Callable[..., E.Work]:
        ps, op = self.process_set, self.op
        pre, post = self.prescale_factor, self.postscale_factor
        tags = [names[i] for i, _, _ in members]
        prios = [priority[i] for i, _, _ in members]

        def start(*arrs: np.ndarray) -> E.Work:
            with _api.submission_batch():
                cops = [
                    C.allreduce_async(
                        E.to_numpy(a, dt), dt, tag, op, pre, post, ps, p, compression=self.core
                    )
                    for a, dt, tag, p in zip(arrs, dtypes, tags, prios)
                ]
            return E.Work(cops, lambda res: [E.from_numpy(r, dt) for r, dt in zip(res, dtypes)])

        return start


class Arriving:
    """One gradient's reduction started by :meth:`GradientReducer.start_each`: ``poll``
    says whether its sum is in, ``result`` waits for it (at most ``timeout`` seconds,
    default the op timeout) and returns it as a tensor of the gradient's dtype."""

    __slots__ = ("_part", "_value", "_dtypes", "_decompress")

    def __init__(self, part: Any, value: Any, dtypes: Any, decompress: Any) -> None:
        self._part = part
        self._value = value
        self._dtypes = dtypes
        self._decompress = decompress

    def poll(self) -> bool:
        return self._part is None or bool(self._part.poll())

    def result(self, timeout: Optional[float] = None) -> Any:
        if self._part is not None:
            arr = E.call(self._part.synchronize, timeout)
            dt, tf_dtype = self._dtypes
            value = tf.convert_to_tensor(E.from_numpy(arr, dt), dtype=tf_dtype)
            if self._decompress is not None:
                reducer, ctx = self._decompress
                value = reducer.compression.decompress(value, ctx)
            self._value, self._part = value, None
        return self._value
