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
per-host Mbit/s series; :func:`sampling` runs the sampler around a benchmark's run.

``--show FILE`` prints a file as a table, one row per bin and one egress/ingress column per
host, in percent of the link rate, from the first sample in which any link carried more
than 5% of it (``--from``/``--to`` seconds after that; FILE may be gzipped)::

    python -m benchmarks.rack.linkstat --show w.csv --rate 1000 --bin-ms 10 --from 8 --to 9

``--show FILE --ends`` lists where each iteration's pushes end instead (:func:`push_ends`):
how long before the last worker each one stopped sending, and the servers' answer tail.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import gzip
import math
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

Series = Dict[str, List[Tuple[float, float, float]]]


def _parse_dev(text: str) -> Dict[str, Tuple[int, int]]:
    """{device: (rx_bytes, tx_bytes)} from the text of /proc/net/dev."""
    out: Dict[str, Tuple[int, int]] = {}
    for line in text.splitlines()[2:]:
        name, _, rest = line.partition(":")
        fields = rest.split()
        out[name.strip()] = (int(fields[0]), int(fields[8]))
    return out


def read_counters() -> Dict[str, Tuple[int, int]]:
    """{device: (rx_bytes, tx_bytes)} of this network namespace."""
    with open("/proc/net/dev") as f:
        return _parse_dev(f.read())


def namespace_counters(ns: str) -> Dict[str, Tuple[int, int]]:
    """read_counters of another network namespace (``ip netns exec NS``; root)."""
    res = subprocess.run(
        ["ip", "netns", "exec", ns, "cat", "/proc/net/dev"],
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    )
    return _parse_dev(res.stdout)


def egress_bytes(
    before: Dict[str, Tuple[int, int]], after: Dict[str, Tuple[int, int]], hosts: List[str]
) -> int:
    """Bytes the named hosts sent between two namespace_counters of their switch (the
    switch side's rx is the host's egress): each byte on the wire counted once."""
    return sum(after[h][0] - before[h][0] for h in hosts if h in before and h in after)


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
    opener = gzip.open if path.suffix == ".gz" else open  # samples kept in docs are gzipped
    with opener(path, "rt") as f:
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
            # each sample covers (prev, t]: count the intervals inside [t0, t1]
            if prev is not None and prev >= t0 - 1e-9 and t <= t1 + 1e-9:
                dt = t - prev
                eg += e * dt
                ing += i * dt
            prev = t
        span = (t1 - t0) * rate_mbit
        out[host] = (eg / span if span else 0.0, ing / span if span else 0.0)
    return out


def origin(series: Series, rate_mbit: float) -> Optional[float]:
    """The first sample in which any host's link carried over 5% of the rate either way:
    time 0 of :func:`table` and :func:`push_ends`. None: the links never did."""
    busy = [t for pts in series.values() for t, e, i in pts if max(e, i) > 0.05 * rate_mbit]
    return min(busy) if busy else None


def _binned(
    series: Series, t0: float, bin_s: float, hosts: List[str]
) -> Dict[str, Dict[int, Tuple[float, float]]]:
    """{host: {bin: (egress, ingress) Mbit/s averaged over the bin}}, bin 0 starting at t0.
    A sample at t covers (t - interval, t], so it counts for the bin t falls in."""
    out: Dict[str, Dict[int, Tuple[float, float]]] = {}
    for h in hosts:
        acc: Dict[int, List[Tuple[float, float]]] = {}
        for t, e, i in series[h]:
            # rounded: a sample on a bin's edge must not fall into the bin before
            acc.setdefault(math.floor((t - t0) / bin_s + 1e-6), []).append((e, i))
        out[h] = {
            b: (sum(v[0] for v in vs) / len(vs), sum(v[1] for v in vs) / len(vs))
            for b, vs in acc.items()
        }
    return out


def table(
    series: Series,
    rate_mbit: float,
    bin_s: float,
    start_s: float = 0.0,
    end_s: Optional[float] = None,
) -> List[str]:
    """Rows of ``t  egress/ingress ...`` per host (percent of rate_mbit, averaged per bin),
    t from :func:`origin`; empty when no link was ever busy."""
    t0 = origin(series, rate_mbit)
    if t0 is None:
        return []
    hosts = sorted(series)
    bins = _binned(series, t0, bin_s, hosts)
    last = max((b for d in bins.values() for b in d), default=-1)
    rows = ["     t " + " ".join(f"{h:>9s}" for h in hosts) + "   (egress/ingress, % of link)"]
    for b in range(0, last + 1):
        t = b * bin_s
        if t < start_s - 1e-9 or (end_s is not None and t > end_s + 1e-9):
            continue
        cells = []
        for h in hosts:
            v = bins[h].get(b)
            pct = (100.0 * v[0] / rate_mbit, 100.0 * v[1] / rate_mbit) if v else None
            cells.append(f"{pct[0]:4.0f}/{pct[1]:<4.0f}" if pct else f"{'-':>9s}")
        rows.append(f"{t:6.2f} " + " ".join(cells))
    return rows


def push_ends(
    series: Series, rate_mbit: float, bin_s: float = 0.005, prefix: str = "w"
) -> List[Tuple[float, Dict[str, float], float]]:
    """Where the workers' pushes of an iteration end: every bin in which all hosts named
    ``prefix``... send under 10% of the link after one of them sent more. For each such end
    (t from :func:`origin`, as in :func:`table`), how long before the last worker each
    worker stopped sending over 30% of the link, in seconds, and how long the workers kept
    receiving over 10% afterwards (the servers' answer tail). Ends closer than 50 ms to the
    previous one are the same end."""
    hosts = sorted(h for h in series if h.startswith(prefix))
    t0 = origin(series, rate_mbit)
    if not hosts or t0 is None:
        return []
    bins = _binned(series, t0, bin_s, hosts)
    last_bin = max((b for d in bins.values() for b in d), default=0)
    # a bin the sampler skipped (it overslept) repeats the bin before it
    for d in bins.values():
        for k in range(1, last_bin + 1):
            if k not in d and k - 1 in d:
                d[k] = d[k - 1]

    def eg(h: str, b: int) -> float:
        return bins[h].get(b, (0.0, 0.0))[0] / rate_mbit

    def ing(h: str, b: int) -> float:
        return bins[h].get(b, (0.0, 0.0))[1] / rate_mbit

    def idle(b: int) -> bool:
        return all(eg(h, b) < 0.1 for h in hosts)

    out: List[Tuple[float, Dict[str, float], float]] = []
    prev_end = -(10**9)
    lookback = int(2.0 / bin_s)
    for b in range(1, last_bin + 1):
        if not idle(b) or idle(b - 1) or (b - prev_end) * bin_s < 0.05:
            continue
        prev_end = b
        stops = {}
        for h in hosts:
            k = b - 1
            while k > b - lookback and eg(h, k) < 0.3:
                k -= 1
            stops[h] = k
        latest = max(stops.values())
        k = b
        while k <= last_bin and any(ing(h, k) > 0.1 for h in hosts):
            k += 1
        out.append((b * bin_s, {h: (latest - stops[h]) * bin_s for h in hosts}, (k - b) * bin_s))
    return out


@contextlib.contextmanager
def sampling(switch_ns: str, out: Path, seconds: float, interval_ms: float = 5.0) -> Iterator[Path]:
    """Samples every link of a rack (its switch namespace) into ``out`` while the block runs;
    stops the sampler at the end, at the latest after ``seconds``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        ["ip", "netns", "exec", switch_ns, sys.executable, "-m", "benchmarks.rack.linkstat"]
        + ["--out", str(out), "--interval-ms", str(interval_ms), "--seconds", str(seconds)],
        cwd=str(root),
    )
    try:
        yield out
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        # it ends by our SIGTERM, or by itself after `seconds`; anything else lost the samples
        if proc.returncode not in (0, -signal.SIGTERM):
            print(
                f"linkstat: the sampler in namespace {switch_ns!r} exited with code "
                f"{proc.returncode}: {out} is missing or incomplete",
                file=sys.stderr,
                flush=True,
            )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="sample into this CSV")
    p.add_argument("--interval-ms", type=float, default=5.0)
    p.add_argument("--seconds", type=float, default=60.0, help="stop after this long at most")
    p.add_argument("--show", type=Path, metavar="FILE", help="print a sampled file as a table")
    p.add_argument("--rate", type=float, default=1000.0, help="--show: link Mbit/s (100%%)")
    p.add_argument("--bin-ms", type=float, default=20.0, help="--show: row width")
    p.add_argument("--from", dest="start", type=float, default=0.0, help="--show: seconds")
    p.add_argument("--to", dest="end", type=float, default=None, help="--show: seconds")
    p.add_argument(
        "--ends",
        action="store_true",
        help="--show: where each iteration's pushes end instead (push_ends, 5 ms bins)",
    )
    a = p.parse_args()
    if a.show:
        if not a.rate > 0 or not a.bin_ms > 0:
            p.error(f"--rate and --bin-ms must be > 0, got {a.rate} and {a.bin_ms}")
        try:
            series = utilisation(a.show)
        except (OSError, KeyError, ValueError, IndexError) as e:
            p.error(f"cannot read link samples from {a.show}: {type(e).__name__}: {e}")
        if a.ends:
            found = push_ends(series, a.rate)
            if not found:
                print("no push ends: the workers' uplinks never fell idle together")
            for t, before, tail in found:
                late = " ".join(f"{h} {1000 * v:3.0f}" for h, v in before.items())
                spread = 1000 * max(before.values())
                print(
                    f"{t:7.2f} s  stopped before the last (ms): {late}  "
                    f"spread {spread:3.0f} ms, answers after {1000 * tail:3.0f} ms"
                )
            return 0
        print("\n".join(table(series, a.rate, a.bin_ms / 1000.0, a.start, a.end)))
        return 0
    if a.out is None:
        p.error("give --out FILE to sample, or --show FILE to print one")
    sample(a.out, a.interval_ms / 1000.0, a.seconds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
