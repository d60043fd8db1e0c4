"""DistributedOptimizer for Keras 3 (and Keras 2 ``tf_keras``) optimizers: gradients are
averaged before every update (every N-th pass with local aggregation), except those of
local variables (PartialDistributedOptimizer)."""

from __future__ import annotations

import warnings
from typing import Any, Dict, List, Optional, Sequence, Set, Type

import numpy as np
import tensorflow as tf
from fastps.errors import FastPSError
from fastps.tensorflow import _engine as E
from fastps.tensorflow import cross_barrier as CB
from fastps.tensorflow import ops as O
from fastps.tensorflow import sfb as SFB
from fastps.tensorflow._reducer import GradientReducer, RoundFetch
from fastps.tensorflow.algorithms.runner import Runner
from fastps.tensorflow.algorithms.runner import resolve as resolve_algorithm
from fastps.tensorflow.async_optimizer import make_async_optimizer
from fastps.tensorflow.basics import basics
from fastps.tensorflow.compression import Compression, Compressor
from fastps.tensorflow.local_aggregation import LocalAggregation, check_passes
from fastps.worker import api as _api
from fastps.worker import catch_up as CU
from fastps.worker.async_mode import async_requested, current_mode

__all__ = ["DistributedOptimizer", "PartialDistributedOptimizer"]

_classes: Dict[type, type] = {}


def _distributed_class(base: Any) -> Any:
    """A subclass of ``base`` whose ``apply`` reduces the gradients first.

    It keeps ``base``'s name and module, so a model saved with it loads (as the plain
    optimizer) where fastps is not installed.
    """
    cls = _classes.get(base)
    if cls is not None:
        return cls

    @E.no_autograph
    def apply(self: Any, grads: Any, trainable_variables: Any = None) -> Any:
        grads = list(grads)
        if trainable_variables is None:
            variables = list(getattr(self, "_trainable_variables", []) or [])
            if len(variables) != len(grads):
                # Let Keras raise its own error about the missing variables.
                return base.apply(self, grads, trainable_variables)
        else:
            trainable_variables = list(trainable_variables)
            variables = trainable_variables
        sync: OptimizerGradients = self._fastps_grads
        runner = self.__dict__.get("_fastps_runner")
        if runner is not None:
            # A training algorithm (algorithms/runner.py) exchanges what it needs itself.
            sync.take_reduced(variables)
            return runner.apply(
                lambda exchanged: base.apply(self, exchanged, trainable_variables), grads, variables
            )
        cb = self.__dict__.get("_fastps_cb")
        if sync.take_reduced(variables):
            # From _compute_gradients: reduced (or aggregated) there already.
            if cb is not None:
                cb.flush()
            if sync.aggregation is None:
                result = base.apply(self, grads, trainable_variables)
                _catch_up(self, base, sync, grads, variables, trainable_variables)
                return result
            if not self.built:
                self.build(variables)
            return sync.aggregation.apply_if_reduced(
                lambda: base.apply(self, grads, trainable_variables),
                lambda: self._iterations.assign_add(1),
            )
        if cb is not None:
            if E.executing_eagerly() and sync.plain(variables):
                arriving = self._fastps_reducer.start_each(grads, variables)
                if arriving is not None:
                    cb.step(arriving, variables)
                    return None
            cb.flush()
        if sync.aggregation is None:
            reduced = sync.reduce(grads, variables)
            result = base.apply(self, reduced, trainable_variables)
            _catch_up(self, base, sync, reduced, variables, trainable_variables)
            return result
        if not self.built:
            self.build(variables)  # here, not inside the graph branch that updates
        return sync.aggregation.step(
            grads,
            variables,
            sync.reduce,
            lambda reduced: base.apply(self, reduced, trainable_variables),
            lambda: self._iterations.assign_add(1),
        )

    def wait_for_updates(self: Any) -> None:
        """Applies every deferred cross-barrier update (before reads that bypass the Keras
        variables: a compiled ``predict``/``evaluate``, a ``tf.function`` traced earlier)."""
        cb = self.__dict__.get("_fastps_cb")
        if cb is not None:
            cb.flush()

    def __setattr__(self: Any, name: str, value: Any) -> None:
        # A hyperparameter set between steps (a learning rate callback) must not reach the
        # updates of the step before.
        cb = self.__dict__.get("_fastps_cb")
        if cb is not None and cb.pending and not name.startswith("_"):
            cb.flush()
        base.__setattr__(self, name, value)

    def variables(self: Any) -> Any:
        self.wait_for_updates()
        return base.variables.fget(self)

    cls = type(
        base.__name__,
        (base,),
        {
            "apply": apply,
            "compute_gradients": _compute_gradients_public,
            "_compute_gradients": _make_compute_gradients(base),
            "register_local_var": _register_local_var,
            "wait_for_updates": wait_for_updates,
            "__setattr__": __setattr__,
            "variables": property(variables),
            "__module__": base.__module__,
            "__doc__": base.__doc__,
            "_fastps_distributed": True,
        },
    )
    _classes[base] = cls
    return cls


def _catch_up(
    opt: Any,
    base: Any,
    sync: OptimizerGradients,
    reduced: Sequence[Any],
    variables: List[Any],
    trainable_variables: Any,
) -> None:
    """Quorum rounds (docs/guide/async.md, "Catch-up"; ``fastps.catch_up``): after the answered
    round, applies the rounds that closed without this worker, as many as the least lag
    over the gradients says, each fetched from the servers' history and applied with the
    wrapped optimizer's step, exactly as every other replica applied them. Eagerly a loop;
    in a graph a ``tf.while_loop`` whose count is read when the step runs (after the sums'
    waits), each turn one fetch op and the optimizer's update."""
    plan = sync.catch_up_fetch(variables)
    if plan is None:
        return
    lags = sync.reducer.lags
    assert lags is not None  # plan is None otherwise

    def with_gaps(fetched: Sequence[Any]) -> List[Any]:
        grads: List[Any] = [None] * len(variables)
        for i, g in zip(plan.indices, fetched):
            grads[i] = g
        return grads

    def apply_round(fetched: Sequence[Any]) -> None:
        base.apply(opt, with_gaps(fetched), trainable_variables)

    if E.executing_eagerly():
        CU.catch_up(
            lags.take(), lambda: [tf.convert_to_tensor(a) for a in plan.fetch()], apply_round
        )
        return

    def take() -> np.ndarray:
        return np.int64(lags.take())

    # read once the sums' waits (which note the lags) ran
    with tf.control_dependencies([g for g in reduced if tf.is_tensor(g)]):
        behind = tf.numpy_function(take, [], tf.int64, stateful=True, name="fastps_catch_up_lag")

    def fetch(turn: Any) -> List[Any]:
        def run(_turn: Any) -> List[np.ndarray]:
            return plan.fetch()

        out = tf.numpy_function(
            run, [turn], plan.tf_dtypes, stateful=True, name="fastps_catch_up_fetch"
        )
        out = list(out) if isinstance(out, (list, tuple)) else [out]
        for t, shape in zip(out, plan.shapes):
            t.set_shape(shape)
        return out

    def body(turn: Any) -> Any:
        # the body's outputs wait for its stateful ops (the update): rounds go in turn
        apply_round(fetch(turn))
        return turn + 1

    tf.while_loop(lambda turn: turn < behind, body, [tf.constant(0, tf.int64)])


def _keras2_class(base: Any) -> Any:
    """A subclass of a Keras 2 (``tf_keras``) optimizer class whose ``apply_gradients``
    (which ``model.fit`` and custom loops call) reduces the gradients first."""
    cls = _classes.get(base)
    if cls is not None:
        return cls

    @E.no_autograph
    def apply_gradients(self: Any, grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
        pairs = list(grads_and_vars)
        variables = [v for _, v in pairs]
        grads = [g for g, _ in pairs]
        sync: OptimizerGradients = self._fastps_grads

        def update(reduced: List[Any]) -> Any:
            return base.apply_gradients(self, list(zip(reduced, variables)), *args, **kwargs)

        if sync.take_reduced(variables):
            # From _compute_gradients (model.fit's minimize): reduced there already.
            if sync.aggregation is None:
                return update(grads)
            with tf.init_scope():
                iterations = self.iterations
            return sync.aggregation.apply_if_reduced(
                lambda: update(grads), lambda: iterations.assign_add(1)
            )
        if sync.aggregation is None:
            return update(sync.reduce(grads, variables))
        with tf.init_scope():
            iterations = self.iterations  # legacy optimizers make it on first use
        return sync.aggregation.step(
            grads, variables, sync.reduce, update, lambda: iterations.assign_add(1)
        )

    cls = type(
        base.__name__,
        (base,),
        {
            "apply_gradients": apply_gradients,
            "compute_gradients": _compute_gradients_public,
            "_compute_gradients": _make_compute_gradients(base),
            "register_local_var": _register_local_var,
            "__module__": base.__module__,
            "__doc__": base.__doc__,
            "_fastps_distributed": True,
        },
    )
    _classes[base] = cls
    return cls


def _make_compute_gradients(base: Any) -> Any:
    """Horovod's ``_compute_gradients`` for a subclass of ``base``."""

    @E.no_autograph
    def _compute_gradients(
        self: Any, loss: Any, var_list: Any, grad_loss: Any = None, tape: Any = None
    ) -> List[Any]:
        """Horovod's: the (gradient, variable) pairs of ``loss`` with the gradients already
        reduced over the workers (with ``backward_passes_per_step=N``: this worker's sums,
        reduced on every N-th call). The next ``apply_gradients`` of these variables takes
        them as they are instead of reducing again. ``loss`` is a tensor recorded on
        ``tape``, or a callable (then ``tape`` may be None)."""
        pairs = _local_gradients(self, base, loss, var_list, grad_loss, tape)
        if self.__dict__.get("_fastps_runner") is not None:
            return pairs  # the algorithm exchanges in apply (algorithms/runner.py)
        variables = [v for _, v in pairs]
        sync: OptimizerGradients = self._fastps_grads
        reduced = sync.compute([g for g, _ in pairs], variables)
        return list(zip(reduced, variables))

    return _compute_gradients


def _compute_gradients_public(self: Any, loss: Any, var_list: Any, tape: Any = None) -> List[Any]:
    """Horovod's ``compute_gradients``: ``_compute_gradients`` without ``grad_loss``."""
    return self._compute_gradients(loss, var_list, None, tape)


def _local_gradients(
    opt: Any, base: Any, loss: Any, var_list: Any, grad_loss: Any, tape: Any
) -> List[Any]:
    """This worker's (gradient, variable) pairs of ``loss``, computed as ``base`` computes
    them where it can (Keras 2 transforms the loss and checks the arguments), else with
    the tape as Keras 2 does (Keras 3 optimizers compute no gradients)."""
    legacy = getattr(base, "_compute_gradients", None)
    if legacy is not None:
        return list(legacy(opt, loss, var_list, grad_loss=grad_loss, tape=tape))
    current = getattr(base, "compute_gradients", None)
    if current is not None and grad_loss is None:
        return list(current(opt, loss, var_list, tape=tape))
    if not callable(loss) and tape is None:
        raise ValueError(
            "_compute_gradients: a tape is needed when the loss is a tensor "
            f"(got loss={loss!r} and tape=None); or pass the loss as a callable"
        )
    tape = tf.GradientTape() if tape is None else tape
    if callable(loss):
        with tape:
            if not callable(var_list):
                # Keras 3 variables are watched through the tf.Variable they hold.
                tape.watch(
                    [
                        v if isinstance(v, (tf.Variable, tf.Tensor)) else v.value
                        for v in tf.nest.flatten(var_list)
                    ]
                )
            loss = loss()
    if callable(var_list):
        var_list = var_list()
    var_list = tf.nest.flatten(var_list)
    grads = tape.gradient(loss, var_list, output_gradients=grad_loss)
    return list(zip(grads, var_list))


def _is_keras2_optimizer(optimizer: Any) -> bool:
    """A ``tf_keras`` optimizer (Keras 2: ``TF_USE_LEGACY_KERAS=1`` makes ``tf.keras`` it),
    current or legacy."""
    try:
        import tf_keras
    except ImportError:
        return False
    kinds = [tf_keras.optimizers.Optimizer]
    legacy = getattr(tf_keras.optimizers, "legacy", None)
    if legacy is not None:
        kinds.append(legacy.Optimizer)
    return isinstance(optimizer, tuple(kinds))


def DistributedOptimizer(
    optimizer: Any,
    name: Optional[str] = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Type[Compressor] = Compression.none,
    sparse_as_dense: bool = False,
    backward_passes_per_step: int = 1,
    op: int = O.Average,
    gradient_predivide_factor: float = 1.0,
    average_aggregated_gradients: bool = False,
    num_groups: int = 0,
    groups: Any = None,
    process_set: Any = None,
    scale_local_gradients: bool = True,
    cross_barrier: Optional[bool] = None,
    model: Any = None,
    algorithm: Any = None,
    **kwargs: Any,
) -> Any:
    """Returns a copy of the Keras 3 ``optimizer`` (built from its config) whose updates use
    gradients averaged (``op=Sum``: summed) over all workers. A Keras 2 optimizer
    (``tf_keras``, current or ``legacy``) is wrapped the same way at ``apply_gradients``.

    ``apply`` and ``apply_gradients`` (which ``model.fit`` calls) push_pull every gradient,
    highest priority to the variable first in ``trainable_variables`` (layer order), then
    update as the wrapped optimizer would. Works eagerly and inside ``tf.function``; not with
    ``jit_compile=True`` (XLA cannot compile the calls into fastps). ``num_groups=k`` bundles
    the gradients into k groups of one start and one wait op each (fewer Python calls per
    step; see ``fastps.tensorflow._reducer``).

    ``backward_passes_per_step=N`` (Horovod's local gradient aggregation): each call adds
    its gradients to local sums and only every N-th call reduces the sums and updates (the
    others only advance ``iterations``); ``average_aggregated_gradients=True`` divides the
    sums by N. See ``fastps.tensorflow.local_aggregation``.
    ``register_local_var(var)`` on the result keeps ``var``'s gradient local (model
    parallelism), divided by the set size with ``scale_local_gradients``;
    :func:`PartialDistributedOptimizer` does that for whole layers.

    ``cross_barrier=True`` (or ``FASTPS_CROSS_BARRIER=1`` when the argument is None; default
    off): when ``apply`` runs eagerly it returns before every sum is in, and each variable is
    updated when its own sum has arrived, at the latest when something reads it (the next
    forward pass of its layer). Exactly the synchronous update; see
    ``fastps.tensorflow.cross_barrier`` for the optimizers it covers and the reads (compiled
    functions) that need ``optimizer.wait_for_updates()`` first.
    ``async=True`` (``**{"async": True}``, or ``asynchronous=True``; default: FASTPS_MODE):
    asynchronous training against parameters the servers keep (``async_optimizer.py``,
    docs/guide/async.md); the reduction arguments then do not apply.
    ``model``: the Keras 3 model (or layer) whose ``Dense`` kernels may be synchronised as
    sufficient factors under ``FASTPS_SFB=auto|on`` (``sfb.py``, docs/guide/sfb.md).

    ``algorithm``: a ``fastps.tensorflow.algorithms.Algorithm`` (docs/guide/algorithms.md):
    ``LocalSGD(H)``, ``DiLoCo(H)``, or ``OneBitAdamAlgorithm()``; default: the one the
    optimizer names (``OneBitAdam``), else synchronous gradient averaging
    (``GradientAveraging``, this function's own path). Another algorithm needs a Keras 3
    optimizer and runs with op=Average over the global set, one pass per step, no
    cross-barrier updates and no sufficient factors, and decides compression itself.
    """
    # Accepted for Horovod compatibility (CPU path; priorities instead of explicit groups).
    del device_dense, device_sparse, groups
    return _distributed(
        optimizer,
        name,
        compression,
        sparse_as_dense,
        backward_passes_per_step,
        op,
        gradient_predivide_factor,
        average_aggregated_gradients,
        num_groups,
        process_set,
        scale_local_gradients,
        cross_barrier,
        [],
        kwargs,
        model=model,
        algorithm=algorithm,
    )


def PartialDistributedOptimizer(  # noqa: N802 - Horovod's name for a factory
    optimizer: Any,
    name: Optional[str] = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Type[Compressor] = Compression.none,
    sparse_as_dense: bool = False,
    gradient_predivide_factor: float = 1.0,
    op: int = O.Average,
    backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False,
    groups: Any = None,
    process_set: Any = None,
    local_layers: Any = None,
    scale_local_gradients: bool = True,
    num_groups: int = 0,
    cross_barrier: Optional[bool] = None,
    **kwargs: Any,
) -> Any:
    """A :func:`DistributedOptimizer` whose ``local_layers`` (a Keras layer or a list of
    them; Keras 3 or Keras 2 alike) keep their gradients local: not reduced, and divided by
    the set size with ``scale_local_gradients`` (Horovod's ``PartialDistributedOptimizer``).
    The layers' trainable variables are looked up at every step, so layers built later (at
    the first call of the model) count too. Without ``local_layers`` it is a
    DistributedOptimizer. Synchronous training only."""
    del device_dense, device_sparse, groups  # accepted for Horovod compatibility
    return _distributed(
        optimizer,
        name,
        compression,
        sparse_as_dense,
        backward_passes_per_step,
        op,
        gradient_predivide_factor,
        average_aggregated_gradients,
        num_groups,
        process_set,
        scale_local_gradients,
        cross_barrier,
        _layers(local_layers),
        kwargs,
        who="PartialDistributedOptimizer",
    )


def _layers(local_layers: Any) -> List[Any]:
    """``local_layers`` as a list of Keras layers, or a ValueError naming the culprit."""
    kinds: List[type] = []
    import keras

    kinds.append(keras.layers.Layer)
    try:
        import tf_keras

        kinds.append(tf_keras.layers.Layer)
    except ImportError:
        pass
    if local_layers is None:
        return []
    if isinstance(local_layers, tuple(kinds)):
        return [local_layers]
    if isinstance(local_layers, (str, bytes)) or not hasattr(local_layers, "__iter__"):
        raise ValueError(
            f"local_layers must be a Keras layer or a list of them, got "
            f"{type(local_layers).__name__}"
        )
    layers = list(local_layers)
    for i, layer in enumerate(layers):
        if not isinstance(layer, tuple(kinds)):
            raise ValueError(
                f"local_layers[{i}] is a {type(layer).__name__}; every local layer must be "
                "a Keras layer (keras.layers.Layer, or tf_keras.layers.Layer under Keras 2)"
            )
    return layers


def _distributed(
    optimizer: Any,
    name: Optional[str],
    compression: Type[Compressor],
    sparse_as_dense: bool,
    backward_passes_per_step: Any,
    op: Any,
    gradient_predivide_factor: float,
    average_aggregated_gradients: bool,
    num_groups: int,
    process_set: Any,
    scale_local_gradients: bool,
    cross_barrier: Optional[bool],
    local_layers: List[Any],
    kwargs: Dict[str, Any],
    who: str = "DistributedOptimizer",
    model: Any = None,
    algorithm: Any = None,
) -> Any:
    passes = check_passes(backward_passes_per_step)
    import keras

    if isinstance(optimizer, keras.optimizers.Optimizer):
        make_class = _distributed_class
    elif _is_keras2_optimizer(optimizer):
        make_class = _keras2_class
    else:
        raise TypeError(
            f"{who} wraps Keras 3 optimizers (keras.optimizers.Optimizer) and "
            f"Keras 2 ones (tf_keras.optimizers, current or legacy); got "
            f"{type(optimizer).__name__}. For custom loops use DistributedGradientTape."
        )
    if getattr(optimizer, "_fastps_distributed", False):
        raise ValueError("this optimizer is already a fastps DistributedOptimizer")
    if async_requested(kwargs, current_mode(), who):
        if algorithm is not None:
            raise ValueError(f"{who}: algorithm={algorithm!r} cannot run asynchronously")
        if make_class is _keras2_class:
            # The async class replaces Keras 3's apply, which Keras 2 never calls: every
            # worker would silently train alone.
            raise ValueError(
                f"{who}(async=True) needs a Keras 3 optimizer; "
                f"{type(optimizer).__name__} is a Keras 2 (tf_keras) one"
            )
        if passes != 1:
            raise ValueError(
                f"{who}(async=True) takes no backward_passes_per_step (got {passes}): "
                "asynchronous workers push every step's delta"
            )
        if local_layers:
            raise ValueError(f"{who}(async=True) cannot keep local_layers local")
        return make_async_optimizer(optimizer, name)
    op = O._resolve_op(op, None)
    if gradient_predivide_factor != 1.0 and op != O.Average:
        raise ValueError("gradient_predivide_factor needs op=Average")
    compression, algo = resolve_algorithm(algorithm, compression, optimizer)
    if algo is not None:
        _check_algorithm(algo, who, make_class is _keras2_class, type(optimizer), op, process_set)
        if passes != 1:
            raise ValueError(
                f"{who}: algorithm {algo.name} takes no backward_passes_per_step (got "
                f"{passes}): its exchanges follow the optimizer's steps"
            )
        if _cross_barrier_asked(cross_barrier):
            warnings.warn(
                f"fastps: cross-barrier updates off: algorithm {algo.name} steps synchronously",
                stacklevel=3,
            )
        cross_barrier, model = False, None
    cls = make_class(type(optimizer))
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    new = cls.from_config(config)
    reducer = GradientReducer(
        "DistributedOptimizer",
        compression=compression,
        op=op,
        sparse_as_dense=sparse_as_dense,
        prescale_factor=1.0 / gradient_predivide_factor,
        postscale_factor=gradient_predivide_factor,
        num_groups=num_groups,
        process_set=process_set,
        settings=[f"backward_passes_per_step={passes}"] if passes > 1 else [],
    )
    aggregation = (
        LocalAggregation(passes, average_aggregated_gradients, sparse_as_dense)
        if passes > 1
        else None
    )
    SFB.attach(
        reducer,
        model,
        who,
        "local gradient aggregation (backward_passes_per_step > 1)" if passes > 1 else None,
    )
    if make_class is _distributed_class and _api.is_initialized() and _api.quorum_catch_up():
        # Keras 3 updates catch up on rounds that closed without this worker (_catch_up)
        reducer.lags = CU.RoundLag()
    grads = OptimizerGradients(reducer, scale_local_gradients, process_set, aggregation)
    for layer in local_layers:
        grads.add_local_layer(layer)
    # Bypass attribute tracking: neither holds state Keras should save.
    object.__setattr__(new, "_fastps_reducer", reducer)
    object.__setattr__(new, "_fastps_grads", grads)
    object.__setattr__(new, "_agg_helper", aggregation)  # Horovod's name (its tests read it)
    cb = None
    if _cross_barrier_asked(cross_barrier):
        if make_class is _keras2_class:
            why: Optional[str] = "a Keras 2 optimizer"
        else:
            why = CB.coupling(new, type(optimizer))
        if why is None and op not in (O.Average, O.Sum):
            why = "the reduction op is not Average or Sum"
        if why is None and process_set is not None and process_set is not O.global_process_set:
            why = "a process set"
        if why is None and aggregation is not None:
            why = "local gradient aggregation (backward_passes_per_step > 1)"
        if why is None and reducer.sfb is not None:
            why = "FASTPS_SFB (a kernel's sum is rebuilt from factors)"
        if why is None and reducer.lags is not None:
            # a round is applied whole before the next is fetched (docs/guide/async.md)
            why = "FASTPS_QUORUM_CATCH_UP (a slow worker catches up on whole rounds)"
        if why is None:
            cb = CB.CrossBarrier(new, base_apply=type(optimizer).apply)
        else:
            CB.warn(why)
    object.__setattr__(new, "_fastps_cb", cb)
    if algo is not None:
        runner = Runner(algo, new, grads)
        object.__setattr__(new, "_fastps_runner", runner)
        algo.setup(runner)
    return new


def _check_algorithm(
    algo: Any, who: str, keras2: bool, base: type, op: Any, process_set: Any
) -> None:
    """Refuses what an algorithm cannot run with, naming it."""
    if keras2:
        raise ValueError(
            f"{who}: algorithm {algo.name} needs a Keras 3 optimizer (its hooks are in Keras "
            f"3's apply); {base.__name__} is a Keras 2 (tf_keras) one"
        )
    if op != O.Average:
        raise FastPSError(f"{who}: algorithm {algo.name} runs with op=Average only")
    if process_set is not None and process_set is not O.global_process_set:
        raise FastPSError(f"{who}: algorithm {algo.name} runs over the global process set only")
    if _api.is_initialized() and _api.quorum_catch_up():
        raise FastPSError(
            f"{who}: algorithm {algo.name} cannot catch up on quorum rounds "
            "(FASTPS_QUORUM_CATCH_UP)"
        )


class OptimizerGradients:
    """What DistributedOptimizer does to the gradients before the wrapped update: reduces
    them with ``reducer``, except those of local variables (``register_local_var``, the
    trainable variables of ``local_layers``), which stay this worker's own, divided by the
    set size with ``scale_local_gradients`` so they match the averaged ones' scale
    (Horovod's); with ``aggregation``, summed over N passes first."""

    def __init__(
        self,
        reducer: GradientReducer,
        scale_local: bool,
        process_set: Any,
        aggregation: Optional[LocalAggregation],
    ) -> None:
        self.reducer = reducer
        self.scale_local = bool(scale_local)
        self._set_size = O._ps(process_set).size
        self.aggregation = aggregation
        # id -> variable (kept alive, so the id stays its own)
        self._local_vars: Dict[int, Any] = {}
        self._local_layers: List[Any] = []
        # The variables whose gradients the last compute() returned (id -> variable), until
        # the next apply takes them; None when no compute() is waiting for its apply.
        self._computed: Optional[Dict[int, Any]] = None

    def register_local_var(self, var: Any) -> None:
        self._local_vars[id(var)] = var

    def add_local_layer(self, layer: Any) -> None:
        self._local_layers.append(layer)

    def _local_ids(self) -> Set[int]:
        ids = set(self._local_vars)
        for layer in self._local_layers:
            ids.update(id(v) for v in layer.trainable_weights)
        return ids

    def plain(self, variables: Sequence[Any]) -> bool:
        """Whether every gradient of ``variables`` is reduced as it comes (no local
        variable among them, no aggregation): what cross-barrier updates need."""
        if self.aggregation is not None:
            return False
        local = self._local_ids()
        return not any(id(v) in local for v in variables)

    def reduce(self, grads: Sequence[Any], variables: Sequence[Any]) -> List[Any]:
        """The gradients to update ``variables`` with (None stays None)."""
        local_ids = self._local_ids()
        local = [id(v) in local_ids for v in variables]
        if not any(local):
            return self.reducer.reduce(grads, variables)
        shared = [None if loc else g for g, loc in zip(grads, local)]
        out = self.reducer.reduce(shared, variables)
        for i, (g, loc) in enumerate(zip(grads, local)):
            if loc and g is not None:
                out[i] = self._scaled(g) if self.scale_local else g
        return out

    def compute(self, grads: Sequence[Any], variables: Sequence[Any]) -> List[Any]:
        """Horovod's ``_compute_gradients`` half: the gradients reduced where they are
        computed (with aggregation: the sums, reduced on the N-th pass). Marks
        ``variables`` so that the next apply (:meth:`take_reduced`) does not reduce again."""
        variables = list(variables)
        if self.aggregation is None:
            out = self.reduce(grads, variables)
        else:
            out = self.aggregation.accumulate(grads, variables, self.reduce)
        self._computed = {id(v): v for v in variables}
        return out

    def catch_up_fetch(self, variables: Sequence[Any]) -> Optional[RoundFetch]:
        """The fetch of the next round of the gradients the last reduction took, when the
        wrapped update can catch up on rounds (docs/guide/async.md, "Catch-up"): quorum rounds,
        every gradient of ``variables`` reduced on the direct path (no local variable, no
        aggregation: a round is applied whole), else None."""
        if self.reducer.lags is None or self.aggregation is not None:
            return None
        plan = self.reducer.last_fetch
        if plan is None or not self.plain(variables):
            return None
        return plan

    def take_reduced(self, variables: Sequence[Any]) -> bool:
        """Whether the gradients an apply got come from :meth:`compute` (every variable
        was among the last compute's); clears the mark either way, so an apply that did
        not follow a compute reduces its gradients itself."""
        computed, self._computed = self._computed, None
        return computed is not None and all(id(v) in computed for v in variables)

    def _scaled(self, grad: Any) -> Any:
        if isinstance(grad, tf.IndexedSlices):
            size = tf.cast(self._set_size(), grad.values.dtype)
            return tf.IndexedSlices(grad.values / size, grad.indices, grad.dense_shape)
        return grad / tf.cast(self._set_size(), grad.dtype)


def _register_local_var(self: Any, var: Any) -> None:
    """Horovod's ``register_local_var``: ``var``'s gradient is not reduced (model
    parallelism) and, with ``scale_local_gradients``, is divided by the set size."""
    self._fastps_grads.register_local_var(var)


def _cross_barrier_asked(option: Optional[bool]) -> bool:
    """The argument, else FASTPS_CROSS_BARRIER, else off (the plugins' shared policy)."""
    return basics.cross_barrier(option)
