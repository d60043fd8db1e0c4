"""Elastic training for MXNet: ``hvd.elastic.run``, ``ObjectState`` and ``GluonState``.

Horovod has no elastic API for MXNet; this is the one of ``fastps.torch.elastic`` for Gluon,
on the same framework-neutral parts (``fastps.elastic``: the run loop, the state classes,
the rendezvous). ``GluonState(net, trainer, epoch=0, ...)`` commits the network's
parameters (a copy of each), the trainer's optimizer state (momentum and the like, the
update counts, the learning rate) and plain attributes together; ``restore()`` puts the
copies back, ``sync()`` hands rank 0's to every rank. Launch with
``fastpsrun --min-np A --max-np B --host-discovery-script S python train.py``
(docs/guide/elastic.md).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import mxnet as mx
from fastps.elastic import binding as _binding
from fastps.elastic import state as _state
from fastps.errors import FastPSError, HorovodInternalError, HostsUpdatedInterrupt, WorkerLostError

__all__ = [
    "run",
    "State",
    "ObjectState",
    "GluonState",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "WorkerLostError",
]

State = _state.State


_framework = _binding.Framework("fastps.mxnet")
run = _framework.run
ObjectState = _framework.object_state_class(__name__)


# ------------------------------------------------------------------ handlers


def _param_dict(value: Any) -> Any:
    return value.collect_params() if hasattr(value, "collect_params") else value


def _parameters(value: Any) -> List[Tuple[str, Any]]:
    """(name, Parameter) of a Block or a ParameterDict, by name (the same order everywhere)."""
    return sorted(_param_dict(value).items(), key=lambda kv: str(kv[0]))


class _ParametersHandler(_state.Handler):
    """A Gluon Block or ParameterDict: each initialized parameter's value, copied to the
    CPU (parameters whose shape Gluon still defers have nothing to save yet)."""

    def save(self) -> None:
        saved: Dict[str, Any] = {}
        for name, param in _parameters(self.value):
            try:
                data = param.data()
            except mx.gluon.parameter.DeferredInitializationError:
                continue
            saved[name] = data.copyto(mx.cpu())
        self._saved = saved

    def restore(self) -> None:
        for name, param in _parameters(self.value):
            saved = self._saved.get(name)
            if saved is not None:
                param.set_data(saved)

    def sync(self) -> None:
        from fastps.mxnet.training import broadcast_parameters

        broadcast_parameters(_param_dict(self.value), root_rank=0, prefix="elastic.parameters.")


class _TrainerHandler(_state.SnapshotHandler):
    """A ``gluon.Trainer`` (fastps's ``DistributedTrainer`` included): its updaters' states
    (pickled, as ``Trainer.save_states`` writes them), the optimizer's update counts (they
    drive learning-rate schedules and Adam's bias correction) and its learning rate."""

    def snapshot(self) -> Dict[str, Any]:
        trainer = self.value
        updaters = getattr(trainer, "_updaters", None) or []
        opt = trainer._optimizer
        return {
            "states": updaters[0].get_states(dump_optimizer=False) if updaters else None,
            "num_update": int(opt.num_update),
            "counts": dict(opt._index_update_count),
            "lr": float(opt.lr),
        }

    def load(self, snap: Dict[str, Any]) -> None:
        trainer = self.value
        opt = trainer._optimizer
        if snap["states"] is not None:
            for updater in getattr(trainer, "_updaters", None) or []:
                updater.set_states(snap["states"])
        opt.num_update = snap["num_update"]
        opt._index_update_count = dict(snap["counts"])
        opt.lr = snap["lr"]

    def sync(self) -> None:
        self.load(_framework.bcast_object(self.snapshot()))

    def reset(self) -> None:
        # The new generation's core has no fusion plan and has not compared the ranks'
        # gradients: every rank (joiners included) does both again at its first step.
        fusion = getattr(self.value, "_fastps_fusion", None)
        if fusion is not None:
            fusion.forget()
        if hasattr(self.value, "_fastps_checked"):
            self.value._fastps_checked = False


def _is_parameters(value: Any) -> bool:
    return isinstance(value, (mx.gluon.Block, mx.gluon.ParameterDict))


def _handler_for(value: Any) -> Optional[_state.Handler]:
    if _is_parameters(value):
        return _ParametersHandler(value)
    if isinstance(value, mx.gluon.Trainer):
        return _TrainerHandler(value)
    return None


class GluonState(_state.HandlerState):
    """A Gluon network (Block or ParameterDict), its trainer and any other attribute
    (``epoch=0``...) committed together; ``commit()`` copies them (the point a failure
    rolls back to), ``sync()`` broadcasts rank 0's to every rank. Set the trainer's
    learning rate for the new world in a reset callback (``register_reset_callbacks``)."""

    def __init__(self, net: Any = None, trainer: Any = None, **kwargs: Any) -> None:
        if net is not None and not _is_parameters(net):
            raise FastPSError(
                f"GluonState: net must be a gluon Block or ParameterDict, got {type(net).__name__}"
            )
        if trainer is not None and not isinstance(trainer, mx.gluon.Trainer):
            raise FastPSError(
                f"GluonState: trainer must be a gluon.Trainer, got {type(trainer).__name__}"
            )
        kwargs.update(net=net, trainer=trainer)
        super().__init__(**_framework.state_args(), handler_for=_handler_for, **kwargs)
