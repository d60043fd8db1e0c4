"""What each framework plugin gives the elastic API, and what it gets back.

Every plugin package has Horovod's ``rank()``, ``init()``, ``shutdown()`` and
``broadcast_object(obj, root_rank)``; from those ``Framework`` makes the elastic glue the
plugins would otherwise each repeat: "leave this generation and join the next", the run
decorator (the retry loop, ``run.py``), the failure test for the framework's own errors and
an ``ObjectState`` bound to the plugin's broadcast. A plugin's ``elastic`` module creates
one and adds only the handlers of its objects (models, optimizers, samplers) on top of
``state.HandlerState``.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any, Callable, Dict, Optional, Tuple, Type

from fastps.elastic import run as _run
from fastps.elastic import state as _state
from fastps.elastic.generation import generation_aborted
from fastps.errors import HorovodInternalError


class Framework:
    """A plugin's elastic glue.

    ``package`` is the plugin package (``"fastps.torch"``); its functions are looked up
    when first called, since the package imports its ``elastic`` module while it loads.
    ``before_join()`` runs between leaving a generation and joining the next (e.g. to
    restart per-session counters). ``framework_errors``: exception types of the framework
    that may carry a fastps failure (TensorFlow's ``OpError`` from an op inside a
    ``tf.function``); one raised while the generation is aborted is that generation's
    failure and reaches the run loop as ``HorovodInternalError``, as Horovod's does.
    ``in_place``: the plugin's optimizer meets a spare in place (``inplace.py``).
    """

    def __init__(
        self,
        package: str,
        *,
        before_join: Optional[Callable[[], None]] = None,
        framework_errors: Tuple[Type[BaseException], ...] = (),
        in_place: bool = False,
    ) -> None:
        self._package = package
        self._in_place = in_place
        self._before_join = before_join
        self._framework_errors = framework_errors

    def _plugin(self, name: str) -> Any:
        return getattr(importlib.import_module(self._package), name)

    def rank(self) -> int:
        """This process's rank in the current generation."""
        return int(self._plugin("rank")())

    def bcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (the plugin's object broadcast)."""
        return self._plugin("broadcast_object")(obj, root_rank=0)

    def state_args(self) -> Dict[str, Any]:
        """The keyword arguments the framework-neutral states take."""
        return {"bcast_object": self.bcast_object, "get_rank": self.rank}

    def reset(self) -> None:
        """Leaves this generation (the plugin's session, then the core) and joins the next."""
        import fastps

        self._plugin("shutdown")()
        fastps.shutdown()
        if self._before_join is not None:
            self._before_join()
        self._plugin("init")()

    def failure(self, exc: BaseException) -> Optional[BaseException]:
        """The ``HorovodInternalError`` a framework error stands for when this generation
        was aborted (None: the error is the program's own, let it through)."""
        if isinstance(exc, self._framework_errors) and generation_aborted():
            return HorovodInternalError(f"{type(exc).__name__}: {exc}")
        return None

    def run(self, func: Callable[..., Any]) -> Callable[..., Any]:
        """Horovod's ``hvd.elastic.run``: ``func(state, ...)`` is re-run from the last commit
        after a failure, and with the new world after workers joined or left."""
        body = func
        if self._framework_errors:
            kinds = self._framework_errors

            @functools.wraps(func)
            def body(*args: Any, **kwargs: Any) -> Any:
                try:
                    return func(*args, **kwargs)
                except kinds as exc:
                    replacement = self.failure(exc)
                    if replacement is None:
                        raise
                    raise replacement from exc

        return _run.run_fn(body, self.reset, self._in_place)

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
