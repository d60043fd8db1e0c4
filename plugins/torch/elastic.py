"""Horovod's elastic API for PyTorch: ``hvd.elastic.run``, ``TorchState``, ``ElasticSampler``.

A thin adapter over ``fastps.elastic`` (the run loop, the state base classes, the
rendezvous): this module adds how torch models, optimizers and samplers are committed,
restored and synced from rank 0. Launch with
``fastpsrun --min-np A --max-np B --host-discovery-script S python train.py``
(docs/guide/elastic.md).
"""

from __future__ import annotations

import copy
import itertools
import math
from typing import Any, Dict, Iterator, List, Optional

import torch
from fastps.elastic import binding as _binding
from fastps.elastic import inplace as _inplace
from fastps.elastic import rendezvous as _rendezvous
from fastps.elastic import state as _state
from fastps.errors import HorovodInternalError, HostsUpdatedInterrupt, WorkerLostError
from fastps.torch.basics import is_initialized, rank, size

__all__ = [
    "run",
    "State",
    "ObjectState",
    "TorchState",
    "ElasticSampler",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "WorkerLostError",
]

State = _state.State


def _warm_up() -> None:
    """A spare's lazy first-use work, done while it waits: torch's first optimizer
    imports torch._dynamo (~10 s on a loaded 2-core machine), which would otherwise
    delay the first step after the spare took a failed rank."""
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)


_rendezvous.on_standby(_warm_up)


def _restart_call_numbers() -> None:
    # The module's collective calls are numbered per process; a joining process starts at
    # 0, so every rank starts again with the new generation.
    from fastps.torch import functions

    functions._calls = itertools.count()


_framework = _binding.Framework("fastps.torch", before_join=_restart_call_numbers, in_place=True)
run = _framework.run
ObjectState = _framework.object_state_class(__name__)


# ------------------------------------------------------------------ handlers


class _StateDictHandler(_state.SnapshotHandler):
    """An object with ``state_dict()`` and ``load_state_dict()`` (models, optimizers,
    samplers)."""

    def snapshot(self) -> Any:
        return self.value.state_dict()

    def load(self, snapshot: Any) -> None:
        self.value.load_state_dict(snapshot)


class _ModelHandler(_StateDictHandler):
    def sync(self) -> None:
        from fastps.torch.functions import broadcast_parameters

        broadcast_parameters(self.value.state_dict(), root_rank=0)


class _OptimizerHandler(_StateDictHandler):
    def restore(self) -> None:
        _abandon_gradients(self.value)
        super().restore()

    def sync(self) -> None:
        from fastps.torch.functions import broadcast_optimizer_state

        sync = getattr(self.value, "_fastps", None)
        if sync is not None and sync.active:
            sync.check_same_everywhere()  # skipped at construction in an elastic job
        broadcast_optimizer_state(self.value, root_rank=0)

    def reset(self) -> None:
        _abandon_gradients(self.value)


def _abandon_gradients(optimizer: Any) -> None:
    """Forgets a DistributedOptimizer's push_pulls of the generation that failed."""
    sync = getattr(optimizer, "_fastps", None)
    if sync is not None:
        sync.abandon()


class _SamplerHandler(_StateDictHandler):
    def snapshot(self) -> Any:
        # Horovod's state_dict and, for a spare taking a lost rank in place, the position
        return {**self.value.state_dict(), **self.value.position()}

    def _exchange(self, state: Dict[str, Any]) -> Dict[str, Any]:
        """Rank 0's ``state`` with the union of every rank's processed indices (what the
        world processed)."""
        from fastps.torch.functions import allgather_object

        done: set = set()
        for part in allgather_object(set(self.value.processed_indices)):
            done |= part
        state["processed_indices"] = done
        return _framework.bcast_object(state)

    def sync(self) -> None:
        state = self._exchange(self.value.state_dict())
        if _inplace.granted():
            # A spare taking a lost rank in place: the survivors keep their shards, so it
            # takes the lost rank's shard and position instead of re-sharding.
            self.value.take_place(state)
        else:
            self.value.load_state_dict(state)

    def serve(self) -> None:
        # The spare's collectives; rank 0 sends its commit (a program may record the
        # step's batch before step(): the commit says where the lost rank was), and this
        # rank's own shard and position stay.
        self._exchange(self.snapshot() if _inplace.serves_current() else copy.deepcopy(self._saved))

    def reset(self) -> None:
        self.value.reset()


def _handler_for(value: Any) -> Optional[_state.Handler]:
    if isinstance(value, torch.nn.Module):
        return _ModelHandler(value)
    if isinstance(value, torch.optim.Optimizer):
        return _OptimizerHandler(value)
    if isinstance(value, ElasticSampler):
        return _SamplerHandler(value)
    return None


class TorchState(_state.HandlerState):
    """Horovod's TorchState: ``model``, ``optimizer``, samplers and any other attribute
    (``epoch=0``...) committed together. ``commit()`` deep-copies them (the point a failure
    rolls back to); ``sync()`` broadcasts rank 0's to every rank."""

    def __init__(self, model: Any = None, optimizer: Any = None, **kwargs: Any) -> None:
        kwargs.update(model=model, optimizer=optimizer)
        super().__init__(**_framework.state_args(), handler_for=_handler_for, **kwargs)


class ElasticSampler(torch.utils.data.Sampler):
    """Shards a dataset over the current world and skips the samples already processed
    this epoch, so a world that changes mid-epoch neither repeats nor drops samples.

    Call ``record_batch(batch_idx, batch_size)`` (or ``record_indices``) after each batch
    and ``set_epoch(epoch)`` at each epoch's start; keep the sampler in the TorchState.
    """

    def __init__(self, dataset: Any, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices: set = set()
        self.num_replicas = 1
        self.rank = 0
        self.remaining_indices: List[int] = []
        self.num_samples = 0
        self.total_size = 0
        self.indices: List[int] = []
        # In-place replacement: the processed set the current shards were cut from, the
        # indices recorded since, and how many of the shard this rank skips (a spare that
        # took a lost rank's place starts where that rank was).
        self.basis: set = set()
        self.consumed = 0
        self.skip = 0
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        self.record_indices(self.get_indices(batch_idx, batch_size))

    def record_indices(self, indices: Any) -> None:
        done = [int(i) for i in indices]
        self.processed_indices.update(done)
        self.consumed += len(done)

    def get_indices(self, batch_idx: int, batch_size: int) -> List[int]:
        start = batch_idx * batch_size
        return self.indices[start : min(start + batch_size, len(self.indices))]

    def state_dict(self) -> Dict[str, Any]:
        return {"epoch": self.epoch, "processed_indices": set(self.processed_indices)}

    def position(self) -> Dict[str, Any]:
        """Where this rank is in its shard (``take_place``'s input, with ``state_dict``)."""
        return {"basis": set(self.basis), "consumed": self.consumed}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.epoch = int(state_dict["epoch"])
        self.processed_indices = set(state_dict["processed_indices"])
        self.reset()

    def take_place(self, state: Dict[str, Any]) -> None:
        """A spare replacing a lost rank in place (``FASTPS_ELASTIC_INPLACE=1``): the
        shard that rank had (cut from the same ``basis`` over the same world) from where
        it was (``consumed`` indices in; every rank records as many per step), so this
        rank reads the samples the lost one would have read next."""
        self.epoch = int(state["epoch"])
        self.processed_indices = set(state.get("basis", ()))
        self.reset()
        self.skip = int(state.get("consumed", 0))
        self.consumed = self.skip
        self.processed_indices.update(self.indices[: self.skip])
        self._shard()

    def reset(self) -> None:
        """Re-shards the remaining samples over the current world."""
        self.basis = set(self.processed_indices)
        self.consumed = self.skip = 0
        if is_initialized():
            self.num_replicas, self.rank = size(), rank()
        self.remaining_indices = [
            i for i in range(len(self.dataset)) if i not in self.processed_indices
        ]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas
        self._shard()

    def _shard(self) -> None:
        order = list(self.remaining_indices)
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = [order[i] for i in torch.randperm(len(order), generator=g).tolist()]
        if order:
            order += order[: self.total_size - len(order)]  # pad to a multiple of the world
        self.indices = order[self.rank : self.total_size : self.num_replicas][self.skip :]

    def __iter__(self) -> Iterator[int]:
        self._shard()
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)
