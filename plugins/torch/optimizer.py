"""``DistributedOptimizer``: averages gradients over all ranks while backward still runs.

Overlap (Poseidon's wait-free backpropagation, ATC'17 §3.1): each parameter gets a
``register_post_accumulate_grad_hook``; the moment autograd has accumulated a parameter's
gradient, its push_pull starts (in place on ``param.grad``) while autograd goes on with
the layers below. ``step()`` only waits for what is still in flight, then runs the wrapped
optimizer's own step. With ``backward_passes_per_step=k`` the hook counts backward passes
per parameter and communicates on every k-th one; the passes in between accumulate into
``param.grad`` locally, as plain PyTorch does.

Priorities (P3, SysML'19 §3): the gradient of the parameter that the next forward pass uses
first is sent first. The forward order is learned during the first iteration (see
``priority.py``), so models whose registration order differs from their execution order
still get the right priorities. The core cuts large gradients into parts and always sends
the highest-priority part that is ready. Every worker must give a gradient the same priority
(the core's push window relies on it, and the scheduler checks it), but each worker learns
from its own forward pass, which differs in a dynamic graph (a layer used on some ranks
only): before the first gradient goes out, rank 0's learned priorities become everyone's.

The wrapper: ``DistributedOptimizer(opt)`` returns an object of a subclass of
``type(opt)`` (``isinstance`` checks, LR schedulers, ``state_dict`` keep working) that
*adopts* ``opt``'s state instead of re-running its constructor: both objects share the
same ``param_groups``, ``state`` and ``defaults``, so state loaded into ``opt`` before
wrapping is kept, and the wrapped optimizer's code runs unchanged in ``step()``.

Cross-barrier updates (the default; ``cross_barrier=False`` or ``FASTPS_CROSS_BARRIER=0``
turn them off): ``step()`` returns without waiting and each parameter is updated when its
sum is in and, at the latest, when the next forward pass reaches its module or anything
reads it (``cross_barrier.py``).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import warnings
import weakref
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple, Type

import numpy as np
import torch
from fastps.collectives import ops as _collectives
from fastps.collectives.basics import sfb_choice
from fastps.control.elastic_wire import enabled as _elastic_enabled
from fastps.elastic import inplace as _inplace
from fastps.errors import FastPSError
from fastps.torch import timeline_events as _tl
from fastps.torch.adasum_optimizer import _AdasumMixin, adasum_optimizer
from fastps.torch.algorithms.runner import Runner
from fastps.torch.algorithms.runner import resolve as _resolve_algorithm
from fastps.torch.async_optimizer import async_requested, make_async_optimizer
from fastps.torch.compression import Compression, is_core
from fastps.torch.cross_barrier import CrossBarrier, choose, enabled, explicit, quiet
from fastps.torch.functions import check_same_tensors
from fastps.torch.heap import collect_early, freeze_once
from fastps.torch.ops import (
    Adasum,
    Average,
    Handle,
    ReduceOp,
    Sum,
    _allreduce_op,
    _allreduce_start,
    _resolve_op,
    _sparse_allreduce,
    core_dtype,
    global_process_set,
)
from fastps.torch.priority import ForwardOrder
from fastps.torch.sfb import SufficientFactors
from fastps.worker import api as _api
from fastps.worker import catch_up as _catch_up
from fastps.worker.compression import default_compressor
from fastps.worker.fusion_plan import FusionPlan

__all__ = ["DistributedOptimizer"]

GRAD_PREFIX = "grad."

# Float dtypes the fast path hands to the core as they are (the core's names).
_FAST_DTYPES = {
    torch.float32: "float32",
    torch.float64: "float64",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
}

# Numbers the gradient syncs in creation order (the same on every rank), to name their
# priority agreements.
_sync_ids = itertools.count()

# Parameter id -> (a weak reference to) the sync whose hook sends its gradient. When a
# parameter is wrapped by a second DistributedOptimizer (the optimizer re-created), the
# newest one takes over the overlap; an older one still pushes the gradient in its own
# synchronize(). A plain dict of references: every hook call looks its parameter up.
_hook_owner: Dict[int, weakref.ReferenceType[_GradientSync]] = {}


class _Entry:
    """One parameter the optimizer updates, reused every iteration.

    A gradient in flight is either the core's op id ``hid`` (the common case: a dense CPU
    float gradient of the global set, summed in place; nothing tracked by the garbage
    collector is created per gradient) or a plugin ``Handle`` (devices, compression,
    sparse gradients, process sets)."""

    __slots__ = (
        "name",
        "param",
        "index",
        "passes",
        "handle",
        "hid",
        "sent",
        "session",
        "hook",
        "deferred",
        "grad",
        "group",
        "zero",
        "lag",
    )

    def __init__(self, name: str, param: torch.Tensor, index: int) -> None:
        self.name = name
        self.param = param
        self.index = index  # registration order: position in the optimizer's param groups
        self.passes = 0  # backward passes accumulated since the last synchronize
        self.handle: Optional[Handle] = None
        self.hid = -1  # the core's op id while the fast path's push_pull runs
        self.sent: Optional[torch.Tensor] = None  # the memory that op writes into
        self.session: Any = None  # the core session ``hid`` belongs to
        self.hook: Optional[Any] = None
        # Cross-barrier: step() was called, the update waits for the handle's sum into
        # ``grad`` and will use the hyperparameters of param group ``group``.
        self.deferred = False
        self.grad: Optional[torch.Tensor] = None
        self.group = -1
        self.zero = False  # zero ``grad`` in place once the update is applied
        # Quorum rounds: rounds of this gradient that closed after the one last waited for
        # (-1: unknown, it went a path that cannot catch up); see _GradientSync.catch_up.
        self.lag = 0

    @property
    def busy(self) -> bool:
        """A push_pull of this gradient was started and not waited for."""
        return self.hid >= 0 or self.handle is not None

    def poll(self) -> bool:
        """True once the sum is in. A fast-path op that has finished is released here at
        once (its error raised), so the ``wait()`` that follows has nothing left to do."""
        if self.hid >= 0:
            try:
                lag = _api.try_wait_id(self.hid, self.name)
                if lag is None:
                    return False
                self.lag = lag
            except BaseException:
                self.drop()  # the op is gone either way
                raise
            self.hid = -1
            self.sent = self.session = None
            return True
        return self.handle is None or self.handle.poll()

    def wait(self) -> None:
        """Waits for the gradient's sum; the entry is free again afterwards (also when
        the wait raised: the op is gone either way)."""
        if self.hid >= 0:
            hid, self.hid = self.hid, -1
            try:
                self.lag = _api.wait_id(hid, self.name)
            finally:
                self.sent = self.session = None
        elif self.handle is not None:
            handle, self.handle = self.handle, None
            self.lag = -1
            handle.synchronize()

    def drop(self) -> None:
        """Forgets the op without waiting (the job is failing)."""
        self.hid = -1
        self.handle = self.sent = self.session = None

    def __del__(self) -> None:
        # The core may still write into ``sent``: wait before the memory can go.
        if self.hid >= 0 and self.session is _api.session_or_none():
            try:
                self.wait()
            except Exception:  # noqa: BLE001 - nobody can receive it any more
                pass


def _syncs_gradients(ps: Any) -> bool:
    """Whether this rank averages gradients over ``ps``: a member of a set of more than one
    rank; in an elastic job any member, since the world may grow later (the hooks are
    registered only when this holds at construction)."""
    return bool(ps.included() and (ps.size() > 1 or _elastic_enabled()))


class _GradientSync:
    """The hooks, the in-flight push_pulls and the learned order of one optimizer."""

    def __init__(
        self,
        names: Dict[int, str],
        groups: List[Dict[str, Any]],
        compression: Any,
        backward_passes_per_step: int,
        op: ReduceOp,
        gradient_predivide_factor: float,
        process_set: Any = None,
        sparse_as_dense: bool = False,
    ) -> None:
        self.names = names
        self.process_set = process_set
        self.sparse_as_dense = sparse_as_dense
        self.compression = compression
        self.passes_per_step = backward_passes_per_step
        self.op = op
        if op == Average:
            self.prescale = 1.0 / gradient_predivide_factor
            self.postscale = gradient_predivide_factor
        else:
            self.prescale = self.postscale = 1.0
        ps = process_set or global_process_set
        # A rank outside the set trains on its own gradients (Horovod's behaviour).
        self.active = _syncs_gradients(ps)
        # The global set's gradients go straight to the core; other sets through the
        # collective layer (routed parts that only the set's members push).
        self.direct = ps is global_process_set
        # Dense CPU float gradients of the global set skip the collective layer: one core
        # call straight on the gradient's memory, no per-gradient objects (_Entry.hid).
        self.fast = False
        self.scale = 1.0
        self.core_compression: Any = None  # set by _set_fast_path
        self._set_fast_path()
        self.lock = threading.RLock()
        self._ref = weakref.ref(self)
        self.entries: List[_Entry] = []
        self.by_id: Dict[int, _Entry] = {}
        self.order = ForwardOrder([])
        self.sync_id = next(_sync_ids)
        # Priority of each entry, the same on every rank (None: not agreed yet); see
        # _agree_priorities.
        self.agreed: Optional[List[int]] = None
        self.agreements = 0
        self._ranked: List[_Entry] = []  # by_priority's order, for the list ``_ranked_for``
        self._ranked_for: Optional[List[int]] = None
        self.should_synchronize = True
        self.synchronized = False
        # Quorum rounds (docs/guide/async.md, "Catch-up"): the rounds this worker fell behind by
        # in its last synchronize, and the gradients that synchronize waited for.
        self.behind = 0
        self.waited: List[_Entry] = []
        self.rounds = 0  # rounds applied by step(), caught-up ones included
        self.cross: Optional[CrossBarrier] = None  # set by DistributedOptimizer
        # A training algorithm other than plain averaging (algorithms/runner.py); it then
        # also replaces _start and _plan_fusion on this object.
        self.runner: Optional[Runner] = None
        # Tensor fusion of the small gradients (core/worker/fusion_plan.py, set by _plan_fusion).
        self.fusion = FusionPlan(f"optimizer.{self.sync_id}")
        # nn.Linear weights that may travel as sufficient factors (sfb.py); set by
        # DistributedOptimizer(model=...).
        self.sfb: Optional[SufficientFactors] = None
        # In-place replacement (fastps.elastic.inplace): each gradient as it was before its
        # first push in the first step after a commit, by entry index (None: no gradient).
        self.kept: Dict[int, Optional[torch.Tensor]] = {}
        try:
            for gi, group in enumerate(groups):
                self.add_group(gi, group["params"], check=False)
            self._check()
        except BaseException:
            self.close()  # no hooks of a failed wrapper stay on the parameters
            raise

    # ---------------------------------------------------------------- parameters

    def add_group(
        self, group_index: int, params: Iterable[torch.Tensor], check: bool = True
    ) -> None:
        new: List[_Entry] = []
        for pi, p in enumerate(params):
            if id(p) in self.by_id:
                continue
            name = self.names.get(id(p))
            if name is None and self.names:
                raise ValueError(
                    "DistributedOptimizer: named_parameters was given but does not name "
                    f"parameter {pi} of param group {group_index} "
                    f"({str(p.dtype).replace('torch.', '')}{list(p.shape)}); pass all of "
                    "model.named_parameters()"
                )
            name = name or f"param.{group_index}.{pi}"
            e = _Entry(GRAD_PREFIX + name, p, len(self.entries))
            self.entries.append(e)
            self.by_id[id(p)] = e
            new.append(e)
        self.order.add(e.param for e in new)
        if new:
            self.agreed = None  # every rank adds the group, then agrees again
        if self.active:
            for e in new:
                if e.param.requires_grad:
                    e.hook = e.param.register_post_accumulate_grad_hook(self._hook_for(e))
                    _hook_owner[id(e.param)] = self._ref
        if check:
            self._check()

    def _check(self) -> None:
        seen: Dict[str, _Entry] = {}
        for e in self.entries:
            if e.name in seen:
                short = e.name[len(GRAD_PREFIX) :]
                raise ValueError(f"DistributedOptimizer: two parameters are both named '{short}'")
            seen[e.name] = e
        # In an elastic job a process that joins later builds its optimizer while the
        # others train, so nobody would meet it here: the elastic state's sync checks.
        if self.active and not _elastic_enabled():
            self.check_same_everywhere()

    def check_same_everywhere(self) -> None:
        """A collective: every rank must hold the same parameters (names, shapes, dtypes)."""
        check_same_tensors(
            [(e.name[len(GRAD_PREFIX) :], e.param) for e in self.entries],
            "DistributedOptimizer",
            self.process_set,
        )

    def close(self) -> None:
        self.fusion.drop()
        if self.sfb is not None:
            self.sfb.close()
        if self.cross is not None:
            self.cross.close()
        for e in self.entries:
            if e.hook is not None:
                e.hook.remove()
                e.hook = None
                if _hook_owner.get(id(e.param)) is self._ref:
                    del _hook_owner[id(e.param)]
        self.order.stop()

    # ---------------------------------------------------------------- priorities

    def priority(self, e: _Entry) -> int:
        """Larger goes first; once agreed, the same on every rank."""
        if self.agreed is not None:
            return self.agreed[e.index]
        return self._learned_priority(e)

    def _learned_priority(self, e: _Entry) -> int:
        """This rank's view: parameters seen in the forward pass rank by first use, above
        those never seen, which rank by registration order. Both by the one formula
        (``priority_for``); the seen ones n higher, so that every seen parameter goes
        before every unseen one."""
        n = len(self.entries)
        pos = self.order.position(e.param)
        if pos is not None:
            return _collectives.priority_for(pos, n) + n
        return _collectives.priority_for(e.index, n)

    def by_priority(self) -> List[_Entry]:
        """The entries, highest priority first; once the priorities are agreed, sorted once
        per agreement (every cross-barrier step ranks its gradients)."""
        agreed = self.agreed
        if agreed is None:
            return sorted(self.entries, key=self.priority, reverse=True)
        if self._ranked_for is not agreed:
            self._ranked = sorted(self.entries, key=self.priority, reverse=True)
            self._ranked_for = agreed
        return self._ranked

    def parameter_order(self) -> List[str]:
        """Parameter names, highest priority first."""
        ranked = sorted(self.entries, key=self.priority, reverse=True)
        return [e.name[len(GRAD_PREFIX) :] for e in ranked]

    # ---------------------------------------------------------------- communication

    def _hook_for(self, e: _Entry) -> Callable[[torch.Tensor], None]:
        """The post-accumulate-grad hook of ``e``'s parameter. It knows the entry's
        position, so a gradient costs no lookup of its parameter (it runs once per gradient
        and step); it holds neither the entry (which holds the parameter: a cycle) nor the
        sync (a dropped optimizer leaves no live hook)."""
        ref = self._ref
        key = id(e.param)
        index = e.index

        def hook(param: torch.Tensor) -> None:
            me = ref()
            if me is not None and _hook_owner.get(key) is ref:
                me._on_grad(me.entries[index])

        return hook

    def _on_grad(self, e: _Entry) -> None:
        with self.lock:
            if e.deferred and self.cross is not None:
                self.cross.check_gradient(e)  # raises: its previous update still pends
            if e.hid >= 0 or e.handle is not None:
                raise FastPSError(
                    f"the gradient of '{e.name[len(GRAD_PREFIX) :]}' was computed more than "
                    f"backward_passes_per_step={self.passes_per_step} times before "
                    "optimizer.step() or optimizer.synchronize(); raise "
                    "backward_passes_per_step to accumulate more passes locally"
                )
            e.passes += 1
            if _tl.recording():  # no label string per gradient otherwise
                _tl.instant("gradient ready", e.name[len(GRAD_PREFIX) :])
            if e.passes >= self.passes_per_step:
                try:
                    self._start(e)
                except FastPSError:
                    if not _inplace.keeping():
                        raise
                    # The generation failed under the backward pass: synchronize() meets
                    # the failure again (it pushes what is not in flight), where the step
                    # can stay in place.
                    e.drop()

    def _agree_priorities(self) -> None:
        """Makes rank 0's learned priorities everyone's (one small broadcast).

        Every rank reaches this before pushing its first gradient of a step in which the
        priorities are not agreed yet (in a gradient hook or in synchronize), so the
        broadcast meets on every rank; it is named by the sync's creation order.
        """
        mine = np.array([self._learned_priority(e) for e in self.entries], dtype=np.int64)
        name = f"fastps.priorities.{self.sync_id}.{self.agreements}"
        self.agreements += 1
        if self.direct:
            agreed = _api.broadcast(mine, 0, name=name)
        else:  # among the process set's ranks only, from its first rank
            ps = self.process_set
            agreed = _collectives.broadcast_async(
                mine, "int64", ps.ranks[0], name, ps
            ).synchronize()
        self.agreed = [int(p) for p in agreed]

    def _start(self, e: _Entry) -> None:
        if not _inplace.keeping():
            self._push(e)
            return
        # The first step after a commit: keep the gradient as it is before it is summed in
        # place, so a lost peer's spare can be met with this step's gradients again.
        g = e.param.grad
        if g is not None and g.layout != torch.strided:
            _inplace.block(f"the gradient of '{e.name[len(GRAD_PREFIX) :]}' is sparse")
        elif self.sfb is not None:
            _inplace.block("gradients travel as sufficient factors")
        elif self.cross is not None:
            _inplace.block("cross-barrier updates (an update may still be deferred)")
        elif e.index not in self.kept:  # a push that failed may have scaled it already
            self.kept[e.index] = None if g is None else g.detach().clone()
        st = _api.session_or_none()
        before = st.submitted if st is not None else 0
        try:
            self._push(e)
        finally:
            if st is not None:
                _inplace.account(st.submitted - before)

    def _push(self, e: _Entry) -> None:
        if self.agreed is None:
            self._agree_priorities()
        if self.sfb is not None:
            self.sfb.decide(self.sync_id)  # once, collective: see sfb.py
            if self.sfb.chosen(e.param):
                e.handle = self.sfb.start(e.param, self.prescale * self.scale)
                return
        self.fusion.claim(e.name)  # another optimizer's plan fusing this name goes first
        p = e.param
        grad = p.grad
        if grad is None:
            # Another rank may have a gradient for it (dynamic graphs): send zeros.
            grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
            p.grad = grad
        elif grad.layout != torch.strided:
            if not self.sparse_as_dense:
                e.handle = self._sparse(e, grad)
                return
            grad = grad.to_dense()
            p.grad = grad
            # Reduced densely, handed back sparse: sparse-only optimizers keep working.
            dense = self._dense(e, grad, fast=False)
            assert dense is not None
            e.handle = Handle(e.name, [dense], lambda: self._resparse(e, dense, grad))
            return
        e.handle = self._dense(e, grad)

    def _resparse(self, e: _Entry, dense: Handle, grad: torch.Tensor) -> torch.Tensor:
        dense.synchronize()  # reduced in place into ``grad``
        return _hand_back(e, grad.to_sparse())

    def _dense(self, e: _Entry, grad: torch.Tensor, fast: bool = True) -> Optional[Handle]:
        """Starts the gradient's push_pull; None when it went the fast path (``e.hid``)."""
        if (
            fast
            and self.fast
            and grad.is_cpu
            and grad.is_contiguous()
            and not _api.in_submission_batch()  # there the batch starts it (a Handle)
        ):
            dtype = _FAST_DTYPES.get(grad.dtype)
            if dtype is not None:
                if self.prescale != 1.0:
                    grad.mul_(self.prescale)
                e.sent = grad
                e.session = _api.session_or_none()
                e.hid = _api.push_pull_inplace_id(
                    grad.data_ptr(),
                    grad.numel() * grad.element_size(),
                    dtype,
                    grad.shape,  # a torch.Size is a tuple
                    e.name,
                    self.priority(e),
                    self.scale,
                    self.core_compression,
                    quorum=True,
                )
                return None
        if self.direct:
            return _allreduce_start(
                grad,
                True,
                e.name,
                self.op,
                self.prescale,
                self.postscale,
                self.compression,
                self.priority(e),
            )
        return _allreduce_op(
            grad,
            True,
            e.name,
            self.op,
            self.prescale,
            self.postscale,
            self.process_set,
            self.compression,
            self.priority(e),
        )

    def _sparse(self, e: _Entry, grad: torch.Tensor) -> Handle:
        """A sparse gradient stays sparse: indices and values are gathered and summed."""
        # with its forward-order priority: a sparse embedding is the first layer the next
        # forward pass needs (cross-barrier) though backward produces it last
        # Handed back uncoalesced, as Horovod does: the optimizers sum duplicates themselves
        # (SGD's sparse add) or coalesce first (Adagrad, SparseAdam).
        inner = _sparse_allreduce(
            grad, e.name, self.op, self.process_set, self.priority(e), coalesce=False
        )

        def finish() -> torch.Tensor:
            return _hand_back(e, inner.synchronize())

        return Handle(e.name, [inner], finish)

    def in_flight(self) -> List[str]:
        """Gradients being averaged for a step() not yet called."""
        return [
            e.name[len(GRAD_PREFIX) :]
            for e in self.entries
            if (e.hid >= 0 or e.handle is not None) and not e.deferred  # busy, every zero_grad
        ]

    def start_missing(self) -> None:
        """Starts the push_pull of every gradient whose hook has not (fewer backward
        passes than expected, parameters without a gradient)."""
        missing = [
            e
            for e in self.entries
            if e.hid < 0 and e.handle is None and e.param.requires_grad  # not busy
        ]
        missing.sort(key=self.priority, reverse=True)
        for e in missing:
            self._start(e)
        self._plan_fusion()

    def _plan_fusion(self) -> None:
        """Fuses the small gradients from the next step on (csrc/worker/fusion.h).

        Called once every gradient of a step has started, so every rank reaches it after
        the same pushes: a plan that changed (a parameter frozen, a group added) pushes the
        buckets it leaves half-filled with zeros for the missing members on every rank
        alike. The rows are what the first step pushed: dense gradients, with their agreed
        priorities; sparse ones and compressed ones (another dtype on the wire) travel alone.
        Under an algorithm the rows are only the gradients it averaged this round through
        the built-in path (``Context.average``): its other exchanges carry names of their
        own, and a round that averages another set replaces the plan.
        """
        averaged = self.runner.take_averaged() if self.runner is not None else None
        if not (self.direct and self.active and self.agreed is not None):
            return
        if self.compression is not Compression.none or not _api.fusion_enabled():
            return
        # once per step over every parameter: a tight loop, and FusionPlan.update returns
        # at once when the rows are the ones already set (the usual case)
        rows = []
        agreed = self.agreed
        sfb = self.sfb
        strided = torch.strided
        for e in self.entries:
            if averaged is not None and e.index not in averaged:
                continue
            p = e.param
            g = p.grad
            if g is None or not p.requires_grad or g.layout != strided:
                continue
            if sfb is not None and sfb.chosen(p):
                continue  # allgathered as factors, never pushed
            dtype = _FAST_DTYPES.get(g.dtype) or core_dtype(g, e.name)
            rows.append((e.name, g.numel() * g.element_size(), dtype, agreed[e.index]))
        self.fusion.update(rows)

    def synchronize(self) -> None:
        if self.active:
            with self.lock:
                if self.cross is not None:
                    self.cross.finish()  # the previous step's updates come first
                self.start_missing()
                pending = [e for e in self.entries if e.busy]
            pending.sort(key=self.priority, reverse=True)
            started = _tl.start()
            self.behind, self.waited = 0, []
            try:
                for e in pending:
                    e.wait()
                _tl.end("step waited for sums", f"{len(pending)} gradients", started)
            finally:
                for e in pending:
                    e.drop()  # after a failure: forget what was not waited for
                if self.runner is not None:
                    self.runner.discard()  # the next round starts afresh, failed or not
            if self.runner is not None:
                self.runner.after_backward()
            if pending and _api.quorum_catch_up():
                # Rounds closed for every gradient (the least lag): the catch-up fetches
                # them all alike. Any gradient off the fast path: no catch-up (-1).
                self.behind = _catch_up.least_lag(e.lag for e in pending)
                self.waited = pending
        self.reset_passes()
        if self.order.learning and self.order.seen:
            self.order.stop()
        self.synchronized = True

    def synchronize_or_replace(self) -> None:
        """``synchronize()``; when a peer was lost in the first step after a commit and
        a spare takes its place in place (fastps.elastic.inplace), this step's gradients
        are summed again with the spare's and it returns normally."""
        try:
            self.synchronize()
        except FastPSError as exc:
            if not _inplace.replace_in_place(exc, self.redo):
                raise

    def redo(self) -> None:
        """Pushes this step's gradients again, from the copies taken before their first
        push, in the generation just joined (every rank, the spare too, starts afresh)."""
        kept, self.kept = self.kept, {}
        self.abandon()
        for index, g in kept.items():
            p = self.entries[index].param
            if g is None:
                p.grad = None
            elif p.grad is not None and p.grad.shape == g.shape and p.grad.dtype == g.dtype:
                p.grad.copy_(g)
            else:
                p.grad = g
        self.synchronize()
        self.kept = {}

    def fetch_next_round(self) -> int:
        """Catch-up (docs/guide/async.md): writes into each gradient the sum of its next round,
        which closed without this worker, from the servers' history (nothing is pushed or
        counted); returns how many rounds closed after that one, the least over them."""
        targets: List[_catch_up.Target] = []
        for e in self.waited:
            g = e.param.grad
            assert g is not None and g.is_contiguous()  # the fast path pushed it
            targets.append(
                _catch_up.Target(
                    g.data_ptr(),
                    g.numel() * g.element_size(),
                    _FAST_DTYPES[g.dtype],
                    tuple(g.shape),
                    e.name,
                    self.priority(e),
                    self.scale,
                )
            )
        return _catch_up.fetch_round(targets)

    def _set_fast_path(self) -> None:
        """Whether gradients may take the fast path, and the factor the core applies to
        their sums (the world size can change: elastic resets)."""
        ps = self.process_set or global_process_set
        plain = self.compression in (None, Compression.none) or is_core(self.compression)
        # what the fast path hands to the core with each gradient (decided once, not per call)
        self.core_compression = self.compression if is_core(self.compression) else None
        self.fast = self.direct and plain and self.active
        size = ps.size() if self.active else 1
        self.scale = self.postscale * (1.0 / size if self.op == Average else 1.0)

    def reset_passes(self) -> None:
        for e in self.entries:
            e.passes = 0

    def abandon(self) -> None:
        """Elastic reset: the generation these push_pulls ran in is gone, so drop them, and
        agree the priorities again with the new world (a joining rank has none yet)."""
        with self.lock:
            if self.cross is not None:
                self.cross.discard()  # their updates go with them (the state rolls back)
            if self.runner is not None:
                self.runner.discard()
            for e in self.entries:
                e.drop()
                e.deferred = False
                e.passes = 0
            self.kept = {}
            self.agreed = None
            self.agreements = 0
            self.synchronized = False
            self.behind, self.waited = 0, []
            # The new generation's core has no fusion plan: every rank, joiners included,
            # sets it again after the first step (_plan_fusion), so all fuse alike.
            self.fusion.forget()
            if self.sfb is not None:
                self.sfb.drop_pending()
            self.active = _syncs_gradients(self.process_set or global_process_set)
            self._set_fast_path()


def _hand_back(e: _Entry, result: torch.Tensor) -> torch.Tensor:
    """A sum that arrives as a new tensor (sparse gradients) becomes the parameter's
    gradient. For an update deferred past step() it is also what the update applies, and
    the parameter keeps whatever gradient it was given since (zero_grad may have let go of
    the one this sum replaces)."""
    with quiet():
        if e.deferred:
            if e.param.grad is e.grad:
                e.param.grad = result
            e.grad = result
        else:
            e.param.grad = result
    return result


class _DistributedMixin:
    """Methods the distributed subclass puts in front of the wrapped optimizer's class."""

    _fastps: _GradientSync

    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """Waits for every gradient's push_pull (unless inside ``skip_synchronize()`` or
        after an explicit ``synchronize()``), then runs the wrapped optimizer's step.

        With cross-barrier updates, returns at once instead: each parameter is updated
        when its sum has arrived and, at the latest, before its module's next forward."""
        sync = self._fastps
        if sync.should_synchronize and sync.synchronized and sync.active:
            warnings.warn(
                "optimizer.step() called without optimizer.skip_synchronize() context after "
                "optimizer.synchronize(). This can cause training slowdown. You may want to "
                "consider using optimizer.skip_synchronize() context if you use "
                "optimizer.synchronize() in your code.",
                stacklevel=2,
            )
        cross = sync.cross
        if (
            cross is not None
            and closure is None
            and sync.should_synchronize
            and not sync.synchronized
            and cross.usable(self)
        ):
            cross.defer_step(self)
            _inplace.update_applied()  # deferred, but no longer the committed state
            sync.rounds += 1
            if sync.active:
                freeze_once()
            return None
        if sync.should_synchronize and not sync.synchronized:
            sync.synchronize_or_replace()
        elif cross is not None:
            cross.finish()
        sync.synchronized = False
        started = _tl.start()
        _inplace.update_applied()
        sync.kept = {}
        result = super().step(closure)  # type: ignore[misc]
        sync.rounds += 1
        if sync.runner is not None and sync.active:
            sync.runner.after_step()
        _tl.end("optimizer applied", f"{len(sync.entries)} parameters", started)
        # Quorum rounds: the rounds that closed without this worker since the one just
        # applied are applied too, in turn, as every other replica did (docs/guide/async.md,
        # "Catch-up"); its next gradient is then computed on parameters at most a round old.
        # Exactly the rounds the answer named, not those that closed meanwhile: a worker
        # whose link cannot carry the sums as fast as rounds close would chase them for
        # good and never compute a gradient again.
        behind, sync.behind = sync.behind, 0
        if behind:

            def fetch() -> int:
                started = _tl.start()
                sync.fetch_next_round()
                return started

            def apply(started: int) -> None:
                super(_DistributedMixin, self).step()  # type: ignore[misc]
                sync.rounds += 1
                _tl.end("caught up a round", f"{len(sync.waited)} gradients", started)

            _catch_up.catch_up(behind, fetch, apply)
        if sync.active:
            freeze_once()  # the long-lived heap exists now (heap.py)
        return result

    def _step_on(self, groups: List[Dict[str, Any]]) -> None:
        """Runs the wrapped optimizer's step on ``groups`` (a subset of the parameters with
        their step's hyperparameters) instead of ``param_groups``."""
        saved = self.__dict__["param_groups"]
        self.__dict__["param_groups"] = groups
        step = super().step.__func__  # type: ignore[misc]
        if getattr(step, "hooked", False):
            # torch's wrapper that runs step hooks: a deferred update belongs to a step()
            # that ran without hooks (CrossBarrier.usable), so hooks registered since wait
            # for the next step.
            step = step.__wrapped__
        try:
            step(self)
        finally:
            self.__dict__["param_groups"] = saved

    def synchronize(self) -> None:
        """Finishes averaging every gradient now (e.g. before clipping them); with
        cross-barrier updates it first applies every update a previous step deferred, so
        afterwards parameters and optimizer state may be read directly."""
        self._fastps.synchronize_or_replace()

    def wait_for_updates(self) -> None:
        """Applies every update a cross-barrier ``step()`` deferred (waiting for their
        sums); afterwards parameters and optimizer state may be read directly. Starts no
        communication (unlike ``synchronize()``, which also averages the current
        gradients). A no-op without cross-barrier updates."""
        cross = self._fastps.cross
        if cross is not None:
            cross.finish()

    def state_dict(self) -> Dict[str, Any]:
        cross = self._fastps.cross
        if cross is not None:
            cross.finish()
        return super().state_dict()  # type: ignore[misc]

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        cross = self._fastps.cross
        if cross is not None:
            cross.finish()
        super().load_state_dict(state_dict)  # type: ignore[misc]

    @property
    def cross_barrier(self) -> bool:
        """True if step() defers updates to the next forward pass."""
        return self._fastps.cross is not None

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Inside this context ``step()`` does not synchronize; use it after an explicit
        ``synchronize()``::

            loss.backward()
            optimizer.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            with optimizer.skip_synchronize():
                optimizer.step()
        """
        sync = self._fastps
        sync.should_synchronize = False
        try:
            yield
        finally:
            sync.should_synchronize = True

    def zero_grad(self, set_to_none: bool = True) -> None:
        sync = self._fastps
        busy = sync.in_flight()
        if busy:
            raise FastPSError(
                "optimizer.zero_grad() was called while gradients are still being averaged "
                f"({', '.join(busy[:3])}{', ...' if len(busy) > 3 else ''}): call it before "
                "loss.backward() or after optimizer.step()/synchronize()"
            )
        sync.reset_passes()
        if sync.cross is None:
            super().zero_grad(set_to_none)  # type: ignore[misc]
            return
        with quiet():  # not a read of the pending parameters' values
            held = sync.cross.hold_grads(set_to_none)
            try:
                super().zero_grad(set_to_none)  # type: ignore[misc]
            finally:
                sync.cross.give_back(held)

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        sync = self.__dict__.get("_fastps")
        if sync is not None and sync.cross is not None:
            sync.cross.finish()
        super().add_param_group(param_group)  # type: ignore[misc]
        if sync is not None:
            groups = self.param_groups  # type: ignore[attr-defined]
            sync.add_group(len(groups) - 1, groups[-1]["params"])

    def set_backward_passes_per_step(self, passes: int) -> None:
        if passes < 1:
            raise ValueError(f"backward_passes_per_step must be >= 1, got {passes}")
        self._fastps.passes_per_step = int(passes)

    @property
    def backward_passes_per_step(self) -> int:
        return self._fastps.passes_per_step

    @property
    def applied_rounds(self) -> int:
        """Rounds of averaged gradients this optimizer applied, the same count on every
        replica after the same rounds. Under quorum rounds a slow worker catches up several
        rounds in one ``step()`` (docs/guide/async.md, "Catch-up"), so it makes fewer steps than
        its peers for the same rounds: a training loop that must end on every worker
        together counts these (``while opt.applied_rounds < total``), not its own steps.
        """
        return self._fastps.rounds

    def parameter_order(self) -> List[str]:
        """Parameter names in the order their gradients are prioritised (first = sent
        first): the forward order learned in the first iteration."""
        return self._fastps.parameter_order()

    @property
    def _parameter_names(self) -> Dict[torch.Tensor, str]:
        """Horovod's mapping of each parameter to the name its gradient travels under."""
        return {e.param: e.name[len(GRAD_PREFIX) :] for e in self._fastps.entries}


# The wrapped class's step is already instrumented by torch (step hooks, profiling); keep
# torch from instrumenting this one too, or step hooks would run twice.
_DistributedMixin.step.hooked = True  # type: ignore[attr-defined]

_classes: Dict[type, Type[Any]] = {}
_ADOPT_SKIP = ("step", "zero_grad", "_opt_called", "_fastps")


def _distributed_class(base: type) -> Type[Any]:
    cls = _classes.get(base)
    if cls is None:
        cls = type(
            f"Distributed{base.__name__}", (_DistributedMixin, base), {"__module__": __name__}
        )
        _classes[base] = cls
    return cls


def _parameter_names(
    named_parameters: Optional[Iterable[Tuple[str, torch.Tensor]]],
) -> Dict[int, str]:
    names: Dict[int, str] = {}
    if named_parameters is None:
        return names
    taken: Dict[str, int] = {}
    for item in named_parameters:
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise ValueError(
                "named_parameters must be (name, parameter) pairs, as "
                "model.named_parameters() yields"
            )
        name, p = item
        if name in taken and taken[name] != id(p):
            raise ValueError(f"named_parameters names two parameters '{name}'")
        taken[name] = id(p)
        names.setdefault(id(p), str(name))
    return names


def _default_compression(compression: Any) -> Any:
    """``compression``, or FASTPS_COMPRESSION's choice where it is none."""
    if compression not in (None, Compression.none):
        return compression
    chosen = default_compressor(_api.config()) if _api.is_initialized() else None
    return chosen or Compression.none


def DistributedOptimizer(
    optimizer: torch.optim.Optimizer,
    named_parameters: Optional[Iterable[Tuple[str, torch.Tensor]]] = None,
    compression: Any = Compression.none,
    backward_passes_per_step: int = 1,
    op: int = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    sparse_as_dense: bool = False,
    process_set: Any = None,
    cross_barrier: Optional[bool] = None,
    model: Optional[torch.nn.Module] = None,
    algorithm: Any = None,
    **kwargs: Any,
) -> Any:
    """Wraps ``optimizer`` so that ``step()`` applies gradients averaged over all ranks.

    ``named_parameters``: ``model.named_parameters()``; the names identify gradients across
    ranks and appear in error messages (unnamed parameters are named by their position).
    ``compression``: ``Compression.none``, ``Compression.fp16`` (a cast), or one of the
    core's compressors (``Compression.onebit``, ``.topk(k, error_feedback=True)``, ...,
    docs/guide/compression.md); ``Compression.none`` takes ``FASTPS_COMPRESSION`` when set.
    ``backward_passes_per_step``: backward passes accumulated locally per communication.
    ``op``: ``Average`` (default), ``Sum`` or ``Adasum`` (Horovod's delta optimizer:
    each rank steps locally in the gradient hooks and ``step()`` applies the Adasum of the
    ranks' updates, ``adasum_optimizer.py``). ``gradient_predivide_factor``: with Average,
    gradients are divided by this factor before the sum and by ``size/factor`` after.
    ``num_groups``/``groups`` (Horovod's manual fusion) are accepted and ignored: the core
    partitions, schedules and fuses tensors itself (FASTPS_FUSION_THRESHOLD).
    ``sparse_as_dense``: sparse gradients are made dense first; otherwise they stay sparse
    (indices and values gathered and summed).
    ``cross_barrier`` (default: ``FASTPS_CROSS_BARRIER``, on): ``step()`` returns without
    waiting; each parameter is updated as its sum arrives and before its module's next
    forward pass or any read of it (``cross_barrier.py``). Where that could differ from the
    synchronous step (optimizers whose step may couple parameters, ops other than
    Average/Sum, parameter classes with their own ``__torch_function__``) steps stay
    synchronous, with a warning if cross-barrier was asked for explicitly.
    ``model``: the model whose ``nn.Linear`` weights may be synchronised as sufficient
    factors instead of through the servers (``FASTPS_SFB=auto|on``, default off; see
    ``sfb.py`` and docs/guide/sfb.md).

    ``algorithm``: a ``fastps.torch.algorithms.Algorithm`` (docs/guide/algorithms.md);
    default: the one the optimizer names (``OneBitAdam``), else synchronous gradient
    averaging (``GradientAveraging``, this function's own path). Another algorithm runs
    with op=Average, synchronous steps (no cross-barrier), no tensor fusion and no
    sufficient factors, and decides compression itself.

    ``async=True`` (``**{"async": True}``, or ``asynchronous=True``; default: FASTPS_MODE):
    asynchronous training against parameters the servers keep (``async_optimizer.py``,
    docs/guide/async.md); the other arguments then do not apply.

    The result is an instance of a subclass of ``type(optimizer)`` sharing its state.
    """
    if async_requested(kwargs, _api.mode() if _api.is_initialized() else "sync"):
        if algorithm is not None:
            raise ValueError(
                f"DistributedOptimizer: algorithm={algorithm!r} cannot run asynchronously"
            )
        return make_async_optimizer(optimizer, named_parameters)
    if isinstance(optimizer, (_DistributedMixin, _AdasumMixin)):
        raise ValueError("this optimizer is already a fastps DistributedOptimizer")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"expected a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
    rop = _resolve_op(op, None)
    if rop not in (Average, Sum, Adasum):
        raise FastPSError(
            "DistributedOptimizer supports op=Average, op=Sum or op=Adasum, not "
            f"{rop.name.capitalize()}"
        )
    if gradient_predivide_factor != 1.0 and rop != Average:
        raise ValueError("gradient_predivide_factor requires op=Average")
    if gradient_predivide_factor <= 0:
        raise ValueError("gradient_predivide_factor must be positive")
    del num_groups, groups
    compression, algo = _resolve_algorithm(algorithm, compression, optimizer)
    if algo is not None:
        if rop != Average:
            raise FastPSError(
                f"DistributedOptimizer: algorithm {algo.name} runs with op=Average only"
            )
        if _api.is_initialized() and _api.quorum_catch_up():
            raise FastPSError(
                f"DistributedOptimizer: algorithm {algo.name} cannot catch up on quorum rounds "
                "(FASTPS_QUORUM_CATCH_UP)"
            )
        if enabled(cross_barrier) and explicit(cross_barrier):
            warnings.warn(
                f"fastps: cross-barrier updates off: algorithm {algo.name} steps synchronously",
                stacklevel=2,
            )
        cross_barrier, model = False, None
    if rop == Adasum:
        if is_core(compression):
            raise FastPSError(
                "DistributedOptimizer: op=Adasum combines whole gradients on each rank; the "
                f"core's compressors ({compression!r}) apply to Sum/Average only"
            )
        if _syncs_gradients(process_set or global_process_set):
            if enabled(cross_barrier) and explicit(cross_barrier):
                warnings.warn(
                    "fastps: cross-barrier updates off: op=Adasum steps each parameter in "
                    "its gradient hook",
                    stacklevel=2,
                )
            return adasum_optimizer(
                optimizer,
                _parameter_names(named_parameters),
                compression or Compression.none,
                int(backward_passes_per_step),
                process_set,
                _ADOPT_SKIP,
                check=not _elastic_enabled(),
            )
        rop = Sum  # alone (or outside the set): the Adasum of one update is that update
    deferred = choose(
        cross_barrier,
        optimizer,
        [p for g in optimizer.param_groups for p in g["params"]],
        rop in (Average, Sum),
        _elastic_enabled(),
    )

    sync = _GradientSync(
        _parameter_names(named_parameters),
        optimizer.param_groups,
        _default_compression(compression),
        int(backward_passes_per_step),
        rop,
        float(gradient_predivide_factor),
        process_set,
        bool(sparse_as_dense),
    )
    choice = sfb_choice(
        "DistributedOptimizer",
        model,
        "nn.Linear layers",
        active=sync.active,
        compressed=sync.compression not in (None, Compression.none),
        elastic=_elastic_enabled(),
        stacklevel=2,
    )
    if choice is not None and model is not None:  # a choice is made for a model only
        try:
            sync.sfb = SufficientFactors(
                model,
                {pid: sync.by_id[pid].name[len(GRAD_PREFIX) :] for pid in sync.by_id},
                choice.how,
                process_set or global_process_set,
                sync.direct,
                sync.passes_per_step,
                choice.why_not,
            )
        except BaseException:
            sync.close()
            raise
    cls: Any = _distributed_class(type(optimizer))
    wrapped = cls.__new__(cls)
    wrapped.__dict__.update({k: v for k, v in optimizer.__dict__.items() if k not in _ADOPT_SKIP})
    wrapped._fastps = sync
    if deferred and sync.sfb is not None:
        # sfb.py rebuilds the sum into param.grad when it arrives, which a deferred update
        # (whose parameter may have let go of that gradient in zero_grad) cannot follow
        deferred = False
        if explicit(cross_barrier):
            warnings.warn(
                "fastps: cross-barrier updates off: FASTPS_SFB is on; step() waits for every "
                "gradient",
                stacklevel=2,
            )
    if deferred and _api.is_initialized() and _api.quorum_catch_up():
        # A slow worker catches up on whole rounds in step() (docs/guide/async.md, "Catch-up"),
        # applying every parameter's sum of a round before fetching the next
        deferred = False
        if explicit(cross_barrier):
            warnings.warn(
                "fastps: cross-barrier updates off: FASTPS_QUORUM_CATCH_UP is on; step() waits "
                "for every gradient and catches up on rounds that closed without this worker",
                stacklevel=2,
            )
    if deferred and sync.active:
        sync.cross = CrossBarrier(sync, wrapped, cls._step_on, explicit(cross_barrier))
    if algo is not None:
        _attach(sync, algo, wrapped)
    weakref.finalize(wrapped, sync.close)
    if sync.active:
        collect_early()  # the freeze at the first step is then cheap (heap.py)
    return wrapped


def _attach(sync: _GradientSync, algo: Any, wrapped: Any) -> None:
    """Hands the gradient hooks of ``sync`` to ``algo`` (algorithms/runner.py)."""
    runner = Runner(algo, sync, wrapped)
    try:
        algo.setup(runner)
    except BaseException:
        sync.close()
        raise
    sync.runner = runner
    # Instance attributes in front of the methods: the averaging path keeps its own code
    # and pays nothing for the algorithm API.
    sync._start = runner.start  # type: ignore[method-assign]
