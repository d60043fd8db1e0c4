"""Worker program for the fault tests: mismatched tensors, killed peers, hostile connections.

Prints "ERROR-SEEN <seconds> <message>" when fastps raises, so the test can check how fast
and how clearly each worker learned of the failure.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time

import fastps
import numpy as np
from fastps.worker import api


def report(t0: float, exc: BaseException) -> None:
    print(f"ERROR-SEEN {time.monotonic() - t0:.2f} {type(exc).__name__}: {exc}", flush=True)
    sys.exit(17)


def loop_until_error(t0: float, seconds: float = 60) -> None:
    x = np.ones(1000, np.float32)
    while time.monotonic() - t0 < seconds:
        try:
            fastps.push_pull(x, name="steady")
        except fastps.FastPSError as exc:
            report(t0, exc)
        time.sleep(0.01)
    print("NO-ERROR", flush=True)
    sys.exit(0)


def main() -> None:
    mode = sys.argv[1]
    fastps.init()
    rank = fastps.rank()
    x = np.ones(1000, np.float32)
    for _ in range(3):
        fastps.push_pull(x, name="warm")
    fastps.barrier()
    t0 = time.monotonic()
    if mode == "shape":
        shape = (10, 3) if rank == 0 else (10, 4)
        try:
            fastps.push_pull(np.ones(shape, np.float32), name="fc.weight")
        except fastps.FastPSError as exc:
            report(t0, exc)
    elif mode == "dtype":
        dt = np.float32 if rank == 0 else np.float64
        try:
            fastps.push_pull(np.ones((4, 4), dt), name="bias")
        except fastps.FastPSError as exc:
            report(t0, exc)
    elif mode == "op-timeout":
        # Rank 1 never submits "lonely": rank 0's bounded wait must end in a timeout.
        if rank == 0:
            try:
                fastps.push_pull_async(x, name="lonely").synchronize(timeout=1.5)
            except fastps.FastPSError as exc:
                report(t0, exc)
            print("NO-ERROR", flush=True)
        else:
            time.sleep(4)
    elif mode == "kill-worker":
        if rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        loop_until_error(t0)
    elif mode == "kill-server":
        if rank == 0:
            os.kill(api._st().membership.servers[0].pid, signal.SIGKILL)
        loop_until_error(t0)
    elif mode == "hostile":
        if rank == 0:
            addr = api._st().membership.servers[0].addr
            host, port = addr.rsplit(":", 1)
            with socket.create_connection((host, int(port))) as s:  # garbage
                s.recv(36)
                s.sendall(b"\x00garbage" * 20)
            with socket.create_connection((host, int(port))) as s:  # wrong token
                s.recv(36)
                s.sendall(b"FPSH"[::-1] + (0).to_bytes(4, "little") * 2 + bytes(32))
                s.settimeout(5)
                try:
                    print(f"refused-reply {s.recv(1)!r}", flush=True)
                except OSError as exc:
                    print(f"refused-reply {exc}", flush=True)
            sh, sp = os.environ["FASTPS_SCHEDULER_ADDR"].rsplit(":", 1)
            with socket.create_connection((sh, int(sp))) as s:  # garbage to the scheduler
                s.sendall(b"\xff" * 64)
        for i in range(20):
            got = fastps.push_pull(np.full(5000, rank + i, np.float32), average=False, name="after")
            want = sum(r + i for r in range(fastps.size()))
            assert np.all(got == want), (got[:4], want)
        print("HOSTILE-OK", flush=True)
    fastps.shutdown()


if __name__ == "__main__":
    main()
