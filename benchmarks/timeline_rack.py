"""One merged timeline of a job on the emulated rack (docs/guide/timeline.md, "On the rack").

Builds a rack of ``--workers`` worker hosts and ``--servers`` CPU hosts (prefix
``--prefix``), runs a fastps job on it through the rack runner (``rack_common.start_fastps``:
scheduler on w0, one server per CPU host, one worker per worker host, each in its host's
network namespace) with ``FASTPS_TIMELINE`` set, so every worker and server writes its
share to ``<out>.parts/`` (the namespaces share the file system). Then it merges the shares
into ``--out``, checks the trace (``fastps.timeline.schema``), checks that every worker and
every server track holds each of its stages and that every worker saw the same parts, and
prints the summary. ``--straggler R --delay-ms D`` makes worker R sleep D ms before each
iteration; the summary must then name it (exit 1 otherwise).

    python -m benchmarks.timeline_rack --out /tmp/rack.json
    python -m benchmarks.timeline_rack --out /tmp/rack.json --straggler 2 --delay-ms 40

Needs root. Always tears its rack down.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import rack_common as rc  # noqa: E402

WORKER_STAGES = ("queued", "push", "at server", "answer", "copy out")
SERVER_STAGES = ("receive", "wait for workers", "answer")


def child(args: argparse.Namespace) -> None:
    """A worker: ``--iters`` iterations of three tensors (one cut into several parts)."""
    import fastps.worker.api as api
    import numpy as np

    api.init()
    rank, size = api.rank(), api.size()
    delay = args.delay_ms / 1000.0 if rank == args.straggler else 0.0
    tensors = [np.full(n, rank + 1, np.float32) for n in (1000, 700_000, 70_000)]
    expect = size * (size + 1) / 2
    for _ in range(args.iters):
        if delay:
            time.sleep(delay)
        with api.submission_batch():
            handles = [
                api.push_pull_async(t, average=False, name=f"grad{i}", priority=-i)
                for i, t in enumerate(tensors)
            ]
        for h in handles:
            out = api.synchronize(h)
            if not np.all(out == expect):
                raise SystemExit(f"rank {rank}: wrong sum {out[:4]} (want {expect})")
    api.shutdown()


def stages_per_process(trace: Dict[str, Any]) -> Tuple[Dict[str, Counter], Dict[str, Set]]:
    """Per process track: how many spans of each stage, and the (tensor, part, round) set."""
    names = {
        e["pid"]: e["args"]["name"].split(" (")[0]
        for e in trace["traceEvents"]
        if e.get("ph") == "M" and e.get("name") == "process_name"
    }
    stages: Dict[str, Counter] = defaultdict(Counter)
    parts: Dict[str, Set] = defaultdict(set)
    for e in trace["traceEvents"]:
        if e.get("ph") != "X" or e["pid"] not in names:
            continue
        who = names[e["pid"]]
        if e.get("cat") == "stage":
            stages[who][e["name"]] += 1
        elif e.get("cat") == "part":
            a = e["args"]
            parts[who].add((a["tensor"], a["part"], a["round"]))
    return stages, parts


def verify(trace: Dict[str, Any], n: int, servers: int) -> List[str]:
    """Problems with the per-process content of a merged trace (empty: fine)."""
    from fastps.timeline.schema import check

    problems = list(check(trace))
    stages, parts = stages_per_process(trace)
    for role, count, wanted in (("worker", n, WORKER_STAGES), ("server", servers, SERVER_STAGES)):
        for r in range(count):
            who = f"{role} {r}"
            if who not in stages:
                problems.append(f"{who}: no track in the trace")
                continue
            missing = [s for s in wanted if stages[who][s] == 0]
            if missing:
                problems.append(f"{who}: no span of stage(s) {', '.join(missing)}")
            lopsided = {s: stages[who][s] for s in wanted if stages[who][s] != len(parts[who])}
            if lopsided:
                problems.append(f"{who}: {len(parts[who])} parts but stage spans {lopsided}")
    first = parts.get("worker 0", set())
    for r in range(1, n):
        if parts.get(f"worker {r}", set()) != first:
            problems.append(f"worker {r} saw other parts than worker 0")
    on_servers: Set = set().union(*(parts.get(f"server {s}", set()) for s in range(servers)))
    if on_servers != first:
        problems.append("the servers summed other parts than the workers pushed")
    return problems


def orchestrate(args: argparse.Namespace) -> int:
    from fastps.timeline import summarize
    from fastps.timeline.merge import merge_files
    from fastps.timeline.recorder import clear_parts

    from benchmarks.rack import Rack, is_supported

    ok, why = is_supported()
    if not ok:
        print(f"rack not supported here: {why}", file=sys.stderr)
        return 2
    out = os.path.abspath(args.out)
    clear_parts(out)
    argv = [sys.executable, "-m", "benchmarks.timeline_rack", "--child"]
    argv += ["--iters", str(args.iters), "--straggler", str(args.straggler)]
    argv += ["--delay-ms", str(args.delay_ms)]
    env = {"FASTPS_TIMELINE": out, "FASTPS_PARTITION_BYTES": str(args.partition_bytes)}
    t0 = time.monotonic()
    with Rack(args.workers, args.servers, args.rate, prefix=args.prefix) as rack:
        launch = rc.start_fastps(
            rack,
            args.workers,
            args.servers,
            argv,
            args.port,
            env,
            timeout_s=args.timeout,
            label="tl",
            servers_on_workers=False,
        )
        ok, err = rc.wait_all(rack, launch, args.timeout)
        if not ok:
            print(f"job failed:\n{err}", file=sys.stderr)
            return 1
    info = merge_files(out)
    if info is None:
        print(f"no shares in {out}.parts/", file=sys.stderr)
        return 1
    print(
        f"timeline: {out} ({info['processes']} processes, clocks aligned within "
        f"{info.get('max_clock_error_us', 0):g} us), job {time.monotonic() - t0:.1f} s"
    )
    with open(out) as f:
        trace = json.load(f)
    stages, parts = stages_per_process(trace)
    for who in sorted(stages):
        row = ", ".join(f"{s} {c}" for s, c in sorted(stages[who].items()))
        print(f"  {who}: {len(parts[who])} parts; {row}")
    problems = verify(trace, args.workers, args.servers)
    for p in problems:
        print(f"problem: {p}", file=sys.stderr)
    print(summarize.report(summarize.load(out), None))
    if problems:
        return 1
    if args.straggler >= 0:
        _, name = summarize.stragglers(summarize.load(out))
        if name != f"worker {args.straggler}":
            print(f"summarize named {name!r}, not worker {args.straggler}", file=sys.stderr)
            return 1
    return 0


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.timeline_rack", description=__doc__)
    p.add_argument("--out", default="/tmp/fastps-rack-timeline.json", help="merged trace")
    p.add_argument("--workers", "-n", type=int, default=4, help="worker hosts, one worker each")
    p.add_argument("--servers", "-k", type=int, default=2, help="CPU hosts, one server each")
    p.add_argument("--rate", type=float, default=1000.0, help="Mbit/s per host link")
    p.add_argument("--iters", type=int, default=8)
    p.add_argument("--straggler", type=int, default=-1, help="rank to slow down (-1: none)")
    p.add_argument("--delay-ms", type=float, default=40.0, help="the straggler's delay")
    p.add_argument("--partition-bytes", type=int, default=1 << 20)
    p.add_argument("--prefix", default="fptl", help="rack namespace prefix")
    p.add_argument("--port", type=int, default=29810)
    p.add_argument("--timeout", type=float, default=180.0, help="hard bound on the job, s")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.workers < 1 or a.servers < 1:
        p.error("need at least one worker and one server")
    if a.straggler >= a.workers:
        p.error(f"--straggler {a.straggler}: there are only {a.workers} workers")
    return a


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.child:
        child(args)
        return 0
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
