"""``DistributedOptimizer(op=Adasum)``: Horovod's delta optimizer.

Adasum (``core/collectives/adasum.py``) combines *updates*, not gradients: with a stateful optimizer
(momentum, Adam) the combined quantity must be what each rank's optimizer would do on its
own. So, as Horovod's ``_DistributedAdasumOptimizer`` does, each rank steps its wrapped
optimizer on one parameter the moment that parameter's gradient is ready (in the
post-accumulate-grad hook, with the parameter's own param group hyperparameters)::

    start = p                    # before the local step
    p     = step(p, grad)        # the wrapped optimizer, this parameter only
    delta = p - start            # this rank's update
    p     = start                # the parameter is left as it was until step()
    delta = adasum(delta over the ranks)      (started here, never waited for here)

and ``step()`` waits for each combined delta and applies ``p = start + delta``. Optimizer
state (momentum buffers, Adam moments) stays each rank's own, built from its own gradients.
The deltas travel through the collective layer's Adasum allreduce (``core/collectives/ops.py``),
so any process set works, and the parameters keep their value while the deltas are in
flight (Horovod's version keeps the delta in the parameter meanwhile).

Differences from the averaging optimizer, as in Horovod: ``synchronize()`` does nothing
(there is nothing to average before ``step()``: gradients stay local), and
``skip_synchronize()`` raises. One rank alone (or a rank outside the process set) gets the
plain optimizer: the Adasum of one update is that update.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Dict, Iterable, List, NoReturn, Optional, Type

import torch
from fastps.collectives import ops as _collectives
from fastps.errors import FastPSError
from fastps.torch.functions import check_same_tensors
from fastps.torch.ops import Adasum, Handle, _allreduce_op, global_process_set

GRAD_PREFIX = "grad."


class _Entry:
    """One parameter: its name on the wire and its combined delta in flight."""

    __slots__ = ("name", "param", "index", "passes", "handle", "hook")

    def __init__(self, name: str, param: torch.Tensor, index: int) -> None:
        self.name = name
        self.param = param
        self.index = index
        self.passes = 0
        self.handle: Optional[Handle] = None
        self.hook: Any = None


class _AdasumSync:
    """The hooks and the deltas in flight of one Adasum optimizer."""

    def __init__(
        self,
        names: Dict[int, str],
        compression: Any,
        backward_passes_per_step: int,
        process_set: Any,
    ) -> None:
        self.names = names
        self.compression = compression
        self.passes_per_step = backward_passes_per_step
        self.process_set = process_set or global_process_set
        self.active = True  # only constructed for a member of a set of several ranks
        self.lock = threading.RLock()
        self.entries: List[_Entry] = []
        self.by_id: Dict[int, _Entry] = {}
        self.optimizer: Optional[Callable[[], Any]] = None  # weakref to the wrapper

    def add_group(self, group_index: int, params: Iterable[torch.Tensor]) -> None:
        ref = weakref.ref(self)

        def hook(param: torch.Tensor) -> None:
            me = ref()
            if me is not None:
                me.on_grad(param)

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
            short = name or f"param.{group_index}.{pi}"
            if any(o.name == GRAD_PREFIX + short for o in self.entries):
                raise ValueError(f"DistributedOptimizer: two parameters are both named '{short}'")
            if p.requires_grad and not p.is_floating_point():  # complex: no Adasum
                raise _collectives.UsageError(
                    f"DistributedOptimizer(op=Adasum): parameter '{short}' is "
                    f"{str(p.dtype).replace('torch.', '')}; Adasum combines real "
                    "floating-point updates only"
                )
            e = _Entry(GRAD_PREFIX + short, p, len(self.entries))
            self.entries.append(e)
            self.by_id[id(p)] = e
            if p.requires_grad:
                e.hook = p.register_post_accumulate_grad_hook(hook)

    def check_same_everywhere(self) -> None:
        """A collective: every rank must hold the same parameters (names, shapes, dtypes)."""
        check_same_tensors(
            [(e.name[len(GRAD_PREFIX) :], e.param) for e in self.entries],
            "DistributedOptimizer",
            self.process_set,
        )

    def priority(self, e: _Entry) -> int:
        """The same on every rank: registration order (the first parameter goes first)."""
        return _collectives.priority_for(e.index, len(self.entries))

    def on_grad(self, param: torch.Tensor) -> None:
        e = self.by_id.get(id(param))
        if e is None:
            return
        with self.lock:
            if e.handle is not None:
                raise FastPSError(
                    f"the gradient of '{e.name[len(GRAD_PREFIX) :]}' was computed more than "
                    f"backward_passes_per_step={self.passes_per_step} times before "
                    "optimizer.step(); raise backward_passes_per_step to accumulate more "
                    "passes locally"
                )
            e.passes += 1
            if e.passes >= self.passes_per_step:
                self.start(e)

    def start(self, e: _Entry) -> None:
        """Steps the wrapped optimizer on ``e``'s parameter alone, puts the parameter back
        and starts the Adasum allreduce of the difference."""
        wrapper = self.optimizer() if self.optimizer is not None else None
        if wrapper is None:
            raise FastPSError("DistributedOptimizer(op=Adasum): the optimizer is gone")
        p = e.param
        groups = [dict(g, params=[p]) for g in wrapper.param_groups if _holds(g, p)]
        with torch.no_grad():
            start = p.detach().clone(memory_format=torch.contiguous_format)
            wrapper._step_on(groups)
            delta = p.detach().sub(start)
            p.detach().copy_(start)
        e.handle = _allreduce_op(
            delta,
            True,
            e.name,
            Adasum,
            1.0,
            1.0,
            self.process_set,
            self.compression,
            self.priority(e),
        )

    def finish(self) -> None:
        """Starts the deltas of parameters whose hook has not fired (no gradient this
        step, or fewer backward passes: other ranks may have one), waits for every
        combined delta and applies it."""
        with self.lock:
            for e in self.entries:
                if e.handle is None and e.param.requires_grad:
                    self.start(e)
            pending = [e for e in self.entries if e.handle is not None]
        try:
            for e in pending:
                assert e.handle is not None
                delta = e.handle.synchronize()
                with torch.no_grad():
                    e.param.detach().add_(delta.view_as(e.param))
        finally:
            for e in self.entries:
                e.handle = None  # after a failure: forget what was not waited for
                e.passes = 0

    def in_flight(self) -> List[str]:
        return [e.name[len(GRAD_PREFIX) :] for e in self.entries if e.handle is not None]

    def abandon(self) -> None:
        """Elastic reset: the deltas of the failed generation are gone."""
        with self.lock:
            for e in self.entries:
                e.handle = None
                e.passes = 0
            ps = self.process_set
            self.active = bool(ps.included())

    def close(self) -> None:
        for e in self.entries:
            if e.hook is not None:
                e.hook.remove()
                e.hook = None


def _holds(group: Dict[str, Any], p: torch.Tensor) -> bool:
    return any(q is p for q in group["params"])


class _AdasumMixin:
    """Methods the Adasum subclass puts in front of the wrapped optimizer's class."""

    _fastps: _AdasumSync

    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """Applies every parameter's combined update (``start + adasum(delta)``); the
        local steps already ran in the gradient hooks."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._fastps.finish()
        return loss

    def _step_on(self, groups: List[Dict[str, Any]]) -> None:
        """Runs the wrapped optimizer's own step on ``groups`` instead of ``param_groups``."""
        saved = self.__dict__["param_groups"]
        self.__dict__["param_groups"] = groups
        try:
            super().step()  # type: ignore[misc]
        finally:
            self.__dict__["param_groups"] = saved

    def synchronize(self) -> None:
        """Nothing to do: with Adasum the gradients stay local and the updates are combined
        in ``step()`` (Horovod's behaviour)."""

    def skip_synchronize(self) -> NoReturn:
        """Refused, as in Horovod: there is no synchronize() to skip."""
        raise AssertionError(
            "Skipping synchronization is not supported when using Adasum optimizer."
        )

    def zero_grad(self, set_to_none: bool = True) -> None:
        busy = self._fastps.in_flight()
        if busy:
            raise FastPSError(
                "optimizer.zero_grad() was called while updates are still being combined "
                f"({', '.join(busy[:3])}{', ...' if len(busy) > 3 else ''}): call it before "
                "loss.backward() or after optimizer.step()"
            )
        for e in self._fastps.entries:
            e.passes = 0
        super().zero_grad(set_to_none)  # type: ignore[misc]

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        super().add_param_group(param_group)  # type: ignore[misc]
        sync = self.__dict__.get("_fastps")
        if sync is not None:
            groups = self.param_groups  # type: ignore[attr-defined]
            sync.add_group(len(groups) - 1, groups[-1]["params"])
            sync.check_same_everywhere()

    def set_backward_passes_per_step(self, passes: int) -> None:
        if passes < 1:
            raise ValueError(f"backward_passes_per_step must be >= 1, got {passes}")
        self._fastps.passes_per_step = int(passes)

    @property
    def backward_passes_per_step(self) -> int:
        return self._fastps.passes_per_step

    @property
    def cross_barrier(self) -> bool:
        return False

    def wait_for_updates(self) -> None:
        """Nothing is deferred past ``step()`` with Adasum."""

    @property
    def _parameter_names(self) -> Dict[torch.Tensor, str]:
        return {e.param: e.name[len(GRAD_PREFIX) :] for e in self._fastps.entries}


_AdasumMixin.step.hooked = True  # type: ignore[attr-defined]  # see optimizer.py

_classes: Dict[type, Type[Any]] = {}


def adasum_optimizer(
    optimizer: torch.optim.Optimizer,
    names: Dict[int, str],
    compression: Any,
    backward_passes_per_step: int,
    process_set: Any,
    adopt_skip: Iterable[str],
    check: bool,
) -> Any:
    """Wraps ``optimizer`` (a subclass of its class sharing its state, as the averaging
    optimizer does). ``check``: compare the parameters across ranks now (a collective)."""
    sync = _AdasumSync(names, compression, backward_passes_per_step, process_set)
    try:
        for gi, group in enumerate(optimizer.param_groups):
            sync.add_group(gi, group["params"])
        if check:
            sync.check_same_everywhere()
    except BaseException:
        sync.close()  # no hooks of a failed wrapper stay on the parameters
        raise
    base = type(optimizer)
    cls: Any = _classes.get(base)
    if cls is None:
        cls = type(
            f"DistributedAdasum{base.__name__}", (_AdasumMixin, base), {"__module__": __name__}
        )
        _classes[base] = cls
    wrapped: Any = cls.__new__(cls)
    skip = set(adopt_skip)
    wrapped.__dict__.update({k: v for k, v in optimizer.__dict__.items() if k not in skip})
    wrapped._fastps = sync
    sync.optimizer = weakref.ref(wrapped)
    weakref.finalize(wrapped, sync.close)
    return wrapped
