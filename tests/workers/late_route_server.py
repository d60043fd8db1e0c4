"""Server program for the rack-hierarchy tests: a fastps server whose rack route comes late,
so a test can order the race between a rack's first sums and the server's route (the
membership reaches workers and servers at once) instead of waiting for a loaded machine to
lose it.

Modes:

- ``after-sum``: sets the route only once a rack sum of this server waits for it, then
  prints ROUTE-LATE (the sum was ready before the route, every time);
- ``never``: drops the route and prints ROUTE-DROPPED, so the rack's sums wait for it until
  the timeout.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from fastps import _core
from fastps.config import Config
from fastps.control.server import run_server, server_options
from fastps.errors import FastPSError


class LateRoute:
    """The C++ server with set_rack_route held back; everything else passes through."""

    def __init__(self, srv: Any, mode: str, limit_s: float) -> None:
        self._srv = srv
        self._mode = mode
        self._limit_s = limit_s

    def __getattr__(self, name: str) -> Any:
        return getattr(self._srv, name)

    def set_rack_route(self, *args: Any) -> None:
        if self._mode == "never":
            print("ROUTE-DROPPED", flush=True)
            return
        deadline = time.monotonic() + self._limit_s
        while self._srv.rack_sums_awaiting_route() == 0:
            if time.monotonic() > deadline:
                raise FastPSError(
                    f"late-route server: no rack sum waited for the route within {self._limit_s} s"
                )
            time.sleep(0.005)
        self._srv.set_rack_route(*args)
        print("ROUTE-LATE", flush=True)


def main() -> None:
    mode = sys.argv[1]
    if mode not in ("after-sum", "never"):
        raise SystemExit(f"late_route_server.py: unknown mode {mode!r} (after-sum, never)")
    cfg = Config.from_env({**os.environ, "FASTPS_ROLE": "server"})
    cfg.setup_logging(f"fastps-server-{cfg.server_id}")
    # How long the workers may take to start and push (a loaded machine is slow); once a
    # sum waits, the route follows at once.
    limit = 60.0

    def factory(c: Config) -> LateRoute:
        return LateRoute(_core.Server(server_options(c)), mode, limit)

    sys.exit(run_server(cfg, server_factory=factory, install_signals=True))


if __name__ == "__main__":
    main()
