"""What each framework plugin gives the elastic API, and what it gets back.

A plugin's ``elastic`` module used to repeat the same glue: its rank, its object broadcast,
"leave this generation and join the next" (the plugin's session, then the core), the run
decorator and an ``ObjectState`` bound to its broadcast. ``Framework`` holds that glue
once; a plugin creates one with its own functions and only adds the handlers of its
objects (models, optimizers, samplers) on top of ``state.HandlerState``.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Optional, Type

from . import run as _run
from . import state as _state


class Framework:
    """A plugin's elastic glue.

    ``rank()`` and ``bcast_object(obj)`` (rank 0's ``obj`` everywhere) are the plugin's;
    ``leave()`` ends its session, ``join()`` starts one (``init``); ``before_join()`` runs
    between them (e.g. to restart per-session counters). ``translate(exc)`` may turn a
    framework error raised by a generation that failed into the exception to raise
    (``HorovodInternalError``), or return None to let it through.
    """

    def __init__(
        self,
        *,
        rank: Callable[[], int],
        bcast_object: Callable[[Any], Any],
        leave: Callable[[], None],
        join: Callable[[], None],
        before_join: Optional[Callable[[], None]] = None,
        translate: Optional[Callable[[BaseException], Optional[BaseException]]] = None,
        translated: tuple = (),
    ) -> None:
        self.rank = rank
        self.bcast_object = bcast_object
        self._leave = leave
        self._join = join
        self._before_join = before_join
        self._translate = translate
        self._translated = translated

    def state_args(self) -> Dict[str, Any]:
        """The keyword arguments the framework-neutral states take."""
        return {"bcast_object": self.bcast_object, "get_rank": self.rank}

    def reset(self) -> None:
        """Leaves this generation (the plugin's session, then the core) and joins the next."""
        import fastps

        self._leave()
        fastps.shutdown()
        if self._before_join is not None:
            self._before_join()
        self._join()

    def run(self, func: Callable[..., Any]) -> Callable[..., Any]:
        """Horovod's ``hvd.elastic.run``: ``func(state, ...)`` is re-run from the last commit
        after a failure, and with the new world after workers joined or left."""
        body = func
        if self._translate is not None and self._translated:
            translate, kinds = self._translate, self._translated

            @functools.wraps(func)
            def body(*args: Any, **kwargs: Any) -> Any:
                try:
                    return func(*args, **kwargs)
                except kinds as exc:
                    replacement = translate(exc)
                    if replacement is None:
                        raise
                    raise replacement from exc

        return _run.run_fn(body, self.reset)

    def object_state_class(self, module: str) -> Type[_state.ObjectState]:
        """Horovod's ``ObjectState(**attrs)`` for this framework (synced with its broadcast)."""
        framework = self

        class ObjectState(_state.ObjectState):
            """Horovod's ObjectState: plain attributes, committed by deep copy and synced
            from rank 0."""

            def __init__(self, **kwargs: Any) -> None:
                super().__init__(**framework.state_args(), **kwargs)

        ObjectState.__module__ = module
        return ObjectState
