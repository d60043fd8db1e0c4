"""Recovery after a summation server is SIGKILLed, or a server joins, on loopback, with
FASTPS_ELASTIC_SERVERS=1 (no rollback: docs/guide/elastic.md).

Runs ``fastpsrun -np W --num-servers S`` on ``tests/integration/elastic/train_servers.py`` (numpy
gradients of 350k float32 through ``fastps.api``); at step 10 rank 0 SIGKILLs server 1
right after the step's push_pulls started, and (``--add``) at step 20 starts a server with
``python -m fastps.server``. Reports per run, on rank 0's clock: **kill->step**, from the
SIGKILL to the end of that step (the old core's abort, the report, the plan, a new core
connected to the remaining servers, the step's push_pulls summed again); **join pause**,
from the scheduler's announcement that the new server registered to rank 0 running on a
core connected to it (the new server's start-up is not counted: training goes on
meanwhile); and the median step without a change.

    python benchmarks/bench_server_recovery.py --workers 3 --servers 3 --runs 5 --add
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(REPO, "tests", "integration", "elastic", "train_servers.py")


def one_run(workers: int, servers: int, add: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPS_")}
        env.update(
            STEPS="30",
            KILL="10:1",
            RESULT=os.path.join(tmp, "r.json"),
            FASTPS_ELASTIC_SERVERS="1",
            TMPDIR=tmp,
            PYTHONUNBUFFERED="1",
        )
        if add:
            env["ADD"] = "20:9"
        cmd = [sys.executable, "-m", "fastps.launcher", "-np", str(workers)]
        cmd += ["--num-servers", str(servers), sys.executable, TRAIN]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise SystemExit(f"run failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
        with open(env["RESULT"]) as f:
            return json.load(f)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--servers", type=int, default=3)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--add", action="store_true", help="also start a server at step 20")
    args = ap.parse_args()
    rows: dict = {"kill->step (s)": [], "step (s)": []}
    if args.add:
        rows["join pause (s)"] = []
    for i in range(args.runs):
        out = one_run(args.workers, args.servers, args.add)
        rows["kill->step (s)"] += [c["seconds"] for c in out["changes"] if c["what"] == "kill"]
        if args.add:
            rows["join pause (s)"].append(out["redone"][-1]["seconds"])
        rows["step (s)"].append(out["step_median"])
        print(f"run {i}: {out['changes']} resent/replayed {out['redone']}", flush=True)
    head = " | ".join(str(i) for i in range(args.runs))
    print(f"| run | {head} | median | max |")
    print("|---|" + "---:|" * (args.runs + 2))
    for name, vals in rows.items():
        cells = " | ".join(f"{v:.3f}" for v in vals)
        print(f"| {name} | {cells} | {statistics.median(vals):.3f} | {max(vals):.3f} |")


if __name__ == "__main__":
    main()
