"""Cross-barrier updates for Keras 3 optimizers: ``apply`` returns before every sum is in.

The torch plugin's cross-barrier (``fastps.torch.cross_barrier``) for the Keras
``DistributedOptimizer(cross_barrier=True)``, eagerly:

* ``apply`` starts every gradient's reduction (one core op each, highest priority to the
  variable the forward pass uses first), updates at once the variables whose sums are
  already in, and defers the others. Each deferred variable is switched to a subclass of its
  own class (:func:`_pending_class`) whose ``value`` — the one property every Keras read of a
  variable goes through: a layer's ops, ``numpy()``, ``get_weights()``, ``assign_add`` —
  waits for that variable's sum and applies its update, together with every other deferred
  update whose sum has arrived by then. So the next forward pass of a layer waits only for
  its own variables, and the first layers' forward overlaps the last layers' communication.
* A deferred update is the wrapped optimizer's own ``apply`` on the variables being updated,
  with ``iterations`` set back to its value at the step (the learning rate schedule and the
  bias corrections read it) and the learning rate of the step: exactly the synchronous
  update for optimizers whose ``update_step`` treats each variable on its own
  (:data:`PER_VARIABLE`) and configurations without a step-wide coupling (``global_clipnorm``,
  EMA, gradient accumulation). Anything else keeps synchronous steps, with a warning.
* Setting an attribute of the optimizer (``learning_rate`` from a callback, ...), the next
  ``apply``, ``variables``/``get_config`` reads and ``wait_for_updates()`` apply every
  deferred update first.

Where TensorFlow does not allow the overlap:

* **Inside a ``tf.function``** (``model.fit`` without ``run_eagerly=True``, a compiled
  custom step) nothing can be deferred: a function call returns only once every stateful op
  in it ran, so the next step's forward pass (the next call) cannot start before the last
  update. Within the call, TensorFlow's executor already runs each variable's update as
  soon as that gradient's finish op returned (data dependencies only), so the optimizer's
  updates overlap the rest of the communication; what is lost is the overlap of the next
  forward pass. ``apply`` there stays synchronous (same numbers either way).
* **Reads that bypass the Keras variable** see the value before the deferred update: a
  ``tf.function`` traced earlier holds the ``tf.Variable`` itself and reads it in C++
  (``model.predict``/``evaluate`` compiled, a ``tf.function`` you wrote), as does code that
  kept ``variable.value`` from before ``apply``. Call ``optimizer.wait_for_updates()``
  before those. This is why cross-barrier is an option here (``cross_barrier=True``), not the
  default as in the torch plugin, where every read can be intercepted.
"""

from __future__ import annotations

import time
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

import keras
from fastps.errors import FastPSError

__all__ = ["ENV", "CrossBarrier", "PER_VARIABLE", "coupling", "warn"]

ENV = "FASTPS_CROSS_BARRIER"  # read by fastps.config.cross_barrier

# keras.optimizers classes whose update_step changes one variable from its own gradient and
# slots only. Not Nadam: its _backend_update_step advances a step-wide product once per call.
PER_VARIABLE = (
    "SGD",
    "Adam",
    "AdamW",
    "Adamax",
    "Adagrad",
    "Adadelta",
    "RMSprop",
    "Ftrl",
    "Lion",
    "Lamb",
    "Adafactor",
)


def coupling(optimizer: Any, base: type) -> Optional[str]:
    """Why deferred per-variable updates of ``optimizer`` (class ``base``) could differ from
    its synchronous step, or None."""
    opts = keras.optimizers
    known = tuple(getattr(opts, n) for n in PER_VARIABLE if hasattr(opts, n))
    if base not in known:
        return f"{base.__name__} is not known to update each variable on its own"
    if getattr(optimizer, "global_clipnorm", None):
        return "global_clipnorm scales every gradient by the norm of all of them"
    if getattr(optimizer, "use_ema", False):
        return "use_ema averages every variable after each step"
    if getattr(optimizer, "gradient_accumulation_steps", None):
        return "gradient_accumulation_steps decides per step whether to update at all"
    return None


_PENDING: Dict[type, type] = {}


def _pending_class(cls: Any) -> type:
    """A subclass of ``cls`` whose reads wait for the variable's deferred update."""
    pending = _PENDING.get(cls)
    if pending is not None:
        return pending
    read = cls.value  # the property of KerasVariable (or a subclass)

    def value(self: Any) -> Any:
        self._fastps_cb.wait_for(self)
        return read.fget(self)

    def assign(self: Any, v: Any) -> Any:
        self._fastps_cb.wait_for(self)
        return cls.assign(self, v)

    pending = type(
        cls.__name__,
        (cls,),
        {
            "value": property(value),
            "assign": assign,
            "__module__": cls.__module__,
            "__doc__": cls.__doc__,
            "_fastps_pending": True,
        },
    )
    _PENDING[cls] = pending
    return pending


class _Deferred:
    __slots__ = ("var", "cls", "arriving")

    def __init__(self, var: Any, cls: type, arriving: Any) -> None:
        self.var = var
        self.cls = cls
        self.arriving = arriving


class CrossBarrier:
    """The deferred updates of one Keras DistributedOptimizer (eager only)."""

    def __init__(self, optimizer: Any, base_apply: Callable[..., Any]) -> None:
        self.optimizer = optimizer
        self._apply = base_apply
        self.pending: Dict[int, _Deferred] = {}
        self._iteration: Any = None  # iterations at the step whose updates pend
        self._lr: Any = None  # the learning rate variable's value then (None: a schedule)
        self._busy = False
        # Counters for tests and benchmarks.
        self.steps = 0
        self.deferred = 0
        self.applies = 0
        self.wait_s = 0.0

    # -- the step

    def step(self, arriving: List[Any], variables: List[Any]) -> None:
        """Updates the variables whose sums are in; defers the others."""
        self.flush()
        opt = self.optimizer
        if not opt.built:
            with keras.name_scope(opt.name, caller=opt):
                opt.build(variables)
            opt.built = True
        self._iteration = opt.iterations.numpy()
        lr = getattr(opt, "_learning_rate", None)
        self._lr = lr.numpy() if isinstance(lr, keras.Variable) else None
        self.steps += 1
        entries = [(v, a) for v, a in zip(variables, arriving) if a is not None]
        arrived = [a.poll() for _, a in entries]
        now = [e for e, done in zip(entries, arrived) if done]
        later = [e for e, done in zip(entries, arrived) if not done]
        for v, a in later:
            cls = type(v)
            if getattr(cls, "_fastps_pending", False):  # the same variable twice in a step
                raise FastPSError(f"variable '{v.path}' is passed twice to apply()")
            self.pending[id(v)] = _Deferred(v, cls, a)
            object.__setattr__(v, "_fastps_cb", self)
            v.__class__ = _pending_class(cls)
        self.deferred += len(later)
        try:
            self._update(now)
        except BaseException:
            self._drop()
            raise
        if later and opt.iterations.numpy() == self._iteration:
            # Nothing applied yet: the counter moves on now, as after a synchronous step.
            opt.iterations.assign(self._iteration + 1)

    # -- waiting

    def wait_for(self, var: Any) -> None:
        """Applies ``var``'s deferred update (and every other one already in)."""
        entry = self.pending.get(id(var))
        if entry is None or self._busy:
            return
        t0 = time.perf_counter()
        try:
            entry.arriving.result()
        except BaseException as exc:
            self._drop()
            raise FastPSError(f"variable '{var.path}': its gradient's sum failed: {exc}") from exc
        self.wait_s += time.perf_counter() - t0
        self._apply_arrived(must=id(var))

    def flush(self) -> None:
        """Waits for and applies every deferred update."""
        if not self.pending or self._busy:
            return
        ready = list(self.pending.values())
        try:
            for e in ready:
                e.arriving.result()
        except BaseException:
            self._drop()
            raise
        self._apply_arrived(must=None, everything=True)

    def _apply_arrived(self, must: Optional[int], everything: bool = False) -> None:
        take = [
            e for key, e in self.pending.items() if everything or key == must or e.arriving.poll()
        ]
        for e in take:
            del self.pending[id(e.var)]
            e.var.__class__ = e.cls
        try:
            self._update([(e.var, e.arriving) for e in take])
        except BaseException:
            self._drop()
            raise

    def _update(self, items: List[Tuple[Any, Any]]) -> None:
        """The wrapped optimizer's apply on ``items`` as of the deferred step."""
        if not items:
            return
        opt = self.optimizer
        grads = [a.result() for _, a in items]
        variables = [v for v, _ in items]
        self._busy = True
        try:
            it = opt.iterations
            now_it, now_lr = it.numpy(), None
            it.assign(self._iteration)
            lr: Any = getattr(opt, "_learning_rate", None)
            if self._lr is not None and isinstance(lr, keras.Variable):
                now_lr = lr.numpy()
                lr.assign(self._lr)
            self._apply(opt, grads, variables)
            if now_lr is not None:
                lr.assign(now_lr)
            if now_it != self._iteration:  # a later part of the step: iterations moved on
                it.assign(now_it)
            self.applies += 1
        finally:
            self._busy = False

    def _drop(self) -> None:
        """After an error: no variable stays pending (reads must not retry a failed sum)."""
        for e in self.pending.values():
            e.var.__class__ = e.cls
        self.pending.clear()


def warn(why: str) -> None:
    warnings.warn(
        f"fastps: cross-barrier updates off: {why}; apply() waits for every gradient",
        stacklevel=3,
    )
