"""Horovod's elastic state: what a worker commits, restores after a failure, and hands to
workers that join. Framework-neutral; a plugin supplies how to broadcast an object and
which rank this process is (``fastps.torch.elastic.TorchState`` adds models and optimizers).
"""

from __future__ import annotations

import copy
import queue
from abc import ABC, abstractmethod
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
from fastps.control import elastic_wire as wire
from fastps.elastic import inplace, rendezvous
from fastps.errors import HostsUpdatedInterrupt

__all__ = ["State", "ObjectState", "Handler", "SnapshotHandler", "HandlerState"]


class State(ABC):
    """Base class: ``commit()`` = ``save()`` + ``check_host_updates()``.

    ``bcast_object(obj)`` returns rank 0's ``obj`` on every rank; ``get_rank()`` this
    process's rank in the current generation.
    """

    def __init__(self, bcast_object: Callable[[Any], Any], get_rank: Callable[[], int]) -> None:
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._reset_callbacks: List[Callable[[], None]] = []
        # Horovod's notification queue: (host epoch, HostUpdateResult) pushed by the
        # watcher thread (notifications.py) while this state is in hvd.elastic.run.
        self._host_messages: queue.Queue[Tuple[int, Any]] = queue.Queue()
        self._last_updated_timestamp = 0

    def register_reset_callbacks(self, callbacks: List[Callable[[], None]]) -> None:
        """Functions called after every reset (new world), e.g. to rescale the learning rate."""
        self._reset_callbacks.extend(callbacks)

    def on_hosts_updated(self, timestamp: int, update_res: Any) -> None:
        self._host_messages.put((timestamp, update_res))

    def on_reset(self) -> None:
        self._host_messages = queue.Queue()  # news of the old world
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Saves the state (the point a failure rolls back to), then raises
        ``HostsUpdatedInterrupt`` on every rank if workers joined or left since."""
        self.save()
        rendezvous.committed()
        self._check_host_updates(in_commit=True)
        inplace.opened()  # what this worker holds is the commit until the next update

    def serve(self) -> None:
        """A survivor's side of a spare's ``sync()`` after an in-place replacement
        (inplace.py): the same collectives, but nothing this worker holds changes (it holds
        the committed state). Default: ``sync()``, right for states whose sync loads rank
        0's values, equal to this worker's."""
        self.sync()

    def check_host_updates(self) -> None:
        """Raises ``HostsUpdatedInterrupt`` on every rank at once when the driver saw hosts
        added or removed since this generation formed. Rank 0 asks the driver; its answer is
        broadcast, so all ranks decide alike (a collective: call it on every rank)."""
        self._check_host_updates(in_commit=False)

    def _check_host_updates(self, in_commit: bool) -> None:
        """``check_host_updates``; ``in_commit``: right after ``save()``. Then, when
        workers of this generation leave here (their host left the discovery output:
        they are drained, docs/guide/elastic.md), every rank first syncs from rank 0 while
        the leaving ones still take part, and commits the result: what only they knew
        (an ``ElasticSampler``'s processed samples) stays in the world, and the others go
        on from this commit without a rollback or another sync."""
        newest = self._last_updated_timestamp
        while not self._host_messages.empty():
            newest = max(newest, self._host_messages.get_nowait()[0])
        if not wire.enabled():
            self._last_updated_timestamp = newest
            return
        from fastps.worker import api

        flags = np.zeros(4, np.float64)
        if self._rank() == 0:
            answer = rendezvous.host_updates()
            newest = max(newest, int(answer.get("epoch", 0)))
            flags[:] = (
                bool(answer.get("updated")),
                bool(answer.get("removed_only")),
                newest,
                bool(answer.get("draining")),
            )
        # Rank 0's answer as a sum (the others add zeros), not a broadcast: with elastic
        # servers a sum in flight when a server dies is summed again on the others; a
        # broadcast would fail and roll the generation back (docs/guide/elastic.md).
        total = api.push_pull(flags, average=False, name="fastps.elastic.host_updates")
        self._last_updated_timestamp = int(total[2])
        if total[0] > 0:
            if total[3] > 0 and in_commit:
                self.sync()
                self.save()
            raise HostsUpdatedInterrupt(bool(total[1] > 0))

    @abstractmethod
    def save(self) -> None:
        """Records the state a failure rolls back to."""

    @abstractmethod
    def restore(self) -> None:
        """Goes back to what save() recorded."""

    @abstractmethod
    def sync(self) -> None:
        """Makes every rank hold rank 0's state (a collective)."""

    def reset(self) -> None:  # noqa: B027 - an optional hook, not a required method
        """Called after the world changed, before the reset callbacks."""


class ObjectState(State):
    """Plain Python attributes (``epoch=0, batch=0``) committed by deep copy and synced
    from rank 0 with ``bcast_object``."""

    def __init__(
        self, bcast_object: Callable[[Any], Any], get_rank: Callable[[], int], **kwargs: Any
    ) -> None:
        self._saved_state: Dict[str, Any] = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self) -> None:
        self._saved_state = {k: copy.deepcopy(getattr(self, k)) for k in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def serve(self) -> None:
        # The spare receives rank 0's commit (FASTPS_ELASTIC_INPLACE=any: its attributes
        # as they are in the step); a survivor keeps its attributes as they are.
        if self._saved_state:
            if inplace.serves_current():
                self._bcast_object({k: getattr(self, k) for k in self._saved_state})
            else:
                self._bcast_object(self._saved_state)

    def _set_attrs(self) -> None:
        for attr, value in self._saved_state.items():
            setattr(self, attr, copy.deepcopy(value))


class Handler(ABC):
    """How one framework object (a model, an optimizer, a sampler) is committed, restored
    and synced; a plugin writes one per kind of object it knows."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.save()

    @abstractmethod
    def save(self) -> None:
        """Records the state a failure rolls back to."""

    @abstractmethod
    def restore(self) -> None:
        """Goes back to what save() recorded."""

    @abstractmethod
    def sync(self) -> None:
        """Makes every rank hold rank 0's state (a collective)."""

    def reset(self) -> None:  # noqa: B027 - an optional hook, not a required method
        """Called after the world changed (most handlers keep nothing per world)."""

    def serve(self) -> None:
        """A survivor's side of a spare's ``sync()`` (``State.serve``); default ``sync()``:
        loading rank 0's value changes nothing on a survivor holding the commit."""
        self.sync()


class SnapshotHandler(Handler):
    """A handler for an object whose state is one snapshot (a torch ``state_dict()``, an
    MXNet trainer's optimizer states): ``save`` keeps a deep copy of ``snapshot()``,
    ``restore`` hands ``load`` a fresh deep copy of it. Fresh, because a loader may keep
    the tensors it is given (torch's ``Optimizer.load_state_dict`` does) and the training
    that follows updates them in place: the commit must stay what it was for the next
    rollback."""

    @abstractmethod
    def snapshot(self) -> Any:
        """The object's state, e.g. its ``state_dict()``."""

    @abstractmethod
    def load(self, snapshot: Any) -> None:
        """Puts ``snapshot`` (the caller's to keep) back into the object."""

    def save(self) -> None:
        self._saved = copy.deepcopy(self.snapshot())

    def restore(self) -> None:
        self.load(copy.deepcopy(self._saved))


class HandlerState(ObjectState):
    """Framework objects and plain attributes committed together (Horovod's TorchState,
    TensorFlowKerasState...): ``handler_for(value)`` returns the plugin's Handler for an
    object it knows, or None for a plain attribute (deep-copied, synced from rank 0).
    Assigning a new object to a handled attribute (``state.model = m``) hands it to the
    same handler."""

    _handlers: Dict[str, Handler]

    def __init__(
        self,
        bcast_object: Callable[[Any], Any],
        get_rank: Callable[[], int],
        handler_for: Callable[[Any], Optional[Handler]],
        **kwargs: Any,
    ) -> None:
        handlers: Dict[str, Handler] = {}
        plain: Dict[str, Any] = {}
        for name, value in kwargs.items():
            handler = None if value is None else handler_for(value)
            if handler is None:
                plain[name] = value
            else:
                handlers[name] = handler
        self.__dict__["_handlers"] = handlers
        for name, handler in handlers.items():
            self.__dict__[name] = handler.value
        super().__init__(bcast_object=bcast_object, get_rank=get_rank, **plain)

    def __setattr__(self, name: str, value: Any) -> None:
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers:
            handlers[name].value = value
        super().__setattr__(name, value)

    def save(self) -> None:
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self) -> None:
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self) -> None:
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def serve(self) -> None:
        for handler in self._handlers.values():
            handler.serve()
        super().serve()

    def reset(self) -> None:
        for handler in self._handlers.values():
            handler.reset()
