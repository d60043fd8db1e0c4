"""fastps: data-parallel training over a C++ parameter-server pipeline.

Framework plugins live in ``fastps.torch``, ``fastps.tensorflow`` and ``fastps.mxnet``;
this package is the framework-agnostic API over numpy/buffer-protocol/DLPack arrays.
"""

from __future__ import annotations

from typing import Any

from fastps import _moved
from fastps.errors import FastPSAbort, FastPSError, FastPSTimeoutError
from fastps.version import __version__

_moved.install()  # the flat layout's module names keep working (_moved.py)

_API = {
    "init",
    "shutdown",
    "is_initialized",
    "rank",
    "size",
    "local_rank",
    "local_size",
    "cross_rank",
    "cross_size",
    "num_servers",
    "push_pull",
    "push_pull_async",
    "broadcast",
    "broadcast_async",
    "barrier",
    "poll",
    "synchronize",
    "Handle",
    "grouped_push_pull",
    "grouped_push_pull_async",
    "submission_batch",
}
# Lazily too: the compressors check their specs with the C++ core.
_COMPRESSION = {"Compression", "CoreCompressor"}

__all__ = [
    "Compression",
    "CoreCompressor",
    "FastPSAbort",
    "FastPSError",
    "FastPSTimeoutError",
    "Handle",
    "__version__",
    "barrier",
    "broadcast",
    "broadcast_async",
    "cross_rank",
    "cross_size",
    "grouped_push_pull",
    "grouped_push_pull_async",
    "init",
    "is_initialized",
    "local_rank",
    "local_size",
    "num_servers",
    "poll",
    "push_pull",
    "push_pull_async",
    "rank",
    "run",
    "shutdown",
    "size",
    "submission_batch",
    "synchronize",
]


def __getattr__(name: str) -> Any:
    # The API module imports numpy and the C++ core lazily, so that the scheduler and
    # launcher (which need neither) start fast and work without a built extension.
    if name in _API:
        from fastps.worker import api

        return getattr(api, name)
    if name == "run":  # fastps.run(fn, np=...): Horovod's horovod.run
        from fastps.launch.run_function import run

        return run
    if name in _COMPRESSION:
        from fastps.worker import compression

        return getattr(compression, name)
    raise AttributeError(f"module 'fastps' has no attribute {name!r}")
