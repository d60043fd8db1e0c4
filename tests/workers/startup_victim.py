"""A worker or server that SIGKILLs itself at a chosen stage of start-up.

Usage: startup_victim.py worker|server STAGE
  registered   right after its register message went out (membership not complete yet)
  membership   right after the membership arrived (workers: before connecting anywhere)
  started      workers only: right after fastps.init() returned
The other processes of the job run tests/workers/startup_worker.py.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from fastps.control import protocol as control


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    role, stage = sys.argv[1], sys.argv[2]
    if stage == "registered":
        send = control.ControlClient._send

        def send_then_die(self, msg):  # type: ignore[no-untyped-def]
            send(self, msg)
            if msg.get("type") == "register":
                time.sleep(0.1)  # let it reach the scheduler
                die()

        control.ControlClient._send = send_then_die  # type: ignore[method-assign]
    elif stage == "membership":
        register = control.ControlClient.register

        def register_then_die(self, *args, **kw):  # type: ignore[no-untyped-def]
            register(self, *args, **kw)
            if role == "worker":
                time.sleep(0.2)  # the others are connecting to us by now
            die()  # a server dies while the workers are connecting to it

        control.ControlClient.register = register_then_die  # type: ignore[method-assign]
    if role == "server":
        from fastps.control import server

        server.main()
        return
    import fastps

    fastps.init()
    if stage == "started":
        die()
    time.sleep(60)  # never reached for the other stages


if __name__ == "__main__":
    main()
