"""How long a job takes to end once its workers are done: with and without the exit-time
heap freeze (core/worker/exit_heap.py, ``FASTPS_GC_FREEZE``), interleaved in one run.

Each run is ``python -m fastps.launcher -np N`` of a torch worker that allreduces one tensor,
calls ``shutdown()`` and prints a line. Measured per run, on this process's clock: from the
last worker's final line to the launcher's exit (the workers' interpreter exit and the
servers leaving), and the whole job's wall time. Prints the medians per setting and their
ratio, and optionally every run as CSV. Loopback, no root.

    python -m benchmarks.bench_job_exit --repeats 5
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

WORKER = """
import fastps.torch as hvd
import torch

hvd.init()
hvd.allreduce(torch.ones(4), name="x")
hvd.shutdown()
print("WORKER DONE", flush=True)
"""

SETTINGS = {"freeze at exit (default)": "1", "FASTPS_GC_FREEZE=0": "0"}


def one_job(script: Path, workers: int, freeze: str, timeout: float) -> Tuple[float, float]:
    """(seconds from the last worker's final line to the launcher's exit, job wall time)."""
    env = {**os.environ, "FASTPS_GC_FREEZE": freeze}
    cmd = [
        sys.executable,
        "-m",
        "fastps.launcher",
        "-np",
        str(workers),
        sys.executable,
        str(script),
    ]
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    last_done: Optional[float] = None
    seen = 0
    assert proc.stdout is not None
    for line in proc.stdout:
        if "WORKER DONE" in line:
            seen += 1
            last_done = time.monotonic()
        if time.monotonic() - start > timeout:
            proc.kill()
            break
    rc = proc.wait(timeout=timeout)
    end = time.monotonic()
    if rc != 0 or seen != workers or last_done is None:
        raise SystemExit(f"bench_job_exit: a job failed (exit {rc}, {seen} of {workers} done)")
    return end - last_done, end - start


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--repeats", type=int, default=5, help="jobs per setting (interleaved)")
    p.add_argument("-n", "--workers", type=int, default=2)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per job")
    p.add_argument("--out", type=Path, default=None, help="CSV of every run")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.workers < 1:
        p.error(f"--workers must be >= 1, got {args.workers}")
    runs: Dict[str, List[Tuple[float, float]]] = {name: [] for name in SETTINGS}
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "exit_worker.py"
        script.write_text(WORKER)
        for rep in range(args.repeats):
            names = list(SETTINGS) if rep % 2 == 0 else list(reversed(SETTINGS))
            for name in names:
                runs[name].append(one_job(script, args.workers, SETTINGS[name], args.timeout))
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{args.workers} workers on loopback, {args.repeats} jobs per setting; load {load}")
    print(f"{'setting':28} {'end after last worker (s)':>26} {'job wall (s)':>13}")
    medians = {}
    for name, vals in runs.items():
        tail = statistics.median(v[0] for v in vals)
        wall = statistics.median(v[1] for v in vals)
        medians[name] = (tail, wall)
        spread = f"{min(v[0] for v in vals):.2f}-{max(v[0] for v in vals):.2f}"
        print(f"{name:28} {tail:10.2f} ({spread:>11}) {wall:13.2f}")
    on, off = medians["freeze at exit (default)"], medians["FASTPS_GC_FREEZE=0"]
    print(f"freeze / no freeze: end {on[0] / off[0]:.2f}, job wall {on[1] / off[1]:.2f}")
    if args.out is not None:
        with args.out.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["setting", "repeat", "end_after_last_worker_s", "job_wall_s"])
            for name, vals in runs.items():
                for i, (tail, wall) in enumerate(vals):
                    w.writerow([name, i, f"{tail:.3f}", f"{wall:.3f}"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
