"""Worker program for the chaos test: push_pulls checked sums until fastps raises.

Prints "READY" after init, "WRONG-SUM ..." (exit 3) on a wrong result, and
"ERROR-SEEN <message>" (exit 17) when fastps reports a failure; exits 0 after 60 s without one.
"""

from __future__ import annotations

import sys
import time

import fastps
import numpy as np


def main() -> None:
    fastps.init()
    print("READY", flush=True)
    n = fastps.size()
    want = n * (n + 1) / 2
    t0 = time.monotonic()
    step = 0
    while time.monotonic() - t0 < 60:
        try:
            for i, elems in enumerate((10, 70_000, 700_000)):
                x = np.full(elems, fastps.rank() + 1, np.float32)
                out = fastps.push_pull(x, name=f"chaos{i}", average=False)
                if not np.all(out == want):
                    print(f"WRONG-SUM step {step} tensor {i}: {out[:4]}", flush=True)
                    sys.exit(3)
        except fastps.FastPSError as exc:
            print(f"ERROR-SEEN {type(exc).__name__}: {exc}", flush=True)
            sys.exit(17)
        step += 1
    print("NO-ERROR", flush=True)


if __name__ == "__main__":
    main()
