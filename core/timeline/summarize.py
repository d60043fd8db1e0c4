"""Reads a merged timeline and says where an iteration's time went.

``python -m fastps.timeline summarize TRACE`` prints: per-stage and per-tensor times, the
critical path of one iteration, how far each worker's submissions and pushes trailed the
first worker's (naming a straggler), and link utilisation. ``--plot out.png`` draws one
iteration as a Gantt chart (matplotlib, the ``plot`` extra: ``pip install 'fastps[plot]'``).
An iteration is one round of every tensor: the k-th push_pull of each name.
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from .. import FastPSError
from .merge import SERVER_PID_BASE

# A straggler's submissions trail the first worker's by at least this much (median over
# the parts of the trace) and by twice as much as any other worker's.
STRAGGLER_MIN_MS = 1.0
STRAGGLER_RATIO = 2.0


@dataclass
class Span:
    proc: str
    name: str
    ts: float  # us
    dur: float
    tid: int
    args: Dict[str, Any]

    @property
    def end(self) -> float:
        return self.ts + self.dur

    @property
    def key(self) -> Tuple[str, int, int]:
        return (self.args.get("tensor", ""), self.args.get("part", -1), self.args.get("round", -1))


@dataclass
class Timeline:
    parts: List[Span] = field(default_factory=list)  # worker and server part spans
    stages: List[Span] = field(default_factory=list)
    framework: List[Span] = field(default_factory=list)
    info: Dict[str, Any] = field(default_factory=dict)
    processes: Dict[int, str] = field(default_factory=dict)

    def worker_parts(self) -> List[Span]:
        return [s for s in self.parts if s.proc.startswith("worker")]

    def server_parts(self) -> List[Span]:
        return [s for s in self.parts if s.proc.startswith("server")]


def _proc_label(pid: int) -> str:
    if pid >= SERVER_PID_BASE:
        return f"server {pid - SERVER_PID_BASE}"
    return f"worker {pid - 1}"


def load(path_or_trace: Any) -> Timeline:
    trace = path_or_trace
    if isinstance(path_or_trace, str):
        with open(path_or_trace) as f:
            trace = json.load(f)
    tl = Timeline(info=trace.get("otherData", {}).get("fastps", {}))
    for e in trace["traceEvents"]:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            tl.processes[e["pid"]] = e["args"]["name"]
        if e.get("ph") != "X":
            continue
        s = Span(_proc_label(e["pid"]), e["name"], e["ts"], e["dur"], e["tid"], e.get("args", {}))
        cat = e.get("cat")
        if cat == "part":
            tl.parts.append(s)
        elif cat in ("stage", "sum"):
            tl.stages.append(s)
        elif cat == "framework":
            tl.framework.append(s)
    return tl


def _ms(us: float) -> str:
    return f"{us / 1000.0:.2f} ms"


def iterations(tl: Timeline) -> Dict[int, Tuple[float, float]]:
    """Round k -> (first submission, last copy out) over every worker, in us."""
    out: Dict[int, Tuple[float, float]] = {}
    for s in tl.worker_parts():
        k = s.args["round"]
        a, b = out.get(k, (s.ts, s.end))
        out[k] = (min(a, s.ts), max(b, s.end))
    return out


def stage_table(tl: Timeline) -> List[Tuple[str, str, int, float, float]]:
    """(role, stage, count, total us, median us) per stage."""
    groups: Dict[Tuple[str, str], List[float]] = {}
    for s in tl.stages:
        groups.setdefault((s.proc.split()[0], s.name), []).append(s.dur)
    return [
        (role, name, len(d), sum(d), statistics.median(d))
        for (role, name), d in sorted(groups.items())
    ]


def tensor_table(tl: Timeline) -> List[Tuple[str, int, float, str]]:
    """(tensor, bytes, median us from submission to last part out, slowest stage) per tensor."""
    spans: Dict[Tuple[str, str, int], List[Span]] = {}
    sizes: Dict[str, Dict[int, int]] = {}
    for s in tl.worker_parts():
        t = s.args["tensor"]
        spans.setdefault((t, s.proc, s.args["round"]), []).append(s)
        sizes.setdefault(t, {})[s.args["part"]] = s.args.get("bytes", 0)
    per: Dict[str, List[float]] = {}
    for (t, _, _), lst in spans.items():
        per.setdefault(t, []).append(max(x.end for x in lst) - min(x.ts for x in lst))
    stage_time: Dict[str, Dict[str, float]] = {}
    for s in tl.stages:
        if s.proc.startswith("worker"):
            d = stage_time.setdefault(s.args.get("tensor", ""), {})
            d[s.name] = d.get(s.name, 0.0) + s.dur
    rows = []
    for t, durs in per.items():
        st = stage_time.get(t, {})
        worst = max(st, key=lambda k: st[k]) if st else "-"
        rows.append((t, sum(sizes[t].values()), statistics.median(durs), worst))
    rows.sort(key=lambda r: -r[2])
    return rows


def stragglers(tl: Timeline) -> Tuple[Dict[str, Dict[str, float]], Optional[str]]:
    """Per worker: median and max ms its submissions (and pushes) trailed the first worker's
    for the same part and round; and the straggler's name, if one stands out."""
    first: Dict[Tuple[str, int, int], Dict[str, float]] = {}
    for s in tl.worker_parts():
        first.setdefault(s.key, {})[s.proc] = s.ts
    pushes: Dict[Tuple[str, int, int], Dict[str, float]] = {}
    for s in tl.stages:
        if s.name == "push" and s.proc.startswith("worker"):
            pushes.setdefault(s.key, {})[s.proc] = s.ts
    trails: Dict[str, List[float]] = {}
    push_trails: Dict[str, List[float]] = {}
    for src, dst in ((first, trails), (pushes, push_trails)):
        for by_worker in src.values():
            if len(by_worker) < 2:
                continue
            lead = min(by_worker.values())
            for w, t in by_worker.items():
                dst.setdefault(w, []).append((t - lead) / 1000.0)
    table: Dict[str, Dict[str, float]] = {}
    for w in sorted(trails, key=lambda x: int(x.split()[1])):
        row = {"median_ms": statistics.median(trails[w]), "max_ms": max(trails[w])}
        if w in push_trails:
            row["push_median_ms"] = statistics.median(push_trails[w])
        table[w] = row
    name = None
    if len(table) >= 2:
        ranked = sorted(table.items(), key=lambda kv: -kv[1]["median_ms"])
        top, second = ranked[0][1]["median_ms"], ranked[1][1]["median_ms"]
        if top >= STRAGGLER_MIN_MS and top >= STRAGGLER_RATIO * second:
            name = ranked[0][0]
    return table, name


def server_waits(tl: Timeline) -> List[Tuple[str, int, float, float, float]]:
    """(server, parts, median, p90, max us) of each server's "wait for workers": from a part's
    first push to its last. A server answers a part only once every worker's push of it is
    in, so long waits are workers pushing the same part far apart in time (the server's
    answers wait for the slowest); at a colocated server the host's own worker's push, which
    crosses no link, comes first, so its waits include the network's queue too."""
    groups: Dict[str, List[float]] = {}
    for s in tl.stages:
        if s.name == "wait for workers" and s.proc.startswith("server"):
            groups.setdefault(s.proc, []).append(s.dur)
    out = []
    for proc in sorted(groups, key=lambda x: int(x.split()[1])):
        d = sorted(groups[proc])
        p90 = d[min(len(d) - 1, int(0.9 * len(d)))]
        out.append((proc, len(d), statistics.median(d), p90, d[-1]))
    return out


def critical_path(tl: Timeline, k: int) -> List[str]:
    """The chain of stages that ended iteration k, newest last, as lines of text."""
    parts = [s for s in tl.worker_parts() if s.args["round"] == k]
    if not parts:
        return [f"iteration {k}: no parts"]
    last = max(parts, key=lambda s: s.end)
    start = min(s.ts for s in parts)
    lines = [
        f"iteration {k}: {_ms(last.end - start)} from the first submission to the last copy out;"
        f" it ends with {last.name} on {last.proc}"
    ]

    def chain(proc: str, key: Tuple[str, int, int]) -> str:
        st = sorted(
            (s for s in tl.stages if s.proc == proc and s.key == key and s.name != "sum"),
            key=lambda s: s.ts,
        )
        return " -> ".join(f"{s.name} {_ms(s.dur)}" for s in st)

    lines.append(f"  {last.proc}: {chain(last.proc, last.key)}")
    srv = [s for s in tl.server_parts() if s.key == last.key]
    if srv:
        s = srv[0]
        waiter = next(
            (
                x
                for x in tl.stages
                if x.proc == s.proc and x.key == s.key and x.name == "wait for workers"
            ),
            None,
        )
        slow = f"worker {s.args.get('last_worker')}"
        waited = _ms(waiter.dur) if waiter else "?"
        lines.append(
            f"  {s.proc}: {chain(s.proc, s.key)}; waited {waited} for {slow} (last to push)"
        )
        if slow != last.proc:
            lines.append(f"  {slow}: {chain(slow, last.key)}")
    return lines


def link_table(tl: Timeline) -> List[Tuple[str, int, float, float, Optional[float]]]:
    """(link, bytes, busy fraction, GB/s, utilisation of the link rate or None) per link.

    A worker->server link is busy while one of its parts is being pushed; a server->worker
    link while one of its answers is under way."""
    its = iterations(tl)
    if not its:
        return []
    window = max(b for _, b in its.values()) - min(a for a, _ in its.values())
    pushes: Dict[str, List[Tuple[float, float, int]]] = {}
    part_bytes = {(s.proc, s.key): (s.args.get("bytes", 0), s.args.get("server")) for s in tl.parts}
    answered = {(s.proc, s.key): s.args.get("arrivals_us", {}) for s in tl.server_parts()}
    for s in tl.stages:
        if s.name == "push" and s.proc.startswith("worker"):
            nbytes, server = part_bytes.get((s.proc, s.key), (0, None))
            pushes.setdefault(f"{s.proc} -> server {server}", []).append((s.ts, s.end, nbytes))
        if s.name == "answer" and s.proc.startswith("server"):
            nbytes, _ = part_bytes.get((s.proc, s.key), (0, None))
            nbytes *= len(answered.get((s.proc, s.key), ())) or 1  # one answer per pusher
            pushes.setdefault(f"{s.proc} -> workers", []).append((s.ts, s.end, nbytes))
    rates = tl.info.get("link_mbit", {})
    rows = []
    for link, iv in sorted(pushes.items()):
        busy = _union(iv)
        nbytes = sum(b for _, _, b in iv)
        gbps = nbytes / (window * 1e3) if window > 0 else 0.0  # bytes/us -> GB/s
        rate = rates.get(link.split(" -> ")[0])
        util = (gbps * 8e3) / rate if rate else None  # GB/s -> Mbit/s
        rows.append((link, nbytes, busy / window if window > 0 else 0.0, gbps, util))
    return rows


def _union(iv: List[Tuple[float, float, int]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b, _ in sorted(iv):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def median_iteration(tl: Timeline) -> Optional[int]:
    its = iterations(tl)
    if not its:
        return None
    ranked = sorted(its, key=lambda k: its[k][1] - its[k][0])
    return ranked[len(ranked) // 2]


def report(tl: Timeline, iteration: Optional[int] = None) -> str:
    out: List[str] = []
    its = iterations(tl)
    err = tl.info.get("max_clock_error_us")
    out.append(
        f"{len(tl.processes)} processes, {len(its)} iterations, clocks aligned within {err:.0f} us"
        if err is not None
        else f"{len(its)} iterations"
    )
    if tl.info.get("dropped_events"):
        out.append(f"warning: {tl.info['dropped_events']} events were dropped (rings full)")
    if its:
        durs = [b - a for a, b in its.values()]
        out.append(f"iteration time: median {_ms(statistics.median(durs))}, max {_ms(max(durs))}")
    out.append("")
    out.append("per stage:             count      total     median")
    for role, name, n, total, med in stage_table(tl):
        out.append(f"  {role:6} {name:16} {n:6d} {_ms(total):>11} {_ms(med):>10}")
    out.append("")
    out.append("per tensor (median submission -> last part out, per worker and iteration):")
    for t, nbytes, med, worst in tensor_table(tl):
        out.append(f"  {t:30} {nbytes:>12} B {_ms(med):>11}   most time in: {worst}")
    out.append("")
    k = iteration if iteration is not None else median_iteration(tl)
    if k is not None:
        out.append(
            "critical path of the median iteration:" if iteration is None else "critical path:"
        )
        out.extend(critical_path(tl, k))
        out.append("")
    table, straggler = stragglers(tl)
    out.append("how far each worker trailed the first (submissions; pushes):")
    for w, row in table.items():
        push = f"{row['push_median_ms']:.2f} ms" if "push_median_ms" in row else "-"
        out.append(
            f"  {w:10} median {row['median_ms']:8.2f} ms  max {row['max_ms']:8.2f} ms;  "
            f"pushes median {push}"
        )
    if straggler:
        out.append(
            f"straggler: {straggler} (its submissions trailed the first worker's by a median "
            f"{table[straggler]['median_ms']:.2f} ms)"
        )
    else:
        out.append("straggler: none")
    waits = server_waits(tl)
    if waits:
        out.append("")
        out.append("how long each server's parts waited for the last worker's push:")
        names = {pid - SERVER_PID_BASE: n for pid, n in tl.processes.items()}
        for proc, n_parts, w_med, w_p90, w_max in waits:
            where = names.get(int(proc.split()[1]), proc)
            out.append(
                f"  {where:28} {n_parts:6d} parts  median {_ms(w_med):>11}  "
                f"p90 {_ms(w_p90):>11}  max {_ms(w_max):>11}"
            )
    out.append("")
    out.append("links (over the traced iterations):      bytes   busy    GB/s   of link")
    for link, nbytes, busy, gbps, util in link_table(tl):
        u = f"{util * 100:6.1f}%" if util is not None else "   n/a"
        out.append(f"  {link:32} {nbytes:>12} {busy * 100:5.1f}% {gbps:7.3f}  {u}")
    return "\n".join(out)


_COLORS = {
    "queued": "#c7c7c7",
    "queued for push": "#a0a0a0",
    "local reduce": "#9467bd",
    "push": "#1f77b4",
    "at server": "#ffbb78",
    "answer": "#2ca02c",
    "copy out": "#17becf",
    "at local owner": "#e377c2",
    "receive": "#aec7e8",
    "wait for workers": "#ff7f0e",
    "sum": "#d62728",
}


class PlotUnavailable(FastPSError, ImportError):
    """Drawing was asked for where matplotlib cannot be imported (an optional dependency)."""


PLOT_INSTALL = "pip install 'fastps[plot]' (or: pip install matplotlib)"


def pyplot() -> Any:
    """``matplotlib.pyplot``, drawing off-screen (Agg); :class:`PlotUnavailable`, saying
    what to install, where matplotlib cannot be imported."""
    try:
        import matplotlib
    except ImportError as exc:
        raise PlotUnavailable(
            f"drawing the timeline (--plot) needs matplotlib, which {sys.executable} cannot "
            f"import ({exc}); install it with: {PLOT_INSTALL}"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot(tl: Timeline, out: str, iteration: Optional[int] = None) -> int:
    """Draws one iteration's stages per process and row as a Gantt chart; returns it."""
    plt = pyplot()
    from matplotlib.patches import Patch

    k = iteration if iteration is not None else median_iteration(tl)
    if k is None:
        raise ValueError("the trace has no complete iteration to plot")
    stages = [s for s in tl.stages if s.key[2] == k]
    if not stages:
        raise ValueError(f"the trace has no stages of iteration {k} to plot")
    rows = sorted({(s.proc.split()[0] != "worker", int(s.proc.split()[1]), s.tid) for s in stages})
    index = {r: i for i, r in enumerate(rows)}
    t0 = min(s.ts for s in stages)
    fig, ax = plt.subplots(figsize=(12, max(3.0, 0.25 * len(rows) + 1.5)))
    for s in stages:
        y = index[(s.proc.split()[0] != "worker", int(s.proc.split()[1]), s.tid)]
        h = 0.4 if s.name == "sum" else 0.8
        ax.barh(
            y,
            s.dur / 1000.0,
            left=(s.ts - t0) / 1000.0,
            height=h,
            color=_COLORS.get(s.name, "#7f7f7f"),
            edgecolor="none",
        )
    labels = [f"{'server' if srv else 'worker'} {n} / {tid - 100}" for srv, n, tid in rows]
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("ms since the iteration's first submission")
    ax.set_title(f"fastps timeline: iteration {k}")
    used = sorted({s.name for s in stages})
    ax.legend(
        handles=[Patch(color=_COLORS.get(n, "#7f7f7f"), label=n) for n in used],
        fontsize=7,
        loc="upper right",
    )
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return k
