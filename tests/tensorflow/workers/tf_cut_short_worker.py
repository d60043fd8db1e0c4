"""Worker: an anonymous op that one rank runs alone and whose wait is cut short (as a test
timeout or Ctrl-C cuts it) must not shift that rank's numbering of later anonymous ops.

Rank 0 alone starts an anonymous allreduce, grouped allreduce, allgather and barrier in
turn; a SIGALRM handler (what pytest-timeout uses) interrupts each wait after 1.5 s. After
each, every rank meets at a named op and then runs anonymous ops together, which must
match and give the right values at once (the op timeout is long, so a rank whose names
moved on would wait far longer than the job's own limit). Prints "<rank> cut short OK".
"""

from __future__ import annotations

import signal
import sys
import time
from typing import Any, Callable

import fastps.tensorflow as hvd
import numpy as np
import tensorflow as tf


class Interrupted(Exception):
    pass


def cut_short(seconds: float, fn: Callable[[], Any]) -> None:
    """Runs ``fn`` and interrupts it after ``seconds``; it must not finish by itself."""

    def alarm(signum: int, frame: Any) -> None:
        raise Interrupted()

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        fn()
    except Interrupted:
        return
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    raise AssertionError("an op that only rank 0 ran completed")


def main() -> None:
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    x = tf.constant([float(rank + 1)] * 4)
    total = size * (size + 1) / 2
    hvd.allreduce(x, op=hvd.Sum, name="warm-up")

    lone: Any = {
        "allreduce": lambda: hvd.allreduce(x, op=hvd.Sum),
        "grouped_allreduce": lambda: hvd.grouped_allreduce([x, x * 2], op=hvd.Sum),
        "allgather": lambda: hvd.allgather(x),
        "barrier": hvd.barrier,
    }
    for kind, fn in lone.items():
        if rank == 0:
            cut_short(1.5, fn)
        hvd.allreduce(x, op=hvd.Sum, name=f"after lone {kind}")
        t0 = time.monotonic()
        for i in range(1, 3):
            got = hvd.allreduce(x * i, op=hvd.Sum).numpy()
            np.testing.assert_allclose(got, [total * i] * 4, err_msg=kind)
        a, b = hvd.grouped_allreduce([x, x * 3], op=hvd.Sum)
        np.testing.assert_allclose(a.numpy(), [total] * 4, err_msg=kind)
        np.testing.assert_allclose(b.numpy(), [3 * total] * 4, err_msg=kind)
        gathered = hvd.allgather(tf.reshape(x, [1, 4])).numpy()
        np.testing.assert_allclose(gathered[:, 0], np.arange(1, size + 1), err_msg=kind)
        hvd.barrier()
        took = time.monotonic() - t0
        print(f"{rank} after lone {kind}: anonymous ops in step ({took:.2f} s)", flush=True)

    print(f"{rank} cut short OK", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
    sys.exit(0)
