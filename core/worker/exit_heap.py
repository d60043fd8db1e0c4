"""A quick interpreter exit for worker processes.

When Python exits it runs full garbage collections while it tears its modules down; each
walks every tracked object of the process. After ``import torch`` (or TensorFlow) that is
hundreds of thousands of objects: a 2-worker torch job ended 0.79 s after its workers' last
line, 0.29 s with the heap frozen first (at rest; 1.3-1.6 s against 0.4 s on loaded cores;
``python -m benchmarks.bench_job_exit``). So a worker freezes its heap
(:func:`gc.freeze`) in an ``atexit`` handler: the exit-time collections then walk only what
was created after it.

What this gives up: cyclic garbage that exists at exit is not collected, so the ``__del__``
of an object in a reference cycle may not run at exit, which Python never promised for
objects alive at exit anyway. Objects freed by reference counting (files, most objects) are
finalized as before, and the ``atexit`` handlers registered before this one still run.
``FASTPS_GC_FREEZE=0`` turns this off along with the training-time freeze.
"""

from __future__ import annotations

import atexit
import gc

from fastps.config import gc_freeze

__all__ = ["freeze_heap_at_exit"]

_registered = False


def _freeze() -> None:
    gc.freeze()


def freeze_heap_at_exit() -> None:
    """Registers the exit-time freeze once per process, unless ``FASTPS_GC_FREEZE=0``."""
    global _registered
    if _registered or not gc_freeze():
        return
    _registered = True
    atexit.register(_freeze)
