"""Keeping Python's full garbage collections short during training.

Every gradient push_pull in flight holds a handful of small tracked objects (handle, result
closure, core handle) from its start in the gradient hook until the step that waits for it:
a ResNet-50 step keeps ~3,000 alive at once (benchmarks/bench_optimizer_overhead.py). They
are freed by reference counting — no cycles — but while alive they trip generation-0
collections, survive them, and are promoted towards generation 2. Every so often that
triggers a *full* collection, which walks every tracked object of the process: the model,
torch's own module-level objects, the optimizer state, hundreds of thousands in all
(measured: 180-560 ms pauses on the emulated rack, on every worker).

After the first optimizer step the long-lived part of the heap exists (model, optimizer
state, the framework). One collection followed by :func:`gc.freeze` moves it to the
permanent generation, which collections never walk, so later full collections only walk
what was created since: the pause drops to milliseconds. Done once per process;
``FASTPS_GC_FREEZE=0`` turns it off. Objects created before the freeze that become garbage
later are kept (a one-time snapshot; in training those are the model and the framework).
"""

from __future__ import annotations

import gc

from fastps.config import gc_freeze

__all__ = ["ENV", "freeze_once"]

ENV = "FASTPS_GC_FREEZE"  # read by fastps.config.gc_freeze

_done = False


def _enabled() -> bool:
    return gc_freeze()


def freeze_once() -> bool:
    """Collects and freezes the heap the first time it is called (True then)."""
    global _done
    if _done:
        return False
    _done = True
    if not _enabled():
        return False
    gc.collect()
    gc.freeze()
    return True
