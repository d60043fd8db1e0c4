"""``fastpsrun --progress``: one status line under the processes' output (rich).

Workers put their counters in the heartbeats they send every second anyway
(``ControlClient.set_heartbeat_stats``): iterations (the most push_pulls of any one
tensor name: one per step for a gradient), bytes submitted, host and link rate. The
scheduler keeps the latest per worker (``Scheduler.worker_stats``); this thread turns them
into rates once a second: iterations/s of the slowest worker, the job's gradient GB/s, per
host GB/s and share of its link, and the slowest rank. The line is drawn by rich's
``Live``; while it is up every line the launcher forwards is printed through the same
console, above the line, so prefixed output is never cut by it.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable, Dict, Optional, Tuple

from fastps.errors import FastPSError

REFRESH_S = 1.0


def load_rich() -> Any:
    try:
        import rich.console
        import rich.live
        import rich.text
    except ImportError:
        raise FastPSError("--progress needs the rich package (pip install rich)") from None
    return rich


class Rates:
    """Rates from successive samples of each worker's counters."""

    def __init__(self) -> None:
        self._last: Dict[int, Tuple[float, Dict[str, Any]]] = {}

    def update(self, samples: Dict[int, Tuple[float, Dict[str, Any]]]) -> Optional[str]:
        per_rank: Dict[int, Tuple[float, float]] = {}  # rank -> (it/s, bytes/s)
        hosts: Dict[str, Tuple[float, float]] = {}  # host -> (bytes/s, link Mbit/s)
        for rank, (t, s) in samples.items():
            prev = self._last.get(rank)
            self._last[rank] = (t, s)
            if prev is None or t <= prev[0]:
                continue
            dt = t - prev[0]
            its = (s.get("steps", 0) - prev[1].get("steps", 0)) / dt
            bps = (s.get("bytes", 0) - prev[1].get("bytes", 0)) / dt
            per_rank[rank] = (its, bps)
            host = str(s.get("host", "?"))
            b, link = hosts.get(host, (0.0, 0.0))
            hosts[host] = (b + bps, float(s.get("link_mbit") or 0.0) or link)
        if not per_rank:
            return None
        slowest = min(per_rank, key=lambda r: (samples[r][1].get("steps", 0), per_rank[r][0]))
        its = min(v[0] for v in per_rank.values())
        gbps = sum(v[1] for v in per_rank.values()) / 1e9
        parts = [f"{its:.2f} it/s", f"gradients {gbps:.2f} GB/s"]
        for host, (b, link) in sorted(hosts.items()):
            share = f" ({b * 8 / (link * 1e6) * 100:.0f}% of link)" if link > 0 else ""
            parts.append(f"{host} {b / 1e9:.2f} GB/s{share}")
        parts.append(f"slowest rank {slowest} (step {samples[slowest][1].get('steps', 0)})")
        return " | ".join(parts)


class ProgressLine:
    """The status line of a running job; ``write`` prints forwarded output above it."""

    def __init__(self, stats: Callable[[], Dict[int, Tuple[float, Dict[str, Any]]]]) -> None:
        rich = load_rich()
        self._text = rich.text.Text
        self._console = rich.console.Console(file=sys.stderr)
        self._live = rich.live.Live(
            self._text("fastpsrun: waiting for the workers' first heartbeats"),
            console=self._console,
            refresh_per_second=4,
            transient=False,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self._stats = stats
        self._rates = Rates()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fastps-progress", daemon=True)
        # Forwarded output that would share the terminal with the line goes through its
        # console; output redirected elsewhere is written as it is.
        self.routes_stdout = sys.stdout.isatty() and self._console.is_terminal

    def start(self) -> None:
        self._live.start()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * REFRESH_S)
        self._live.stop()

    def write(self, data: bytes) -> None:
        text = data.decode("utf-8", "replace")
        if text.endswith("\n"):
            text = text[:-1]
        self._console.print(self._text(text), soft_wrap=True, highlight=False, markup=False)

    def _status(self, line: str) -> Any:
        # One row, cut at the terminal's width: a wrapped status line would push output up.
        return self._text(f"fastpsrun: {line}", style="bold", no_wrap=True, overflow="ellipsis")

    def _loop(self) -> None:
        while not self._stop.wait(REFRESH_S):
            line = self._rates.update(self._stats())
            if line is not None:
                self._live.update(self._status(line))
        line = self._rates.update(self._stats())
        if line is not None:
            self._live.update(self._status(line))
