"""Horovod's elastic run loop (``hvd.elastic.run``), framework-neutral.

``run_fn(func, reset)`` wraps a training function ``func(state, ...)``: sync the state
from rank 0, run; on ``HorovodInternalError`` (a peer died: the generation's ops failed)
restore the last commit; on ``HostsUpdatedInterrupt`` (workers joined or left) keep the
state as is; then ``reset()`` (leave this generation, join the next) and go round again.
A worker whose host left the discovery output is told so by the rendezvous once it has
committed and left its generation (``rendezvous.Drained``): it exits 0 (``SystemExit``).
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any, Callable, TypeVar

from fastps.elastic import inplace, notifications, rendezvous
from fastps.elastic.generation import generation_failed
from fastps.elastic.rendezvous import Drained
from fastps.elastic.state import State
from fastps.errors import FastPSError, HostsUpdatedInterrupt

log = logging.getLogger("fastps.elastic")

F = TypeVar("F", bound=Callable[..., Any])


def _reset_until_joined(reset: Callable[[], None]) -> None:
    """Leaves this generation and joins the next; a peer that dies while the new generation
    connects fails that one too, so join again (the driver bounds how long this goes on:
    below --min-np for longer than --elastic-timeout, its answer is an error)."""
    while True:
        try:
            reset()
            return
        except Drained:
            raise
        except FastPSError as exc:
            if not generation_failed(exc):
                raise
            log.warning("generation %d failed while starting (%s)", rendezvous.generation(), exc)


def run_fn(
    func: Callable[..., Any], reset: Callable[[], None], in_place: bool = False
) -> Callable[..., Any]:
    """``in_place``: the plugin's optimizer can stay in place when a peer is replaced
    (``inplace.py``; the torch plugin's)."""

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        notifications.register_listener(state)
        inplace.enter(state, reset, in_place)
        try:
            return _loop(state, *args, **kwargs)
        finally:
            inplace.leave(state)
            notifications.remove_listener(state)

    def _loop(state: State, *args: Any, **kwargs: Any) -> Any:
        try:
            return _rounds(state, *args, **kwargs)
        except Drained as exc:
            # This worker's host left the discovery output: it committed, left its
            # generation, and the others go on without it (fastpsrun's answer).
            log.warning("%s", exc)
            raise SystemExit(0) from None

    def _rounds(state: State, *args: Any, **kwargs: Any) -> Any:
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    state.sync()
                    if inplace.granted():
                        # a spare that took a lost rank in place: what it received is
                        # where it goes back to (its own constructor's state is not)
                        state.save()
                inplace.opened()  # every rank holds rank 0's committed state now
                return func(state, *args, **kwargs)
            except inplace.Rejoined as exc:
                # In place was refused: already in the next generation, roll back there.
                log.warning("%s: restoring the last commit", exc)
                state.restore()
                state.on_reset()
                skip_sync = False
                continue
            except Drained:
                raise  # fastpsrun told this worker to leave (_loop)
            except FastPSError as exc:
                if not generation_failed(exc):
                    raise
                log.warning(
                    "generation %d failed (%s): restoring the last commit",
                    rendezvous.generation(),
                    exc,
                )
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as exc:
                skip_sync = exc.skip_sync
            started = time.monotonic()
            _reset_until_joined(reset)
            log.info(
                "joined generation %d in %.2f s",
                rendezvous.generation(),
                time.monotonic() - started,
            )
            state.on_reset()

    return wrapper
