"""In-place worker replacement without a rollback (``FASTPS_ELASTIC_INPLACE=1``).

With a spare ready (``fastpsrun --spare-hosts``), a worker lost in the first step after a
``commit()`` is replaced while the survivors stay inside that step: their gradient wait
fails, they leave the generation and join the next one (where the spare holds the dead
worker's rank), serve the spare's ``sync()`` (its broadcasts from rank 0) and push their
step's gradients again from copies taken before the first push. Their step then returns
normally: no restore, no reset callbacks, no forward/backward done again. The spare runs
the training function from the commit, i.e. the same step with the dead worker's data.

Correct only while every survivor holds the committed state, so a *window* opens at each
commit (and after each ``sync()``) and closes at the first update applied; in-place is
tried only when the failure comes inside the window and nothing but the step's own
gradient push_pulls ran since it opened (``_Window``). fastpsrun grants it only when every
survivor asked for it, the world keeps its size and ranks, rank 0 survived and a spare
took the lost rank; otherwise everybody rolls back, as without the option
(docs/guide/elastic.md, "Spare workers").

``FASTPS_ELASTIC_INPLACE=any``: a window opens at every update, and the survivors serve
the spare rank 0's state as it is in the step (before the step's update) rather than
the commit, so a failure in any step can be met in place.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from fastps import config
from fastps.control import elastic_wire as wire
from fastps.elastic import rendezvous
from fastps.elastic.generation import generation_failed
from fastps.errors import FastPSError, HorovodInternalError

log = logging.getLogger("fastps.elastic")

ENV = "FASTPS_ELASTIC_INPLACE"  # read by fastps.config.elastic_inplace


def mode() -> str:
    """``""`` (off), ``"commit"`` (``1``: the first step after a commit, the spare gets the
    commit) or ``"any"`` (any step: the spare gets rank 0's state as it is in the step)."""
    if not wire.enabled():
        return ""
    return config.elastic_inplace()


def enabled() -> bool:
    """Whether this elastic worker may replace a lost peer in place."""
    return mode() != ""


def serves_current() -> bool:
    """Whether a survivor serves the spare its state as it is now rather than its commit
    (``any``: the step's start, which an optimizer that has not applied the step holds)."""
    return mode() == "any"


class Rejoined(HorovodInternalError):
    """The generation failed and this worker already joined the next one (in-place was
    asked for and refused): the run loop restores the last commit and syncs, without
    leaving the generation it is in."""


class _Window:
    """What happened since the state was last committed (or synced) on this worker."""

    def __init__(self, session: Any, ops: int) -> None:
        self.session = session  # the core session the window opened in
        self.ops = ops  # push_pulls submitted in that session when it opened
        self.accounted = 0  # of those since, the ones the optimizer's step started
        self.blocker: Optional[str] = None  # why a redo of this step would be wrong


_window: Optional[_Window] = None
_state: Any = None  # the State of the running hvd.elastic.run
_reset: Optional[Callable[[], None]] = None
_warned = False


def _session() -> Any:
    from fastps.worker import api

    return api._state


def _ops_submitted() -> int:
    st = _session()
    return int(st.submitted) if st is not None else 0


def enter(state: Any, reset: Callable[[], None], supported: bool = True) -> None:
    """``hvd.elastic.run`` started with ``state``; ``reset`` leaves the generation and
    joins the next. ``supported``: the plugin's optimizer can push a step again in place
    (the torch plugin's); otherwise a failure always rolls back, said once here."""
    global _state, _reset, _warned
    if not supported:
        if enabled() and not _warned:
            _warned = True
            log.warning(
                "%s=1: this framework's optimizer cannot stay in place (only fastps.torch's "
                "DistributedOptimizer can); a lost worker rolls the others back",
                ENV,
            )
        return
    _state, _reset = state, reset


def leave(state: Any) -> None:
    global _state, _reset, _window
    if _state is state:
        _state = _reset = _window = None


def opened() -> None:
    """The state was committed or synced: this worker holds the committed state."""
    global _window
    if _state is None or not enabled():
        return
    _window = _Window(_session(), _ops_submitted())


def granted() -> bool:
    """Whether the generation this worker joined last replaced a lost rank in place (a
    spare's ``sync()`` then takes that rank's place rather than the world's union)."""
    answer = rendezvous.assignment()
    return bool(answer and answer.get("in_place"))


def keeping() -> bool:
    """Whether a plugin's step should keep copies of its gradients before pushing them."""
    return _window is not None and _window.blocker is None


def account(ops: int) -> None:
    """``ops`` push_pulls were started by the step's gradient exchange (not the program's)."""
    if _window is not None:
        _window.accounted += ops


def block(reason: str) -> None:
    """This step cannot be pushed again as it was (``reason`` goes in the log line)."""
    if _window is not None and _window.blocker is None:
        _window.blocker = reason


def update_applied() -> None:
    """An optimizer applied an update: the state is no longer the committed one. With
    ``any`` a new window opens: what the worker holds is where the next step starts."""
    global _window
    _window = None
    if _state is not None and mode() == "any":
        _window = _Window(_session(), _ops_submitted())


def unsafe_reason() -> Optional[str]:
    """None when a redo of the current step in place is correct, else why not."""
    if _state is None:
        return "not inside hvd.elastic.run"
    w = _window
    if w is None:
        return "an update was applied since the last commit"
    if w.blocker is not None:
        return w.blocker
    if w.session is not _session():
        return "the commit was made in another generation"
    other = _ops_submitted() - w.ops - w.accounted
    if other != 0:
        return (
            f"{other} collective(s) other than this step's gradients ran since the last commit "
            "(the spare would run them again)"
        )
    return None


def replace_in_place(exc: BaseException, redo: Callable[[], None]) -> bool:
    """Called by a plugin's step whose gradient wait raised ``exc``. False: not a case for
    in-place (the caller re-raises, the run loop rolls back). True: this worker is in the
    next generation, the spare has the commit, and ``redo()`` pushed the step's gradients
    again. Raises ``Rejoined`` when fastpsrun refused (the others roll back)."""
    if not enabled() or _state is None or _reset is None:
        return False
    if not generation_failed(exc):
        return False
    reason = unsafe_reason()
    if reason is not None:
        log.warning("in-place replacement not tried (%s): rolling back to the last commit", reason)
        return False
    state, reset = _state, _reset
    failed = rendezvous.generation()
    log.warning("generation %d failed (%s): asking to stay in place", failed, exc)
    rendezvous.ask_in_place(True)
    try:
        reset()
    except FastPSError as again:
        if not generation_failed(again):
            raise
        # Not in a working generation: the run loop rolls back and joins again.
        raise HorovodInternalError(f"generation failed while joining in place: {again}") from again
    finally:
        rendezvous.ask_in_place(False)
    answer = rendezvous.assignment() or {}
    if not answer.get("in_place"):
        why = answer.get("in_place_refused") or "no reason given"
        log.warning(
            "in-place replacement refused by fastpsrun (%s): rolling back to the last commit", why
        )
        raise Rejoined(f"generation {failed} failed: {exc}; in place refused: {why}")
    log.warning(
        "generation %d: rank %d stays in place; serving the commit to the spare",
        rendezvous.generation(),
        answer.get("rank", -1),
    )
    state.serve()
    opened()  # the redo's pushes are the step's own again
    redo()
    return True
