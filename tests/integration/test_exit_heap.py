"""A worker's exit-time heap freeze (core/worker/exit_heap.py): registered once, only when
FASTPS_GC_FREEZE allows it, and it runs at the interpreter's exit after the handlers that
were registered later."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import atexit, gc
    from fastps.worker import exit_heap
    atexit.register(lambda: print("before:", gc.get_freeze_count() > 0, flush=True))
    exit_heap.freeze_heap_at_exit()
    exit_heap.freeze_heap_at_exit()  # a second init registers nothing more
    print("registered:", exit_heap._registered, flush=True)
    atexit.register(lambda: print("later:", gc.get_freeze_count() > 0, flush=True))
    """
)


@pytest.mark.parametrize("setting", [None, "0"])
def test_frozen_at_exit_unless_turned_off(setting: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "FASTPS_GC_FREEZE"}
    if setting is not None:
        env["FASTPS_GC_FREEZE"] = setting
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    on = setting is None
    # Handlers run last-registered first: the later one sees no freeze yet, the earlier one
    # sees the freeze exactly when it is on.
    assert out.stdout.splitlines() == [
        f"registered: {on}",
        "later: False",
        f"before: {on}",
    ], out.stdout
