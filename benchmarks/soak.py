"""Soak: a job that push_pulls for a long time, sampling every process's memory and fds.

Runs a scheduler (here), servers and workers on this machine; the workers push_pull a fixed
gradient set plus tensors of random sizes (the same sequence on every worker) until the
duration is over. Every ``--every`` seconds it samples, per process, from /proc:

* anonymous RSS (``RssAnon``: heap, buffer pools, stacks) -- must stay flat after warm-up;
* shared-memory RSS (``RssShmem``: pages of the shared-memory segments touched so far,
  bounded by FASTPS_SHM_BYTES per segment; it grows while new slots are first used);
* open file descriptors.

It prints a table (first sample after warm-up vs last, and the max) and writes every sample
as CSV. Default 3 minutes; ``--hour`` for the release soak.

    python benchmarks/soak.py [--duration 180] [--hour] [--workers 2] [--servers 1] [--csv f]
"""

from __future__ import annotations

import argparse
import csv
import os
import secrets
import subprocess
import sys
import time
from typing import Dict, List, Optional, Tuple

HERE = os.path.abspath(__file__)
ROOT = os.path.dirname(os.path.dirname(HERE))


def worker_main(seconds: float) -> None:
    """One worker: push_pull until ``seconds`` passed; prints steps and MiB moved."""
    import fastps
    import numpy as np

    fastps.init()
    rng = np.random.default_rng(7)  # the same on every worker: same tensors, same order
    fixed = [np.ones(n, np.float32) for n in (1 << 20, 1 << 18, 4096, 10)]
    # 256 tensors of random sizes, used in turn: many buffer sizes, a bounded set of names.
    sizes = [int(n) for n in rng.integers(1, 1 << 20, 256)]
    t0 = time.monotonic()
    steps = moved = 0
    while True:
        # The duration is decided by rank 0 and shared, so every worker stops in the same step.
        stop = np.array([1.0 if time.monotonic() - t0 > seconds else 0.0], np.float32)
        if fastps.push_pull(stop, name="soak.stop", average=False)[0] > 0:
            break
        for i, x in enumerate(fixed):
            fastps.push_pull(x, name=f"soak.fixed{i}", average=False)
            moved += x.nbytes
        y = np.ones(sizes[steps % len(sizes)], np.float32)
        out = fastps.push_pull(y, name=f"soak.random{steps % len(sizes)}", average=False)
        if out[0] != fastps.size():
            raise SystemExit(f"wrong sum {out[0]} in step {steps}")
        moved += y.nbytes
        steps += 1
    print(f"STEPS {steps} MIB {moved / 2**20:.0f}", flush=True)
    fastps.shutdown()


def read_status(pid: int) -> Optional[Dict[str, int]]:
    """RssAnon / RssShmem / RssFile in KiB and the number of open fds; None once gone."""
    out: Dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("RssAnon", "RssShmem", "RssFile"):
                    out[key] = int(rest.split()[0])
        out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError):
        return None
    return out


def shm_kib(job_id: str) -> int:
    total = 0
    for name in os.listdir("/dev/shm"):
        if name.startswith(f"fastps-{job_id}-"):
            try:
                total += os.stat(os.path.join("/dev/shm", name)).st_blocks // 2
            except FileNotFoundError:
                pass
    return total


def run(args: argparse.Namespace) -> int:
    sys.path.insert(0, ROOT)
    from fastps.control.scheduler import Scheduler

    job_id = "soak" + secrets.token_hex(3)
    token = secrets.token_hex(16)
    sched = Scheduler(args.workers, args.servers, job_id, token, timeout=60.0)
    sched.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPS_")}
    env.update(
        FASTPS_SCHEDULER_ADDR=sched.address_text,
        FASTPS_JOB_ID=job_id,
        FASTPS_TOKEN=token,
        FASTPS_NUM_WORKERS=str(args.workers),
        FASTPS_NUM_SERVERS=str(args.servers),
        FASTPS_HOST="127.0.0.1",
        FASTPS_OP_TIMEOUT="600",
        PYTHONUNBUFFERED="1",
    )
    procs: List[Tuple[str, subprocess.Popen]] = []

    # "split": every worker on its own emulated host (FASTPS_HOSTNAME), server s on worker
    # s's host: parts cross the servers' sockets and the colocated shared-memory path.
    # "one": everything on one host: the local reduce is the total, servers stay idle.
    def host(i: int) -> Dict[str, str]:
        return {} if args.hosts == "one" else {"FASTPS_HOSTNAME": f"soakhost{i}"}

    for s in range(args.servers):
        procs.append(
            (
                f"server{s}",
                subprocess.Popen(
                    [sys.executable, "-m", "fastps.server"],
                    env=dict(env, FASTPS_ROLE="server", FASTPS_SERVER_ID=str(s), **host(s)),
                ),
            )
        )
    for r in range(args.workers):
        procs.append(
            (
                f"worker{r}",
                subprocess.Popen(
                    [sys.executable, HERE, "--worker", str(args.duration)],
                    env=dict(env, FASTPS_ROLE="worker", FASTPS_RANK=str(r), **host(r)),
                    stdout=subprocess.PIPE,
                    text=True,
                ),
            )
        )
    samples: List[Dict[str, object]] = []
    t0 = time.monotonic()
    while any(p.poll() is None for _, p in procs):
        t = time.monotonic() - t0
        for name, p in procs:
            st = read_status(p.pid)
            if st is not None:
                samples.append({"t": round(t, 1), "proc": name, **st})
        samples.append({"t": round(t, 1), "proc": "dev-shm", "RssShmem": shm_kib(job_id)})
        time.sleep(args.every)
    sched.stop()
    codes = {name: p.wait() for name, p in procs}
    for name, p in procs:
        if p.stdout is not None:
            print(f"{name}: {p.stdout.read().strip()}")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, ["t", "proc", "RssAnon", "RssShmem", "RssFile", "fds"])
            w.writeheader()
            w.writerows(samples)
    warm = args.duration * args.warmup
    # A sample catches whatever arrays are alive at that instant, so compare the largest
    # value in the first window after warm-up with the largest in the last window.
    win = max(args.every * 3, (args.duration - warm) * 0.2)
    print(
        f"\n{args.workers} workers, {args.servers} servers, hosts={args.hosts}, "
        f"{args.duration:g} s, samples every {args.every:g} s; max over the first "
        f"{win:.0f} s after warm-up ({warm:.0f} s) -> max over the last {win:.0f} s:"
    )
    print(f"{'process':10} {'anon MiB':>16} {'change':>8} {'shm MiB':>16} {'fds':>10}")
    worst = 0.0
    for name in [n for n, _ in procs]:
        rows = [s for s in samples if s["proc"] == name and float(s["t"]) >= warm]
        if len(rows) < 2:
            continue
        t_end = float(rows[-1]["t"])
        first = [r for r in rows if float(r["t"]) <= warm + win]
        last = [r for r in rows if float(r["t"]) >= t_end - win]

        def peak(rs: List[Dict[str, object]], key: str) -> int:
            return max(int(str(r[key])) for r in rs)

        a0, a1 = peak(first, "RssAnon"), peak(last, "RssAnon")
        s0, s1 = peak(first, "RssShmem"), peak(last, "RssShmem")
        f0, f1 = peak(first, "fds"), peak(last, "fds")
        growth = 100.0 * (a1 - a0) / a0
        worst = max(worst, abs(growth))
        print(
            f"{name:10} {a0 / 1024:6.1f} -> {a1 / 1024:6.1f} {growth:+7.1f}% "
            f"{s0 / 1024:6.1f} -> {s1 / 1024:6.1f} {f0:4d} -> {f1:<4d}"
        )
    print(f"largest anonymous-memory change after warm-up: {worst:.1f}%")
    print(f"exit codes: {codes}")
    return 0 if all(c == 0 for c in codes.values()) else 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", type=float, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--duration", type=float, default=180.0, help="seconds (default 180)")
    ap.add_argument("--hour", action="store_true", help="soak for one hour")
    ap.add_argument("--every", type=float, default=5.0, help="sampling period, s")
    ap.add_argument("--warmup", type=float, default=0.2, help="fraction of the run ignored")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--servers", type=int, default=1)
    ap.add_argument(
        "--hosts",
        choices=("split", "one"),
        default="split",
        help="emulate one host per worker (default) or put everything on one",
    )
    ap.add_argument("--csv", default=None, help="write every sample here")
    args = ap.parse_args()
    if args.worker is not None:
        worker_main(args.worker)
        return
    if args.hour:
        args.duration = 3600.0
    sys.exit(run(args))


if __name__ == "__main__":
    main()
