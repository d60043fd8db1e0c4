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
state, the framework). :func:`gc.freeze` then moves it to the permanent generation, which
collections never walk, so later full collections only walk what was created since: the
pause drops to milliseconds. Done once per process; ``FASTPS_GC_FREEZE=0`` turns it off.
Objects created before the freeze that become garbage later are kept (a one-time snapshot;
in training those are the model and the framework).

The full collection that clears garbage out of the way before the freeze walks the whole
heap (0.2 CPU-s for the digits example, 387k objects): it runs when the
``DistributedOptimizer`` is built (:func:`collect_early`), where setup already takes
seconds, not inside the first step, where every worker paid it at once in the timed
training (issue 42's time-to-accuracy runs: a first step of 1.1 s instead of a few ms).
Garbage made between the two (reference cycles only: the rest is freed at once) is frozen.
"""

from __future__ import annotations

import gc

from fastps.config import gc_freeze

__all__ = ["ENV", "collect_early", "freeze_once"]

ENV = "FASTPS_GC_FREEZE"  # read by fastps.config.gc_freeze

_done = False
_collected = False


def _enabled() -> bool:
    return gc_freeze()


def collect_early() -> None:
    """The full collection before the freeze, done now (when the optimizer is built)."""
    global _collected
    if _done or _collected or not _enabled():
        return
    gc.collect()
    _collected = True


def freeze_once() -> bool:
    """Freezes the heap the first time it is called (True then), collecting first unless
    :func:`collect_early` did."""
    global _done
    if _done:
        return False
    _done = True
    if not _enabled():
        return False
    if not _collected:
        gc.collect()
    gc.freeze()
    return True
