"""Per-host link counters of an emulated rack, sampled over time.

Each host's link ends in the switch namespace as a veth named after the host (``w0``,
``c1``...): bytes the switch side transmits are the host's ingress, bytes it receives are
the host's egress. Sampling /proc/net/dev there every few milliseconds shows when each
link was busy, which is how a benchmark finds out what limits it (idle egress while
pushes wait, a reply tail, one slow host).

Run inside the switch namespace (``ip netns exec PREFIX-sw``)::

    python -m benchmarks.rack.linkstat --out FILE --interval-ms 5 --seconds 20

The output is CSV: ``t,host,rx_bytes,tx_bytes`` (t in seconds since the Unix epoch;
counters cumulative, as the switch side sees them). :func:`utilisation` turns a file into
per-host Mbit/s series.
"""

from __future__ import annotations

import argparse
import csv
import signal
import time
from pathlib import Path
from typing import Dict, List, Tuple

Series = Dict[str, List[Tuple[float, float, float]]]


def read_counters() -> Dict[str, Tuple[int, int]]:
    """{device: (rx_bytes, tx_bytes)} of this network namespace."""
    out: Dict[str, Tuple[int, int]] = {}
    with open("/proc/net/dev") as f:
        for line in f.readlines()[2:]:
            name, _, rest = line.partition(":")
            fields = rest.split()
            out[name.strip()] = (int(fields[0]), int(fields[8]))
    return out


def sample(out: Path, interval_s: float, seconds: float) -> int:
    """Samples until `seconds` pass or SIGTERM; returns the number of samples."""
    stop = False

    def _stop(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    deadline = time.monotonic() + seconds
    rows = 0
    with out.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t", "host", "rx_bytes", "tx_bytes"])
        nxt = time.monotonic()
        while not stop and time.monotonic() < deadline:
            t = time.time()
            for dev, (rx, tx) in read_counters().items():
                if dev in ("lo",) or dev.startswith("br"):
                    continue
                w.writerow([f"{t:.6f}", dev, rx, tx])
            rows += 1
            nxt += interval_s
            time.sleep(max(0.0, nxt - time.monotonic()))
    return rows


def utilisation(path: Path) -> Series:
    """{host: [(t, egress Mbit/s, ingress Mbit/s)]} between consecutive samples."""
    raw: Dict[str, List[Tuple[float, int, int]]] = {}
    with path.open() as f:
        for row in csv.DictReader(f):
            raw.setdefault(row["host"], []).append(
                (float(row["t"]), int(row["rx_bytes"]), int(row["tx_bytes"]))
            )
    out: Series = {}
    for host, pts in raw.items():
        series = []
        for (t0, rx0, tx0), (t1, rx1, tx1) in zip(pts, pts[1:]):
            dt = t1 - t0
            if dt <= 0:
                continue
            # Switch rx = host egress, switch tx = host ingress.
            series.append((t1, (rx1 - rx0) * 8 / dt / 1e6, (tx1 - tx0) * 8 / dt / 1e6))
        out[host] = series
    return out


def busy_fraction(
    series: Series, t0: float, t1: float, rate_mbit: float
) -> Dict[str, Tuple[float, float]]:
    """{host: (egress, ingress)} bytes moved in [t0, t1] as a fraction of rate x (t1 - t0)."""
    out = {}
    for host, pts in series.items():
        eg = ing = 0.0
        prev = None
        for t, e, i in pts:
            if prev is not None and t0 <= t <= t1:
                dt = t - prev
                eg += e * dt
                ing += i * dt
            prev = t
        span = (t1 - t0) * rate_mbit
        out[host] = (eg / span if span else 0.0, ing / span if span else 0.0)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--interval-ms", type=float, default=5.0)
    p.add_argument("--seconds", type=float, default=60.0, help="stop after this long at most")
    a = p.parse_args()
    sample(a.out, a.interval_ms / 1000.0, a.seconds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
