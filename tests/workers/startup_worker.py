"""Worker program for the start-up tests: init, one checked push_pull, exit (after
holding on for argv[1] seconds, if given; argv[2]: seconds to wait before init).

Prints "INIT-SECONDS <s>" once fastps.init() returned and "SUM-OK" once the sum was right;
on a fastps error prints "ERROR-SEEN <seconds since start> <message>" and exits 17.
"""

from __future__ import annotations

import sys
import time

import fastps
import numpy as np


def main() -> None:
    if len(sys.argv) > 2:
        time.sleep(float(sys.argv[2]))
    t0 = time.monotonic()
    try:
        fastps.init()
        print(f"INIT-SECONDS {time.monotonic() - t0:.2f}", flush=True)
        x = np.full(100_000, fastps.rank() + 1, np.float32)
        out = fastps.push_pull(x, name="startup", average=False)
        n = fastps.size()
        want = n * (n + 1) / 2
        if not np.all(out == want):
            print(f"WRONG-SUM got {out[:4]} want {want}", flush=True)
            sys.exit(3)
        print("SUM-OK", flush=True)
        if len(sys.argv) > 1:
            time.sleep(float(sys.argv[1]))
        fastps.shutdown()
    except fastps.FastPSError as exc:
        print(f"ERROR-SEEN {time.monotonic() - t0:.2f} {type(exc).__name__}: {exc}", flush=True)
        sys.exit(17)


if __name__ == "__main__":
    main()
