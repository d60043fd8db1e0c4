"""Training helpers: broadcast_parameters, DistributedOptimizer and DistributedTrainer."""

from __future__ import annotations

import functools
import itertools
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import mxnet as mx
import numpy as np
from fastps.collectives import ops as C
from fastps.collectives.basics import sfb_choice
from fastps.collectives.ops import ProcessSet, ReduceOp, global_process_set
from fastps.control.elastic_wire import enabled as _elastic_enabled
from fastps.errors import FastPSError
from fastps.mxnet import engine_wait as EW
from fastps.mxnet.algorithms.base import Algorithm
from fastps.mxnet.algorithms.onebit_adam import MOMENTUM_TAG, OneBitAdam, OneBitAdamAlgorithm
from fastps.mxnet.algorithms.runner import Runner
from fastps.mxnet.algorithms.runner import resolve as _resolve_algorithm
from fastps.mxnet.basics import basics
from fastps.mxnet.compression import Compression, is_core
from fastps.mxnet.ops import (
    _HOST_DEVICES,
    MXHandle,
    _CoreHandle,
    _fetch_target,
    _start,
    allreduce_async_,
    broadcast_async_,
    dtype_name,
)
from fastps.mxnet.sfb import SufficientFactors
from fastps.worker import api as _api
from fastps.worker import catch_up as CU
from fastps.worker.async_mode import DeltaExchange, async_requested, current_mode
from fastps.worker.compression import default_compressor
from fastps.worker.fusion_plan import FusionPlan

__all__ = ["broadcast_parameters", "DistributedOptimizer", "DistributedTrainer"]

# Default name prefixes carry a creation-order number (the same on every worker), so two
# trainers or optimizers never reuse each other's tensor names.
_trainers = itertools.count()
_optimizers = itertools.count()


def _default_prefix(base: str, counter: itertools.count[int]) -> str:
    n = next(counter)
    return f"{base}." if n == 0 else f"{base}{n}."


if TYPE_CHECKING:  # mxnet has no type information: its classes are Any here
    from typing_extensions import TypeAlias

NDArray: TypeAlias = mx.nd.NDArray
Parameter: TypeAlias = mx.gluon.Parameter
_DeferredInit = mx.gluon.parameter.DeferredInitializationError


# ----------------------------------------------------------------------------- parameters
def _broadcast_param_now(
    param: Parameter, root_rank: int, name: str, process_set: ProcessSet
) -> None:
    arrays = param.list_data()
    broadcast_async_(arrays[0], root_rank, name, process_set=process_set).synchronize()
    for other in arrays[1:]:
        arrays[0].copyto(other)


def _broadcast_after_deferred_init(
    param: Parameter, root_rank: int, name: str, process_set: ProcessSet
) -> None:
    """Gluon creates a parameter's data at the first forward pass when its shape was left
    open; broadcast it right after that (every worker runs that pass in the same order)."""
    original = param._init_impl

    def init_then_broadcast(*args: Any, **kwargs: Any) -> None:
        original(*args, **kwargs)
        del param._init_impl  # back to the class's method
        _broadcast_param_now(param, root_rank, name, process_set)

    param._init_impl = init_then_broadcast


def broadcast_parameters(
    params: Union[Mapping[str, Any], Sequence[Parameter]],
    root_rank: int = 0,
    prefix: Optional[str] = None,
    process_set: ProcessSet = global_process_set,
) -> None:
    """Overwrites every parameter with ``root_rank``'s value, in place.

    ``params``: a dict of name to NDArray (``Module.get_params()``), a Gluon ParameterDict
    (``net.collect_params()``) or a dict/list of Gluon Parameters. Parameters whose
    initialization Gluon deferred are broadcast as soon as they are initialized. First the
    ranks compare their parameter sets (names, shapes, dtypes): a model that differs raises
    on every rank, naming the parameter, instead of leaving ranks waiting.
    """
    prefix = "broadcast_parameters." if prefix is None else prefix
    if isinstance(params, (dict, mx.gluon.ParameterDict)) or hasattr(params, "items"):
        items = sorted(params.items(), key=lambda kv: str(kv[0]))
    elif isinstance(params, (list, tuple)):
        items = [
            (p.name if isinstance(p, mx.gluon.Parameter) else str(i), p)
            for i, p in enumerate(params)
        ]
    else:
        raise FastPSError(
            "broadcast_parameters: params must be a dict, a ParameterDict or a list of "
            f"Parameters, got {type(params).__name__}"
        )
    signatures = []
    for key, value in items:
        if isinstance(value, mx.nd.NDArray):
            signatures.append((str(key), tuple(value.shape), dtype_name(value)))
        elif isinstance(value, mx.gluon.Parameter):
            shape = tuple(value.shape or ())
            signatures.append((str(key), shape, np.dtype(value.dtype).name))
        else:
            raise FastPSError(
                f"broadcast_parameters: '{key}' is a {type(value).__name__}, not an NDArray "
                "or a Parameter"
            )
    C.check_same_everywhere(
        signatures, "broadcast_parameters: the parameters differ between ranks", process_set
    )
    handles: List[MXHandle] = []
    for key, value in items:
        name = f"{prefix}{key}"
        if isinstance(value, mx.nd.NDArray):
            handles.append(broadcast_async_(value, root_rank, name, process_set=process_set))
            continue
        try:
            value.list_data()
        except _DeferredInit:
            _broadcast_after_deferred_init(value, root_rank, name, process_set)
            continue
        _broadcast_param_now(value, root_rank, name, process_set)
    for h in handles:
        h.synchronize()


# ------------------------------------------------------------------------------ optimizer
class DistributedOptimizer(mx.optimizer.Optimizer):
    """Wraps an ``mx.optimizer.Optimizer`` so every update first averages the gradients
    over all workers (in place), then runs the wrapped optimizer.

    Every attribute not defined here is read from and written to the wrapped optimizer, so
    ``rescale_grad``, ``param_dict``, learning-rate schedules and the rest keep working when
    a Gluon ``Trainer`` or an ``Updater`` drives it. One device per worker process.

    A ``fastps.mxnet.algorithms.OneBitAdam`` optimizer runs 1-bit Adam: past its warm-up
    each update averages the parameter's momentum, compressed with error feedback, instead
    of its gradient (docs/guide/algorithms.md). ``algorithm``: None (the optimizer's own,
    as in torch) or ``OneBitAdamAlgorithm()``; the other algorithms (local SGD, DiLoCo)
    need ``DistributedTrainer``.
    """

    _OWN = ("_fastps_opt", "_fastps_predivide", "_fastps_prefix", "_fastps_set")

    def __init__(
        self,
        optimizer: mx.optimizer.Optimizer,
        gradient_predivide_factor: float = 1.0,
        num_groups: int = 0,
        process_set: ProcessSet = global_process_set,
        prefix: Optional[str] = None,
        algorithm: Any = None,
    ) -> None:
        # num_groups (Horovod's fusion groups) is accepted and unused, as in the trainer.
        # The base constructor is not called: its attributes live in the wrapped optimizer.
        if not isinstance(optimizer, mx.optimizer.Optimizer):
            raise FastPSError(
                f"DistributedOptimizer wraps an mx.optimizer.Optimizer, got "
                f"{type(optimizer).__name__}"
            )
        _check_optimizer_algorithm(algorithm, optimizer)
        object.__setattr__(self, "_fastps_opt", optimizer)
        object.__setattr__(self, "_fastps_predivide", float(gradient_predivide_factor))
        if prefix is None:
            prefix = _default_prefix("DistributedOptimizer", _optimizers)
        object.__setattr__(self, "_fastps_prefix", prefix)
        object.__setattr__(self, "_fastps_set", process_set)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in DistributedOptimizer._OWN:
            raise AttributeError(name)
        return getattr(self._fastps_opt, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in DistributedOptimizer._OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self._fastps_opt, name, value)

    @property
    def optimizer(self) -> mx.optimizer.Optimizer:
        """The wrapped optimizer."""
        return self._fastps_opt

    def _average(self, index: Any, grad: Any) -> None:
        """Averages the gradients over the process set, in place. A rank outside the set
        updates with its own gradients (Horovod's behaviour)."""
        ps = self._fastps_set
        if not ps.included() or ps.size() == 1:
            return
        indices = index if isinstance(index, (list, tuple)) else [index]
        grads = grad if isinstance(grad, (list, tuple)) else [grad]
        f = self._fastps_predivide
        handles = []
        for idx, g in zip(indices, grads):
            # The updater hands over parameter indices but not how many parameters there
            # are: the one formula with a count of 0 keeps its order (first index first).
            priority = C.priority_for(idx, 0) if isinstance(idx, int) else 0
            handles.append(
                allreduce_async_(
                    g,
                    name=f"{self._fastps_prefix}{idx}",
                    priority=priority,
                    prescale_factor=1.0 / f,
                    postscale_factor=f,
                    process_set=ps,
                    op=ReduceOp.AVERAGE,
                )
            )
        for h in handles:
            h.synchronize()

    def create_state(self, index: Any, weight: NDArray) -> Any:
        return self._fastps_opt.create_state(index, weight)

    def create_state_multi_precision(self, index: Any, weight: NDArray) -> Any:
        return self._fastps_opt.create_state_multi_precision(index, weight)

    def _exchange(self, index: Any, weight: Any, grad: Any, state: Any) -> None:
        """What the wrapped optimizer's update needs from the other workers: the averaged
        gradients, or, for 1-bit Adam past its warm-up, the averaged momentum."""
        opt = self._fastps_opt
        if not isinstance(opt, OneBitAdam):
            self._average(index, grad)
            return
        ps = self._fastps_set
        if not ps.included() or ps.size() == 1:
            return  # the optimizer computes the momentum locally
        many = isinstance(index, (list, tuple))
        rows = list(zip(index, weight, grad, state)) if many else [(index, weight, grad, state)]
        warm = [(i, g) for i, _w, g, _s in rows if not opt.compressing(i)]
        handles = []
        for idx, w, g, s in rows:
            if not opt.compressing(idx):
                continue
            if w.context.device_type not in _HOST_DEVICES:
                raise FastPSError(
                    f"OneBitAdam: parameter '{opt._name(idx)}' is on {w.context}; only CPU "
                    "parameters are supported"
                )
            sent = opt.exchange_buffer_(idx, w, g, s)
            handles.append(
                allreduce_async_(
                    sent,
                    name=f"{self._fastps_prefix}{MOMENTUM_TAG}.{idx}",
                    priority=C.priority_for(idx, 0) if isinstance(idx, int) else 0,
                    process_set=ps,
                    op=ReduceOp.AVERAGE,
                    compression=opt.compression,
                )
            )
        if warm:
            self._average([i for i, _ in warm], [g for _, g in warm])
        for h in handles:
            h.synchronize()

    def update(self, index: Any, weight: Any, grad: Any, state: Any) -> None:
        self._exchange(index, weight, grad, state)
        self._fastps_opt.update(index, weight, grad, state)

    def update_multi_precision(self, index: Any, weight: Any, grad: Any, state: Any) -> None:
        self._exchange(index, weight, grad, state)
        self._fastps_opt.update_multi_precision(index, weight, grad, state)

    def set_learning_rate(self, lr: float) -> None:
        self._fastps_opt.set_learning_rate(lr)

    def set_lr_mult(self, args_lr_mult: Dict[Any, float]) -> None:
        self._fastps_opt.set_lr_mult(args_lr_mult)

    def set_wd_mult(self, args_wd_mult: Dict[Any, float]) -> None:
        self._fastps_opt.set_wd_mult(args_wd_mult)

    @property
    def learning_rate(self) -> float:
        return self._fastps_opt.learning_rate

    def __getstate__(self) -> Dict[str, Any]:
        return {k: getattr(self, k) for k in DistributedOptimizer._OWN}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        for k, v in state.items():
            object.__setattr__(self, k, v)


def _check_optimizer_algorithm(algorithm: Any, optimizer: Any) -> None:
    """``DistributedOptimizer(algorithm=...)``: only 1-bit Adam's, which is per parameter."""
    if algorithm is None:
        return
    if not isinstance(algorithm, Algorithm):
        raise TypeError(
            "DistributedOptimizer: algorithm must be a fastps.mxnet.algorithms.Algorithm, got "
            f"{type(algorithm).__name__}"
        )
    if type(algorithm) is not OneBitAdamAlgorithm:
        raise FastPSError(
            f"DistributedOptimizer: algorithm {algorithm.name} needs hvd.DistributedTrainer: "
            "an mx.optimizer.Optimizer is handed one parameter at a time and never sees a "
            "step begin or end, where the algorithm's hooks run (only OneBitAdam's exchange "
            "is per parameter)"
        )
    if not isinstance(optimizer, OneBitAdam):
        raise TypeError(
            "OneBitAdamAlgorithm needs a fastps.mxnet.algorithms.OneBitAdam optimizer, got "
            f"{type(optimizer).__name__}"
        )


# -------------------------------------------------------------------------------- trainer
def _creation_order(params: Any) -> Optional[Dict[str, int]]:
    """Parameter name -> position in the order the model created them (≈ forward order).

    gluon.Trainer sorts a dict's parameters by name, which puts ``dense10`` before
    ``dense2``; the dict's own order (ParameterDict keeps registration order) is the better
    guide for priorities.
    """
    if isinstance(params, (list, tuple)):
        return {p.name: i for i, p in enumerate(params) if isinstance(p, mx.gluon.Parameter)}
    if hasattr(params, "values"):
        values = params.values()
        return {p.name: i for i, p in enumerate(values) if isinstance(p, mx.gluon.Parameter)}
    return None


class DistributedTrainer(mx.gluon.Trainer):
    """A ``gluon.Trainer`` that averages gradients over all workers with fastps.

    Use exactly like ``gluon.Trainer`` (``trainer.step(batch_size)`` with the per-worker
    batch size): N workers taking a step on their own batches update the parameters as one
    process would on the N batches together.

    Overlap: MXNet runs ``backward()`` asynchronously on its engine threads, so when
    ``step()`` starts the last layers' gradients exist and the first layers' may not.
    ``_allreduce_grads`` walks the parameters in backward order (last created first); for
    each it waits only until that gradient is written, then starts its push_pull and moves
    on. Communication of the later layers therefore overlaps the engine's backward
    computation of the earlier layers, and all gradients are in flight together, sent in
    forward order of priority (the first layer is the most urgent: the next forward pass
    needs it first). Without cross-barrier the optimizer update starts after every gradient
    is back; it does not overlap communication, nor does the next forward pass.

    ``cross_barrier=True`` (or ``FASTPS_CROSS_BARRIER=1`` when the argument is None; default
    off): ``step()`` waits for no sum. Each gradient's wait becomes an operation of MXNet's
    engine that writes that gradient (``fastps.mxnet.engine_wait``), so each parameter's
    update runs as soon as its own sum is in and the next forward pass — whose operations
    read the updated weights — waits only for the updates it reads: the first layers'
    forward overlaps the last layers' communication. Every read (``asnumpy``, gradient
    clipping, ``save_states``) goes through the engine and sees the updated values; the
    numbers are exactly those of the synchronous step. An error while waiting is raised by
    the next ``step()`` or ``wait_for_updates()``. Needs MXNet's ``MXEnginePushSyncND``
    (1.5+), op=Average over the global process set; otherwise synchronous, with a warning.

    Tensor fusion (FASTPS_FUSION_THRESHOLD, ``core/worker/fusion_plan.py``): from the second step
    on, small gradients that are neighbours in the priority order travel packed together.

    ``op=Adasum`` (a fastps extension; Horovod's trainer only averages): Horovod's delta
    optimizer, as ``fastps.torch.DistributedOptimizer(op=Adasum)``: each worker updates
    its parameters with its own gradients, and the workers' updates are combined with
    Adasum (``core/collectives/adasum.py``): ``w = start + adasum(w_local - start)``. The
    optimizer's state stays each worker's own.

    ``async=True`` (``**{"async": True}``, or ``asynchronous=True``; default: FASTPS_MODE):
    asynchronous training (docs/guide/async.md, ``fastps.async_mode``): the servers keep the
    parameters; ``step()`` applies this worker's own gradients (no averaging, no waiting for
    the other workers), pushes the delta and loads the parameters as they now stand on the
    servers, every worker's deltas included. The first step starts the servers from rank
    0's parameters. ``pull_parameters()`` / ``push_parameters()`` read them (a checkpoint
    from any worker) or replace them with rank 0's.

    ``model``: the Block whose ``Dense`` weights may be synchronised as sufficient factors
    instead of through the servers (``FASTPS_SFB=auto|on``, default off; ``sfb.py`` and
    docs/guide/sfb.md).

    Quorum rounds (``FASTPS_ROUND_QUORUM``, docs/guide/async.md "Catch-up"): after the answered
    round, ``step()`` applies the rounds that closed without this worker, fetched from the
    servers' history, one optimizer update each, as every other replica applied them; a
    worker that is slower for good then never falls far enough behind to pace the others.
    A loop that must end on every worker after the same rounds counts
    ``applied_rounds``, not its own steps. Needs every gradient on the core's path
    (global set, host arrays, no compression, no sufficient factors); cross-barrier
    updates are off under quorum rounds.

    ``algorithm``: a ``fastps.mxnet.algorithms.Algorithm`` run in place of the gradient
    averaging (docs/guide/algorithms.md): ``LocalSGD(H)``, ``DiLoCo(H)``
    (docs/guide/local-sgd.md) or 1-bit Adam's, which the ``OneBitAdam`` optimizer
    (``"onebitadam"``) names by itself. It runs with op=Average over every rank,
    synchronous steps (no cross-barrier), no tensor fusion, no sufficient factors, no
    quorum catch-up and no async mode, and decides compression itself.
    """

    def __init__(
        self,
        params: Any,
        optimizer: Any,
        optimizer_params: Optional[dict] = None,
        compression: Any = Compression.none,
        gradient_predivide_factor: float = 1.0,
        prefix: Optional[str] = None,
        num_groups: int = 0,
        process_set: ProcessSet = global_process_set,
        op: Any = ReduceOp.AVERAGE,
        cross_barrier: Optional[bool] = None,
        model: Any = None,
        algorithm: Any = None,
        **kwargs: Any,
    ) -> None:
        asynchronous = async_requested(kwargs, current_mode(), "DistributedTrainer")
        if asynchronous and process_set is not global_process_set:
            raise FastPSError("DistributedTrainer(async=True) trains on every rank: no process_set")
        # num_groups (Horovod's fusion groups) is accepted and unused: every gradient is in
        # flight at once anyway, and the core fuses, cuts and schedules the parts.
        rop = C.resolve_op(op, None)
        if rop not in (ReduceOp.AVERAGE, ReduceOp.ADASUM):
            raise FastPSError(
                f"DistributedTrainer supports op=Average or op=Adasum, not {rop.name.capitalize()}"
            )
        if rop == ReduceOp.ADASUM and gradient_predivide_factor != 1.0:
            raise ValueError("gradient_predivide_factor requires op=Average")
        if isinstance(optimizer, DistributedOptimizer):
            warnings.warn(
                "DistributedTrainer averages gradients itself: the DistributedOptimizer "
                "wrapper is removed",
                stacklevel=2,
            )
            optimizer = optimizer.optimizer
        order = _creation_order(params)
        super().__init__(
            params,
            optimizer,
            optimizer_params=optimizer_params,
            kvstore=None,
            update_on_kvstore=False,
        )
        algo = _resolve_algorithm(algorithm, compression, self._optimizer)
        quorum = _api.is_initialized() and _api.quorum_catch_up()
        if algo is not None:
            _check_trainer_algorithm(algo, asynchronous, rop, process_set, quorum, cross_barrier)
            cross_barrier, model = False, None
        # Compression.none takes FASTPS_COMPRESSION's choice (docs/guide/compression.md); an
        # algorithm decides what it compresses.
        if algo is None and compression in (None, Compression.none) and _api.is_initialized():
            compression = default_compressor(_api.config()) or Compression.none
        if is_core(compression) and rop == ReduceOp.ADASUM:
            raise FastPSError(
                f"DistributedTrainer: the core's compressors ({compression!r}) apply to "
                "op=Average only"
            )
        self._fastps_compression: Any = compression
        # A core compressor travels with each gradient to the core; a cast runs here.
        self._fastps_core_compression = compression if is_core(compression) else None
        self._fastps_predivide = float(gradient_predivide_factor)
        self._fastps_prefix = (
            _default_prefix("DistributedTrainer", _trainers) if prefix is None else prefix
        )
        # Priority of each parameter index: forward (creation) order, first = largest.
        n = len(self._params)
        self._fastps_priority = [
            C.priority_for(order.get(p.name, i) if order else i, n)
            for i, p in enumerate(self._params)
        ]
        # Backward order: the reverse of creation order.
        self._fastps_backward = sorted(range(n), key=lambda i: self._fastps_priority[i])
        self._fastps_checked = False
        self._fastps_set = process_set
        self._fastps_op = rop
        self._fastps_fusion = FusionPlan(f"DistributedTrainer:{self._fastps_prefix}")
        weakref.finalize(self, self._fastps_fusion.drop)
        # Quorum rounds: the waits' lags, the fetch targets of the last reduction, the
        # rounds applied (docs/guide/async.md, "Catch-up").
        self._fastps_lags: Optional[CU.RoundLag] = CU.RoundLag() if quorum else None
        self._fastps_fetch: List[Tuple[int, NDArray, str, int, float]] = []
        self._fastps_rounds = 0
        self._fastps_cb = _cross_barrier(cross_barrier, rop, process_set, quorum)
        self._fastps_deferred = 0  # gradients whose wait went to the engine (tests)
        self._fastps_async: Optional[DeltaExchange] = (
            DeltaExchange("DistributedTrainer(async)") if asynchronous else None
        )
        self._fastps_sfb = self._sufficient_factors(model)
        # A training algorithm other than the averaging above (algorithms/runner.py); set
        # up now when every parameter has its data, else at the first step.
        self._fastps_runner: Optional[Runner] = None
        if algo is not None:
            runner = Runner(algo, self)
            self._fastps_runner = runner
            if _api.is_initialized() and runner.data_ready():
                runner.ensure_setup()

    @property
    def algorithm(self) -> Optional[Algorithm]:
        """The training algorithm this trainer runs, or None (gradient averaging)."""
        runner = self._fastps_runner
        return None if runner is None else runner.algorithm

    def _sufficient_factors(self, model: Any) -> Optional[SufficientFactors]:
        """The Dense weights that may travel as sufficient factors (sfb.py), or None."""
        choice = sfb_choice(
            "DistributedTrainer",
            model,
            "Dense layers",
            active=_api.is_initialized() and self._fastps_active(),
            compressed=self._fastps_compression not in (None, Compression.none),
            op="Adasum" if self._fastps_op == ReduceOp.ADASUM else None,
            asynchronous=self._fastps_async is not None,
            elastic=_elastic_enabled(),
            stacklevel=3,
        )
        if choice is None:
            return None
        sfb = SufficientFactors(
            model,
            {id(p): i for i, p in enumerate(self._params)},
            choice.how,
            self._fastps_set,
            self._fastps_priority,
            choice.why_not,
        )
        weakref.finalize(self, sfb.close)
        return sfb

    def step(self, batch_size: float, ignore_stale_grad: bool = False) -> None:
        EW.raise_pending_error("DistributedTrainer")
        super().step(batch_size, ignore_stale_grad)

    def wait_for_updates(self) -> None:
        """Waits until every parameter's update of the last step is done (cross-barrier:
        the engine's waits for the sums and the updates after them); raises a wait's
        error."""
        for param in self._params:
            for data in param.list_data():
                data.wait_to_read()
        EW.raise_pending_error("DistributedTrainer")

    def _fastps_active(self) -> bool:
        """A member of a set of several ranks (others train on their own gradients)."""
        ps = self._fastps_set
        return bool(ps.included() and ps.size() > 1)

    def _fastps_check(self) -> None:
        """Once: every worker must reduce the same gradients (count, shapes, dtypes)."""
        live = [p for p in self._params if p.grad_req != "null"]
        C.check_same_everywhere(
            [(p.name, tuple(p.list_grad()[0].shape), dtype_name(p.list_grad()[0])) for p in live],
            "DistributedTrainer: the gradients differ between ranks",
            self._fastps_set,
        )
        self._fastps_checked = True

    def _local_grads(self) -> List[Tuple[int, Any, NDArray]]:
        """(index, parameter, gradient) of every gradient to reduce, in backward order; a
        worker with several devices sums them into the first device's gradient."""
        out = []
        for i in self._fastps_backward:
            param = self._params[i]
            if param.grad_req == "null":
                continue
            grads = param.list_grad()
            if grads[0].stype != "default":
                raise FastPSError(
                    f"DistributedTrainer: parameter '{param.name}' has {grads[0].stype} "
                    "gradients, which fastps does not reduce; use dense gradients"
                )
            grad = grads[0]
            for other in grads[1:]:
                grad += other.as_in_context(grad.context)
            out.append((i, param, grad))
        return out

    def _allreduce_grads(self) -> None:
        if not self._fastps_active():
            return  # a rank outside the set trains on its own gradients (as Horovod)
        if not self._fastps_checked:
            self._fastps_check()
        if self._fastps_runner is not None:
            self._fastps_runner.round()
            return
        if self._fastps_op == ReduceOp.ADASUM or self._fastps_async is not None:
            # The updates are combined in _update; here only the devices' gradients are
            # summed, so every device applies the same local update.
            for _, param, grad in self._local_grads():
                for other in param.list_grad()[1:]:
                    grad.copyto(other)
            return
        ps = self._fastps_set
        f = self._fastps_predivide
        fusion = self._fastps_fusion
        fuse = ps is global_process_set and _api.fusion_enabled()  # only the core's path
        rows: List[Tuple[str, int, str, int]] = []
        pending: List[Tuple[int, Any, NDArray, Any, NDArray]] = []
        local = self._local_grads()
        sfb = self._fastps_sfb
        if sfb is not None:
            sfb.decide(f"{self._fastps_prefix}sfb.choice")  # once, collective: see sfb.py
            sfb.prepare(
                [(i, g, bool(p.list_data()[0]._fresh_grad)) for i, p, g in local if sfb.chosen(i)]
            )
        for i, param, grad in local:
            if sfb is not None and sfb.chosen(i):
                # Allgathered as factors (never pushed); the same scaling as below.
                scale = (1.0 / f) * (f / ps.size())
                try:
                    factors = sfb.start(i, grad, scale, f"{self._fastps_prefix}sfb.{i}")
                except FastPSError as exc:
                    raise type(exc)(f"parameter '{param.name}': {exc}") from None
                pending.append((i, factors, grad, None, grad))
                continue
            if f != 1.0:
                grad *= 1.0 / f
            core = self._fastps_core_compression
            sent, ctx = (grad, None) if core else self._fastps_compression.compress(grad)
            name = f"{self._fastps_prefix}grad.{i}"
            # A gradient that backward wrote this step has no reader left from the last
            # step (the engine ran those before that write): waiting for the write is
            # enough, and costs no engine round trip once the write has landed.
            fresh = sent is not grad or param.list_data()[0]._fresh_grad
            try:
                if ps is global_process_set:  # the hot path: straight to the core
                    fusion.claim(name)
                    handle: Any = _start(
                        sent,
                        sent,
                        name,
                        self._fastps_priority[i],
                        f / _api.size(),
                        out_wait="read" if fresh else "write",
                        compression=core,
                        quorum=True,
                    )
                else:  # a subset of the ranks: through the collective layer
                    handle = allreduce_async_(
                        sent,
                        name=name,
                        priority=self._fastps_priority[i],
                        postscale_factor=f,
                        process_set=ps,
                        op=ReduceOp.AVERAGE,
                        compression=core,
                    )
            except FastPSError as exc:
                raise FastPSError(f"parameter '{param.name}': {exc}") from None
            pending.append((i, handle, sent, ctx, grad))
            if fuse:
                nbytes = int(np.prod(sent.shape, dtype=np.int64)) * np.dtype(sent.dtype).itemsize
                # Compressed gradients travel alone (a fused bucket is one plain tensor).
                if not (core and core.spec_for(name, nbytes, dtype_name(sent))):
                    rows.append((name, nbytes, dtype_name(sent), self._fastps_priority[i]))
        # Every gradient of the step has started: the plan (set again only when the
        # gradients change) fuses the small ones from the next step on, on every worker
        # after the same pushes.
        if fuse:
            fusion.update(rows)
        # Results arrive in priority order, so waiting in that order wastes nothing.
        pending.sort(key=lambda p: -self._fastps_priority[p[0]])
        lags = self._fastps_lags
        self._fastps_fetch = []
        for i, handle, sent, _ctx, grad in pending:
            if lags is None:
                break
            if isinstance(handle, _CoreHandle) and handle.host and sent is grad:
                self._fastps_fetch.append(
                    (i, grad, handle.name, self._fastps_priority[i], f / _api.size())
                )
            else:
                lags.unknown()  # off the core's path: this step has no catch-up
        for i, handle, sent, ctx, grad in pending:
            name = self._params[i].name
            if self._fastps_cb and ps is global_process_set and handle._finish is None:
                # The engine waits; what follows (decompression, device copies, the
                # update) are engine operations ordered after that wait.
                wait = functools.partial(_wait_named, handle, name)
                EW.push_wait(wait, [sent], self._fastps_priority[i], f"fastps.wait.{name}")
                self._fastps_deferred += 1
            else:
                try:
                    handle.synchronize()
                except FastPSError as exc:
                    raise type(exc)(f"parameter '{name}': {exc}") from None
                if lags is not None and isinstance(handle, _CoreHandle):
                    lags.note(handle.lag)
            if sent is not grad:
                grad[:] = self._fastps_compression.decompress(sent, ctx)
            for other in self._params[i].list_grad()[1:]:
                grad.copyto(other)

    def _fastps_live(self) -> List[Tuple[int, Any]]:
        return [(i, p) for i, p in enumerate(self._params) if p.grad_req != "null"]

    def _fastps_async_names(self, live: List[Tuple[int, Any]]) -> List[str]:
        return [f"{self._fastps_prefix}param.{i}" for i, _ in live]

    def _fastps_async_update(self, ignore_stale_grad: bool) -> None:
        """The local step, then the delta exchange (core/worker/async_mode.py)."""
        exchange = self._fastps_async
        assert exchange is not None
        live = self._fastps_live()
        for _, p in live:
            if np.dtype(p.dtype) not in (np.float32, np.float64, np.float16):
                raise FastPSError(
                    f"DistributedTrainer(async): parameter '{p.name}' is {np.dtype(p.dtype)} "
                    "(float32, float64, float16 are supported)"
                )
        before = [p.list_data()[0].asnumpy() for _, p in live]  # a copy each
        super()._update(ignore_stale_grad)
        after = [p.list_data()[0].asnumpy() for _, p in live]
        exchange.step(self._fastps_async_names(live), before, after)
        for (_, p), value in zip(live, after):
            for data in p.list_data():
                data[:] = value

    def pull_parameters(self) -> None:
        """Async: loads the parameters the servers hold (e.g. before a checkpoint)."""
        self._fastps_async_io(read=True)

    def push_parameters(self) -> None:
        """Async: rank 0's parameters replace the servers' (and every worker's); call it
        on every worker, e.g. after rank 0 loaded a checkpoint."""
        self._fastps_async_io(read=False)

    def _fastps_async_io(self, read: bool) -> None:
        exchange = self._fastps_async
        if exchange is None:
            raise FastPSError("pull_parameters/push_parameters need DistributedTrainer(async=True)")
        live = self._fastps_live()
        arrays = [p.list_data()[0].asnumpy() for _, p in live]
        named = list(zip(self._fastps_async_names(live), arrays))
        if read:
            exchange.pull(named)
        else:
            exchange.push(named)
        for (_, p), value in zip(live, arrays):
            for data in p.list_data():
                data[:] = value

    def _update(self, ignore_stale_grad: bool = False) -> None:
        runner = self._fastps_runner
        if runner is not None:
            runner.ensure_setup()  # one worker: no round ran it
            super()._update(ignore_stale_grad)
            self._fastps_rounds += 1
            if self._fastps_active():
                runner.after_step()
            return
        if self._fastps_async is not None and self._fastps_active():
            self._fastps_async_update(ignore_stale_grad)
            return
        if self._fastps_op != ReduceOp.ADASUM or not self._fastps_active():
            super()._update(ignore_stale_grad)
            self._fastps_rounds += 1
            if self._fastps_lags is not None and self._fastps_active():
                self._fastps_catch_up(ignore_stale_grad)
            return
        # Horovod's delta optimizer: the local update from ``start``, then
        # ``start + adasum(update)`` on every device.
        live = [(i, p) for i, p in enumerate(self._params) if p.grad_req != "null"]
        starts = [p.list_data()[0].copy() for _, p in live]
        super()._update(ignore_stale_grad)
        handles = []
        for (i, param), start in zip(live, starts):
            delta = param.list_data()[0] - start
            name = f"{self._fastps_prefix}delta.{i}"
            try:
                handles.append(
                    allreduce_async_(
                        delta,
                        name=name,
                        priority=self._fastps_priority[i],
                        process_set=self._fastps_set,
                        op=ReduceOp.ADASUM,
                    )
                )
            except FastPSError as exc:
                raise FastPSError(f"parameter '{param.name}': {exc}") from None
        for (_, param), start, handle in zip(live, starts, handles):
            try:
                delta = handle.synchronize()
            except FastPSError as exc:
                raise type(exc)(f"parameter '{param.name}': {exc}") from None
            start += delta
            for data in param.list_data():
                start.copyto(data)

    @property
    def applied_rounds(self) -> int:
        """Rounds of gradient sums applied: one per ``step()``, plus, under quorum rounds,
        those a slow worker caught up on (docs/guide/async.md, "Catch-up")."""
        return self._fastps_rounds

    def _fastps_catch_up(self, ignore_stale_grad: bool) -> None:
        """Applies the rounds that closed after the one just applied (``fastps.catch_up``):
        each fetched into the gradients, then the wrapped optimizer's update, in turn."""
        lags = self._fastps_lags
        assert lags is not None
        behind = lags.take()
        if not behind or not self._fastps_fetch:
            return

        def fetch() -> None:
            targets = [_fetch_target(g, name, p, s) for _, g, name, p, s in self._fastps_fetch]
            CU.fetch_round(targets)
            for i, grad, _, _, _ in self._fastps_fetch:
                param = self._params[i]
                for other in param.list_grad()[1:]:
                    grad.copyto(other)
                for data in param.list_data():
                    data._fresh_grad = True  # Gluon updates only fresh gradients

        def apply(_: None) -> None:
            mx.gluon.Trainer._update(self, ignore_stale_grad)
            self._fastps_rounds += 1

        CU.catch_up(behind, fetch, apply)


def _check_trainer_algorithm(
    algo: Algorithm,
    asynchronous: bool,
    op: ReduceOp,
    process_set: ProcessSet,
    quorum: bool,
    cross_barrier: Optional[bool],
) -> None:
    """Refuses, naming why, what an algorithm cannot run with."""
    if asynchronous:
        raise ValueError(f"DistributedTrainer: algorithm={algo!r} cannot run asynchronously")
    if op != ReduceOp.AVERAGE:
        raise FastPSError(f"DistributedTrainer: algorithm {algo.name} runs with op=Average only")
    if process_set is not global_process_set:
        raise FastPSError(
            f"DistributedTrainer: algorithm {algo.name} exchanges over every rank (its pushes "
            "go straight to the core): no process_set"
        )
    if quorum:
        raise FastPSError(
            f"DistributedTrainer: algorithm {algo.name} cannot catch up on quorum rounds "
            "(FASTPS_QUORUM_CATCH_UP)"
        )
    if basics.cross_barrier(cross_barrier) and basics.cross_barrier_explicit(cross_barrier):
        warnings.warn(
            f"fastps: cross-barrier updates off: algorithm {algo.name} steps synchronously",
            stacklevel=4,
        )


def _wait_named(handle: Any, name: str) -> None:
    try:
        handle.synchronize()
    except FastPSError as exc:
        raise type(exc)(f"parameter '{name}': {exc}") from None


def _cross_barrier(
    option: Optional[bool], op: ReduceOp, process_set: ProcessSet, quorum: bool = False
) -> bool:
    """Whether a DistributedTrainer hands its waits to the engine (see its docstring)."""
    if not basics.cross_barrier(option):  # the argument, else FASTPS_CROSS_BARRIER, else off
        return False
    why = None
    if op != ReduceOp.AVERAGE:
        why = "op=Adasum combines the updates after the step"
    elif process_set is not global_process_set:
        why = "a process set (its sums go through the collective layer)"
    elif quorum:
        why = "FASTPS_QUORUM_CATCH_UP (a slow worker catches up on whole rounds)"
    elif not EW.available():
        why = f"MXNet {mx.__version__} has no MXEnginePushSyncND"
    if why is not None:
        warnings.warn(
            f"fastps: cross-barrier updates off: {why}; step() waits for every gradient",
            stacklevel=3,
        )
        return False
    return True
