"""Cross-barrier updates: ``optimizer.step()`` returns before the gradients' sums arrive.

P3 (SysML'19, §4) and BytePS's cross-barrier: with a synchronous ``step()`` the next forward
pass cannot start until the last gradient of the model has come back, so the time the last
layers' sums spend on the wire is never overlapped with compute. P3 sends the first layers'
gradients first; the gain only shows if the first layer's forward pass may start as soon as
*its* parameters are updated. Here:

* ``step()`` defers the update of every parameter whose sum is still in flight. The entry
  keeps the gradient tensor that the sum is written into, and the param groups'
  hyperparameters are frozen (an LR scheduler that changes ``lr`` right after ``step()``
  must not change this step's update). Parameters whose sums have already arrived, and
  parameters no module's forward announces (no hook could wait for them), are updated
  before ``step()`` returns.
* While updates are pending, a process-wide module forward pre-hook waits, before a module's
  forward, for the sums of that module's own parameters and applies their updates — together
  with every other pending update whose sum has arrived by then, so updates are applied as
  soon as their sums are there and in few optimizer calls.
* An update runs the wrapped optimizer's own ``step()`` on temporary param groups that hold
  only the parameters being updated, with the frozen hyperparameters. That is exactly the
  synchronous update for optimizers whose step treats each parameter on its own: a known list
  (``PER_PARAMETER``). Others — LBFGS (a closure over the whole model), LAMB-like global
  norms, any class fastps cannot vouch for — keep synchronous steps, with a warning.
* Whatever reads what a pending update writes waits for it first: the optimizer's
  ``state_dict``/``load_state_dict``/``add_param_group``/``synchronize`` and the next
  ``step()``; a module's ``state_dict``/``load_state_dict`` (hooks on every module that owns a
  parameter); ``zero_grad`` detaches the gradients an update still needs instead of waiting.
  Any other read goes through torch's ``__torch_function__``: while its update pends, a
  parameter's class is a subclass of its own (``_pending_class``) whose
  ``__torch_function__`` applies the update before any torch function or tensor method
  touches its values or its gradient (``p.data``, ``p.clone()``, ``p.norm()``, ``p.grad``,
  ``F.linear(x, p)`` outside its module, ``copy.deepcopy``, ``torch.save``); reads of
  metadata only (shape, dtype, ``requires_grad``, ...) pass. The class goes back when the
  update is applied, so the forward pass of a module that already waited pays nothing.
  What bypasses torch (a numpy view taken before ``step()``, C++ code holding the pointer)
  must call ``optimizer.wait_for_updates()`` first.

Gradient clipping keeps its Horovod form (``synchronize()``, clip, ``skip_synchronize()``):
after ``synchronize()`` every sum is in, and the following ``step()`` updates at once.
"""

from __future__ import annotations

import inspect
import itertools
import time
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

import torch
from fastps.errors import FastPSError
from fastps.torch import timeline_events as _tl
from fastps.torch.basics import basics

if TYPE_CHECKING:  # pragma: no cover
    from fastps.torch.optimizer import _Entry, _GradientSync

__all__ = ["ENV", "CrossBarrier", "choose", "coupling", "enabled"]

ENV = "FASTPS_CROSS_BARRIER"  # read by fastps.config.cross_barrier

# torch.optim classes whose step() updates each parameter from its own gradient and state
# only (foreach/fused variants included: they apply the same per-tensor arithmetic).
PER_PARAMETER = (
    "SGD",
    "Adam",
    "AdamW",
    "Adagrad",
    "Adadelta",
    "Adamax",
    "NAdam",
    "RAdam",
    "RMSprop",
    "Rprop",
    "ASGD",
    "Adafactor",
    "SparseAdam",
)


def enabled(option: Optional[bool]) -> bool:
    """The ``cross_barrier`` argument, or ``FASTPS_CROSS_BARRIER`` when it is None (unset:
    on): the plugins' shared policy (``fastps.collectives.basics``)."""
    return basics.cross_barrier(option)


def explicit(option: Optional[bool]) -> bool:
    """Whether the user asked for cross-barrier updates (argument or environment) rather
    than getting them by default: only then does a fallback warn."""
    return basics.cross_barrier_explicit(option)


def choose(
    option: Optional[bool],
    optimizer: Any,
    params: List[torch.Tensor],
    op_ok: bool,
    elastic: bool = False,
) -> bool:
    """Whether a DistributedOptimizer defers its updates: ``enabled(option)`` unless the
    update could not be exactly the synchronous one (then synchronous, with a warning if
    cross-barrier was asked for explicitly). Elastic jobs keep synchronous steps unless
    asked (a reset with updates pending is not covered by tests)."""
    if not enabled(option) or (elastic and not explicit(option)):
        return False
    why = coupling(type(optimizer))
    if why is None and not op_ok:
        why = "the reduction op is not Average or Sum"
    if why is None:
        why = _unswappable(params)
    if why is not None:
        if explicit(option):
            warnings.warn(
                f"fastps: cross-barrier updates off: {why}; step() waits for every gradient",
                stacklevel=3,
            )
        return False
    return True


def _unswappable(params: List[torch.Tensor]) -> Optional[str]:
    """Why some parameter cannot take a pending class (a tensor subclass with its own
    ``__torch_function__``: its reads could not be intercepted), or None."""
    for p in params:
        cls = type(p)
        if cls is torch.Tensor or cls in _PENDING_CLASSES:
            continue
        tf = getattr(cls, "__torch_function__", None)
        if getattr(tf, "__func__", tf) not in _PLAIN_TORCH_FUNCTIONS:
            return f"parameter class {cls.__name__} has its own __torch_function__"
    return None


def _per_parameter_steps() -> Dict[Any, str]:
    steps: Dict[Any, str] = {}
    for name in PER_PARAMETER:
        cls = getattr(torch.optim, name, None)
        if cls is not None:
            steps[inspect.unwrap(cls.step)] = name
    return steps


_PER_PARAMETER_STEPS = _per_parameter_steps()


def coupling(optimizer_class: type) -> Optional[str]:
    """None if ``optimizer_class.step`` is one that updates each parameter on its own
    (torch's profiling and grad-mode wrappers are looked through, so subclasses that keep
    the step qualify); otherwise why cross-barrier updates cannot be used."""
    step = inspect.unwrap(getattr(optimizer_class, "step"))  # noqa: B009 (a class, not typed)
    if step in _PER_PARAMETER_STEPS:
        return None
    return (
        f"{optimizer_class.__name__}.step() is not one that fastps knows to update each "
        "parameter on its own (it may couple parameters: a closure, a global norm); "
        f"known: torch.optim {', '.join(sorted(set(_PER_PARAMETER_STEPS.values())))}"
    )


# Tensor attributes and methods that read only metadata: a pending parameter passes them
# without its update being applied.
_METADATA_GETTERS = (
    "shape",
    "dtype",
    "device",
    "layout",
    "requires_grad",
    "is_leaf",
    "grad_fn",
    "ndim",
    "is_sparse",
    "is_cuda",
    "is_meta",
    "is_quantized",
    "names",
)
_METADATA_METHODS = (
    "size",
    "dim",
    "numel",
    "nelement",
    "element_size",
    "stride",
    "is_contiguous",
    "is_floating_point",
    "is_complex",
    "get_device",
    "storage_offset",
    "requires_grad_",
    "register_hook",
    "register_post_accumulate_grad_hook",
    "__len__",
)


def _metadata_functions() -> frozenset:
    out = []
    for name in _METADATA_GETTERS:
        attr = getattr(torch.Tensor, name, None)
        if attr is not None and hasattr(attr, "__get__"):
            out.append(attr.__get__)
    for name in _METADATA_METHODS:
        attr = getattr(torch.Tensor, name, None)
        if attr is not None:
            out.append(attr)
    return frozenset(out)


_METADATA = _metadata_functions()
# __torch_function__ implementations that leave a tensor class's reads to torch.
_PLAIN_TORCH_FUNCTIONS = (
    torch._C._disabled_torch_function_impl,
    getattr(torch.Tensor.__torch_function__, "__func__", None),
)
# pending class -> the parameter's own class, and back
_PENDING_CLASSES: Dict[type, type] = {}
_PENDING_OF: Dict[type, type] = {}
# id(CrossBarrier) -> (it, its optimizer) while it owes updates: a root, so that an
# optimizer the script dropped right after step() (a training function that returns the
# model) stays alive, with its state, until its parameters' updates are applied.
_OWING: Dict[int, Any] = {}
# id(parameter) -> the CrossBarrier whose update of it pends
_barrier_of: Dict[int, weakref.ReferenceType[CrossBarrier]] = {}


def _pending_torch_function(
    cls: type, func: Any, types: Any, args: Any = (), kwargs: Any = None
) -> Any:
    """A torch function or tensor method met a parameter whose update pends: apply the
    updates of every such argument first (unless only metadata is read), then run it as
    for the parameter's own class."""
    if kwargs is None:
        kwargs = {}
    if func not in _METADATA:
        _settle(itertools.chain(args, kwargs.values()))
    with torch._C.DisableTorchFunctionSubclass():
        return func(*args, **kwargs)


def _settle(values: Any) -> None:
    found: List[torch.Tensor] = []
    for a in values:
        if type(a) in _PENDING_CLASSES:
            found.append(a)
        elif isinstance(a, (list, tuple)):  # foreach ops, torch.cat, ...
            found.extend(b for b in a if type(b) in _PENDING_CLASSES)
    for p in found:
        ref = _barrier_of.get(id(p))
        barrier = ref() if ref is not None else None
        if barrier is not None and id(p) in barrier.pending:
            barrier.wait_params([p], "read of")
        else:  # pragma: no cover - the barrier is gone: nothing will update it any more
            _restore(p)


def _pending_class(cls: type) -> type:
    pending = _PENDING_OF.get(cls)
    if pending is None:
        pending = type(
            f"{cls.__name__}WithPendingUpdate",
            (cls,),
            {
                "__slots__": (),
                "__torch_function__": classmethod(_pending_torch_function),
                "__module__": __name__,
            },
        )
        _PENDING_OF[cls] = pending
        _PENDING_CLASSES[pending] = cls
    return pending


def _mark(
    p: torch.Tensor,
    barrier: CrossBarrier,
    ref: Optional[weakref.ReferenceType[CrossBarrier]] = None,
) -> None:
    """From now until its update is applied, reads of ``p`` apply it first. ``ref``: a weak
    reference to ``barrier`` made once (a step marks every parameter)."""
    cls = type(p)
    if cls not in _PENDING_CLASSES:
        p.__class__ = _pending_class(cls)
    _barrier_of[id(p)] = ref if ref is not None else weakref.ref(barrier)


def _restore(p: torch.Tensor) -> None:
    own = _PENDING_CLASSES.get(type(p))
    if own is not None:
        p.__class__ = own
    _barrier_of.pop(id(p), None)


def quiet() -> Any:
    """The plugin's own reads of pending parameters (zero_grad, applying) must not apply."""
    return torch._C.DisableTorchFunctionSubclass()


def _frozen(group: Dict[str, Any]) -> Dict[str, Any]:
    """A param group's hyperparameters as they are now (tensor values copied: schedulers
    fill a tensor ``lr`` in place)."""
    out: Dict[str, Any] = {}
    for key, value in group.items():
        if key == "params":
            continue
        if isinstance(value, torch.Tensor):
            value = value.clone()
        elif isinstance(value, tuple) and any(isinstance(v, torch.Tensor) for v in value):
            value = tuple(v.clone() if isinstance(v, torch.Tensor) else v for v in value)
        out[key] = value
    return out


def _step_hooks(optimizer: Any) -> bool:
    from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks

    return bool(
        _global_optimizer_pre_hooks
        or _global_optimizer_post_hooks
        or getattr(optimizer, "_optimizer_step_pre_hooks", None)
        or getattr(optimizer, "_optimizer_step_post_hooks", None)
    )


def _short(name: str) -> str:
    """A gradient's parameter name, without the plugin's prefix (optimizer.GRAD_PREFIX)."""
    return name.split(".", 1)[1] if name.startswith("grad.") else name


class CrossBarrier:
    """The deferred updates of one DistributedOptimizer."""

    def __init__(
        self,
        sync: _GradientSync,
        optimizer: Any,
        step_on: Callable[[Any, List[Dict[str, Any]]], None],
        warn: bool = True,
    ) -> None:
        self._sync = sync
        self.ref = weakref.ref(self)  # what _barrier_of holds for each pending parameter
        self._optimizer = weakref.ref(optimizer)
        self._step_on = step_on  # runs the wrapped optimizer's step on temporary groups
        # id(param) -> entry, in the order the updates are wanted (forward order).
        self.pending: Dict[int, _Entry] = {}
        self._groups: List[Dict[str, Any]] = []  # frozen hyperparameters of the pending step
        self._forward_hook: Any = None
        self._module_hooks: Dict[int, List[Any]] = {}
        self._warned = not warn  # fallbacks warn only where cross-barrier was asked for
        # Counters for tests and benchmarks.
        self.steps = 0
        self.deferred = 0  # updates that waited past step()
        self.applied_in_forward = 0  # of those, applied by a module's forward pre-hook
        self.waited_s = 0.0  # time spent blocked on sums that had not arrived
        self.update_s = 0.0  # time spent applying deferred updates (the optimizer's step)

    # ------------------------------------------------------------------------ step()

    def usable(self, optimizer: Any) -> bool:
        """False (once with a warning) while step hooks are registered: they expect one
        update of every parameter per call."""
        if not _step_hooks(optimizer):
            return True
        if not self._warned:
            self._warned = True
            warnings.warn(
                "fastps: optimizer step hooks are registered, so step() waits for "
                "every gradient (cross-barrier updates off while they are)",
                stacklevel=3,
            )
        return False

    def defer_step(self, optimizer: Any) -> None:
        """``step()``: updates what can be updated now, defers the rest."""
        sync = self._sync
        with sync.lock, quiet():
            self.finish()  # an earlier step's updates whose modules ran no forward since
            sync.start_missing()
            group_of: Dict[int, int] = {}
            for gi, group in enumerate(optimizer.param_groups):
                for p in group["params"]:
                    group_of.setdefault(id(p), gi)
            self._groups = [_frozen(g) for g in optimizer.param_groups]
            # once per step over every parameter: no call per entry where a lookup does
            announced = sync.order.positions()
            pending = self.pending
            now: List[_Entry] = []
            for e in sync.by_priority():
                if e.hid < 0 and e.handle is None:
                    continue  # not in flight
                p = e.param
                key = id(p)
                e.grad = p.grad
                e.group = group_of.get(key, -1)
                e.deferred = True
                if key not in announced:
                    now.append(e)  # no module forward announces it: nothing would wait
                else:
                    pending[key] = e
                    _mark(p, self, self.ref)
            sync.reset_passes()
            if sync.order.learning and sync.order.seen:
                self._hook_modules(sync.order.owners())
                sync.order.stop()
            self.steps += 1
            self._apply(now + self._arrived(now))
            if self.pending:
                self.deferred += len(self.pending)
                _OWING[id(self)] = (self, optimizer)
                if self._forward_hook is None:
                    ref = weakref.ref(self)

                    def before_forward(module: torch.nn.Module, args: Any) -> None:
                        me = ref()
                        if me is not None:
                            me.wait_module(module, True)

                    self._forward_hook = torch.nn.modules.module.register_module_forward_pre_hook(
                        before_forward
                    )

    def _arrived(self, taken: List[_Entry]) -> List[_Entry]:
        """Pending entries whose sums are in, in forward order up to the first that is not
        (sums arrive roughly in priority order, so looking further rarely finds any)."""
        out: List[_Entry] = []
        try:
            for e in self.pending.values():
                if e in taken:
                    continue
                if not e.poll():
                    break
                out.append(e)
        except BaseException:
            self._drop(taken)  # the job is failing; do not make every later forward fail too
            raise
        return out

    # ------------------------------------------------------------------------ waiting

    def wait_module(self, module: torch.nn.Module, in_forward: bool = False) -> None:
        """Applies the pending updates of ``module``'s own parameters (waiting for their
        sums) and any others whose sums are in."""
        if not self.pending:
            return
        params = module._parameters
        if params:
            waiter = f"forward of {type(module).__name__}" if in_forward else ""
            self.wait_params(params.values(), waiter, in_forward)

    def wait_params(self, params: Any, waiter: str = "", in_forward: bool = False) -> None:
        """Applies the pending updates of ``params`` (waiting for their sums) and any
        others whose sums are in."""
        due: List[_Entry] = []
        for p in params:
            if p is not None:
                e = self.pending.get(id(p))
                if e is not None:
                    due.append(e)
        if due:
            with self._sync.lock:
                due = [e for e in due if e.deferred]
                if in_forward:
                    self.applied_in_forward += len(due)
                self._apply(due + self._arrived(due), waiter)

    def finish(self) -> None:
        """Applies every pending update (waits for all sums)."""
        if self.pending:
            with self._sync.lock:
                self._apply(list(self.pending.values()))

    def __del__(self) -> None:
        for e in list(getattr(self, "pending", {}).values()):
            _restore(e.param)  # a dropped optimizer leaves no parameter marked

    def hold_grads(self, set_to_none: bool) -> List[Any]:
        """``zero_grad()`` must not touch a gradient a pending update still needs. With
        ``set_to_none`` the parameter lets go of it (the entry keeps it); otherwise it is
        zeroed in place right after its update — before the module's forward, so before
        any new gradient accumulates into it. Returns what to give back after the wrapped
        optimizer's zero_grad ran on the other parameters."""
        held = []
        for e in self.pending.values():  # (called under quiet(): p.grad is the plugin's)
            p = e.param
            if p.grad is not None and p.grad is e.grad:
                p.grad = None
                if not set_to_none:
                    e.zero = True
                    held.append((p, e.grad))
        return held

    @staticmethod
    def give_back(held: List[Any]) -> None:
        for p, grad in held:
            p.grad = grad

    # ------------------------------------------------------------------------ applying

    def _apply(self, batch: List[_Entry], waiter: str = "") -> None:
        """Waits for the sums of ``batch`` and applies their updates; ``waiter`` names the
        module forward that needed them, for the timeline."""
        if not batch:
            return
        with quiet():
            self._apply_quietly(batch, waiter)

    def _apply_quietly(self, batch: List[_Entry], waiter: str) -> None:
        t0 = time.perf_counter()
        started = _tl.start()
        try:
            for e in batch:
                e.wait()
            if waiter and started:  # the label only where a timeline records it
                names = ", ".join(_short(e.name) for e in batch)
                _tl.end("forward waited", f"{waiter}: {names}", started)
        except BaseException:
            self._drop(batch)  # the job is failing; do not make every later forward fail too
            raise
        self.waited_s += time.perf_counter() - t0
        # held here: once nothing pends, _idle lets go of the optimizer _OWING kept alive
        optimizer = self._optimizer()
        by_group: Dict[int, List[torch.Tensor]] = {}
        swapped = []
        zero: List[torch.Tensor] = []
        pending = self.pending
        for e in batch:
            p = e.param
            key = id(p)
            pending.pop(key, None)
            own = _PENDING_CLASSES.get(type(p))  # _restore(p), without a call per entry
            if own is not None:
                p.__class__ = own
            _barrier_of.pop(key, None)
            e.deferred = False
            grad, e.grad = e.grad, None
            if e.zero:
                e.zero = False
                if grad is not None:
                    zero.append(grad)
            if e.group < 0:
                continue  # removed from every param group: the synchronous step skips it too
            if p.grad is not grad:
                swapped.append((p, p.grad))
                p.grad = grad
            by_group.setdefault(e.group, []).append(p)
        if not self.pending:
            self._idle()
        try:
            if by_group:
                groups = [dict(self._groups[gi], params=ps) for gi, ps in sorted(by_group.items())]
                if optimizer is None:  # pragma: no cover - _OWING holds it while updates pend
                    raise FastPSError("the optimizer was garbage-collected with updates pending")
                applying = _tl.start()
                t1 = time.perf_counter()
                self._step_on(optimizer, groups)
                self.update_s += time.perf_counter() - t1
                if applying:
                    names = ", ".join(_short(e.name) for e in batch)
                    _tl.end("optimizer applied", names, applying)
        finally:
            for p, grad in swapped:
                p.grad = grad
            with torch.no_grad():
                for grad in zero:  # zero_grad(set_to_none=False) came while it pended
                    grad.zero_()

    def discard(self) -> None:
        """Forgets every pending update without applying it (elastic reset: the sums will
        never come and the state rolls back to the last commit)."""
        with self._sync.lock:
            self._drop([])

    def _idle(self) -> None:
        _OWING.pop(id(self), None)
        if self._forward_hook is not None:
            self._forward_hook.remove()
            self._forward_hook = None

    def _drop(self, batch: List[_Entry]) -> None:
        for e in [*batch, *self.pending.values()]:
            _restore(e.param)
            e.deferred = False
            e.zero = False
            e.grad = None
            e.drop()
        self.pending.clear()
        self._idle()

    # ------------------------------------------------------------------------ modules

    def _hook_modules(self, modules: List[torch.nn.Module]) -> None:
        """Module ``state_dict``/``load_state_dict`` wait for the module's own updates."""
        ref = weakref.ref(self)

        def before_save(module: torch.nn.Module, *args: Any) -> None:
            me = ref()
            if me is not None:
                me.wait_module(module)

        for m in modules:
            if id(m) not in self._module_hooks:
                self._module_hooks[id(m)] = [
                    m.register_state_dict_pre_hook(before_save),
                    m.register_load_state_dict_pre_hook(before_save),
                ]

    def close(self) -> None:
        for e in list(self.pending.values()):
            _restore(e.param)
        self._idle()
        for handles in self._module_hooks.values():
            for h in handles:
                h.remove()
        self._module_hooks.clear()

    def check_gradient(self, e: _Entry) -> None:
        """A gradient arrived for a parameter whose previous update is still pending: the
        forward pass used it without going through a module that owns it."""
        if e.deferred:
            raise FastPSError(
                f"the gradient of '{e.name.split('.', 1)[1]}' was computed while its update "
                "from the previous optimizer.step() was still pending: with cross-barrier "
                "updates a parameter must be used in the forward pass of a module that owns "
                "it (module._parameters), which waits for its update; call "
                "optimizer.wait_for_updates() before such a use, or pass cross_barrier=False"
            )
