"""A collective that fails while the core still works on its data parts returns at once:
the parts (whose ``__del__`` waits for the core, as ``fastps.api`` handles do) are kept
alive by one daemon thread instead of being waited for on the caller's thread, which in
a TensorFlow 1 graph is the thread that settles every pending op of the process."""

from __future__ import annotations

import gc
import threading
import time
import weakref

import pytest
from fastps import collectives as C
from fastps.errors import FastPSTimeoutError


class SlowPart:
    """Stands for a core handle the core finishes ``seconds`` from now."""

    def __init__(self, seconds: float) -> None:
        self.done_at = time.monotonic() + seconds
        self.synchronized_on: list = []

    def poll(self) -> bool:
        return time.monotonic() >= self.done_at

    def synchronize(self, timeout: float = 0.0) -> None:
        self.synchronized_on.append(threading.current_thread().name)
        time.sleep(max(0.0, self.done_at - time.monotonic()))

    def __del__(self) -> None:
        if not self.poll():
            self.synchronize()


def test_failed_op_leaves_its_parts_to_a_thread_of_their_own() -> None:
    op = C.Op("noname.0", C.global_process_set)
    op._coordinated.set()
    part = SlowPart(3.0)
    seen = part.synchronized_on
    ref = weakref.ref(part)
    op._parts.append(part)
    del part
    t0 = time.monotonic()
    with pytest.raises(FastPSTimeoutError) as failure:
        op.synchronize(timeout=0.2)
    del op, failure  # their tracebacks name the part too
    gc.collect()
    assert time.monotonic() - t0 < 2.0  # the caller did not wait for the core
    assert ref() is not None  # still alive: the core may write into it
    deadline = time.monotonic() + 10
    while ref() is not None and time.monotonic() < deadline:
        time.sleep(0.05)
        gc.collect()
    assert ref() is None  # dropped once done
    assert seen == ["fastps-left-parts"]
