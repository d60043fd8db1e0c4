"""The one protocol of a running operation's handle, in the core and in every plugin.

Whatever starts work without waiting for it — ``fastps.push_pull_async``, a collective's
``*_async`` in ``fastps.collectives``, ``fastps.torch`` / ``fastps.tensorflow`` /
``fastps.mxnet``'s ``*_async`` functions, the pieces a plugin's handle waits on — returns an
object with these methods, so that code waiting on handles (a training loop, a plugin's
grouped handle, the optimizer's wait for its gradients) needs no knowledge of which kind it
holds:

- ``poll()``: True once the result is ready, so ``synchronize`` will not block (inside a
  TensorFlow graph: a bool tensor);
- ``synchronize(timeout=None)``: waits at most ``timeout`` seconds (None: the job's op
  timeout, ``FASTPS_OP_TIMEOUT``) and returns the operation's output; a second call returns
  the same output; a failure raises (``fastps.errors``) naming the operation;
- ``wait``: the same as ``synchronize`` (Horovod's spelling).

``tests/unit/test_waitable.py`` checks that every handle class of the core and the plugins
declares and implements it.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol, runtime_checkable

__all__ = ["Waitable"]


@runtime_checkable
class Waitable(Protocol):
    """A running operation: ``poll()``, ``synchronize(timeout=None)``, ``wait``."""

    def poll(self) -> Any:
        """True once the result is ready."""
        ...

    def synchronize(self, timeout: Optional[float] = None) -> Any:
        """Waits (at most ``timeout`` seconds; None: the op timeout) and returns the output."""
        ...

    def wait(self, timeout: Optional[float] = None) -> Any:
        """The same as :meth:`synchronize`."""
        ...
