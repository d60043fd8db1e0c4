"""Horovod's elastic API for Keras 3 (``horovod.tensorflow.keras.elastic``): the state and
run loop of ``fastps.tensorflow.elastic`` plus the callbacks that keep the state current
inside ``model.fit``::

    state = hvd.elastic.KerasState(model, batch=0, epoch=0)

    @hvd.elastic.run
    def train(state):
        model.fit(data, steps_per_epoch=..., epochs=epochs, initial_epoch=state.epoch,
                  callbacks=[hvd.elastic.CommitStateCallback(state),
                             hvd.elastic.UpdateBatchStateCallback(state),
                             hvd.elastic.UpdateEpochStateCallback(state)])
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import keras
from fastps.tensorflow.elastic import (
    HorovodInternalError,
    HostsUpdatedInterrupt,
    KerasState,
    ObjectState,
    State,
    TensorFlowKerasState,
    WorkerLostError,
    run,
)

__all__ = [
    "run",
    "State",
    "ObjectState",
    "KerasState",
    "TensorFlowKerasState",
    "CommitStateCallback",
    "UpdateBatchStateCallback",
    "UpdateEpochStateCallback",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "WorkerLostError",
]


class CommitStateCallback(keras.callbacks.Callback):
    """``state.commit()`` every ``batches_per_commit`` batches (a collective: every rank
    commits at the same batch, and hosts that joined are let in there)."""

    def __init__(self, state: Any, batches_per_commit: int = 1) -> None:
        super().__init__()
        if int(batches_per_commit) < 1:
            raise ValueError(f"batches_per_commit must be >= 1, got {batches_per_commit}")
        self.state = state
        self.batches_per_commit = int(batches_per_commit)
        self._left = self.batches_per_commit

    def on_train_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        # Every rank counts from the same batch in each fit(): after a change of world a
        # survivor's count (cut short by a commit that raised) and a newcomer's must agree,
        # or their commits -- collectives -- fall on different batches and wait forever.
        self._left = self.batches_per_commit

    def on_train_batch_end(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self._left -= 1
        if self._left <= 0:
            self._left = self.batches_per_commit  # before commit(), which may raise
            self.commit()

    def commit(self) -> None:
        """One commit (a subclass may count or extend them, as Horovod's tests do)."""
        self.state.commit()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keeps ``state.batch`` at the index of the last finished batch of the epoch (0 again
    once the epoch ends), as Horovod's does."""

    def __init__(self, state: Any) -> None:
        super().__init__()
        self.state = state

    def on_train_batch_end(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self.state.batch = batch

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Counts finished epochs in ``state.epoch``, so a run that restarts with
    ``fit(epochs=total - state.epoch)`` (Horovod's examples) or
    ``fit(epochs=total, initial_epoch=state.epoch)`` resumes where the world left off."""

    def __init__(self, state: Any) -> None:
        super().__init__()
        self.state = state

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self.state.epoch += 1
