"""Elastic recovery after a SIGKILL on loopback.

Runs ``fastpsrun --min-np 1 --host-discovery-script 'echo localhost:N'`` on
``tests/integration/elastic/train_elastic.py`` (a small torch model, a step of about 0.1 s); the
worker on the last slot SIGKILLs itself in the middle of a backward pass (push_pulls in
flight). Reports per run, from the processes' own clocks:

- ``detect+form``: fastpsrun's "generation k formed ... s after the failure" (process exit
  seen → next generation's scheduler and servers started and every survivor assigned);
- ``kill->step``: SIGKILL → rank 0 finished its next training step in the smaller world
  (abort, restore, shutdown, rendezvous, new core, sync from rank 0, one step).

``--spare``: one more slot and ``--spare-hosts 1``: a waiting spare takes the dead
worker's rank, the world keeps its size. The benchmark then SIGKILLs the worker itself,
once fastpsrun said the spare is ready and rank 0 made a step after that (so the spare's
own start-up is not measured); ``kill->step`` runs from that SIGKILL.
``--in-place`` (with ``--spare``): the worker kills itself inside the backward pass of
the first step after the benchmark's signal (a file), i.e. inside the first step after a
commit (the script commits every step); ``FASTPS_ELASTIC_INPLACE=1`` unless
``--in-place off`` (the same kill point, with the rollback: the comparison).
``--settle S`` (with ``--spare``): wait S s after the spare is ready before the kill, so
its warm-up is over. ``--compute S``: S s of emulated compute in each step before its
backward pass (what a rollback does again).
``--elastic-servers``: FASTPS_ELASTIC_SERVERS=1 (the workers' rerouting data plane).
``--kill-server``: with elastic servers, rank 0 SIGKILLs the generation's server 0
instead (of ``--servers``; no rollback, no new generation): ``kill->step`` is then the
server loss's recovery, ``detect+form`` is not reported.

    python benchmarks/bench_elastic_recovery.py --workers 3 --runs 5
    python benchmarks/bench_elastic_recovery.py --workers 3 --runs 5 --spare
    python benchmarks/bench_elastic_recovery.py --workers 3 --runs 5 --spare --settle 10 \
        --compute 0.5 --in-place on     # and --in-place off: the comparison
    python benchmarks/bench_elastic_recovery.py --workers 3 --runs 5 --elastic-servers
    python benchmarks/bench_elastic_recovery.py --workers 3 --runs 5 --kill-server --servers 2
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(REPO, "tests", "integration", "elastic", "train_elastic.py")


def one_run(workers: int, kill_step: int, steps: int, args: argparse.Namespace) -> tuple:
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPS_")}
        env.update(
            STEPS=str(steps),
            STEP_SLEEP="0.1",
            COMPUTE_SLEEP=str(args.compute),
            RESULT=os.path.join(tmp, "r.json"),
            PYTHONUNBUFFERED="1",
            TMPDIR=tmp,
        )
        if args.kill_server:
            env["KILL_SERVER_AT"] = str(kill_step)
        else:
            env["FAIL_AT"] = f"localhost:{workers - 1}@{kill_step}@backward"
        if args.elastic_servers or args.kill_server:
            env["FASTPS_ELASTIC_SERVERS"] = "1"
        slots = workers + (1 if args.spare else 0)
        cmd = [
            sys.executable, "-m", "fastps.launcher",
            "-np", str(workers), "--min-np", "1", "--max-np", str(workers),
            "--host-discovery-script", f"echo localhost:{slots}",
            "--elastic-timeout", "60", "--num-servers", str(args.servers),
        ]  # fmt: skip
        if args.spare:
            cmd += ["--spare-hosts", "1"]
            env.pop("FAIL_AT")
            env["STEPS"] = "5000"  # the benchmark kills a worker, then stops the job
            trigger = ""
            if args.in_place:
                trigger = os.path.join(tmp, "die")
                env["FAIL_ON_FILE"] = f"localhost:{workers - 1}@{trigger}"
                if args.in_place == "on":
                    env["FASTPS_ELASTIC_INPLACE"] = "1"
            stdout, stderr = _spare_run(
                cmd[3:] + [sys.executable, TRAIN], env, workers, trigger, args.settle
            )
            if args.in_place == "on" and "in-place replacement: granted" not in stderr:
                raise SystemExit(f"in place was not granted:\n{stderr[-4000:]}")
        else:
            cmd += [sys.executable, TRAIN]
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
            if proc.returncode != 0:
                raise SystemExit(f"run failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
            stdout, stderr = proc.stdout, proc.stderr
    return _parse(stdout, stderr, args)


def _spare_run(
    args: list, env: dict, workers: int, trigger: str = "", settle: float = 0.0
) -> tuple:
    """Kills the last slot's worker once the spare is ready (``trigger``: creates that
    file, and the worker kills itself in its next backward pass); returns the job's output
    (stdout-like: the kill and rank 0's steps; stderr-like: everything) once the new
    generation, of the same size, made two steps."""
    sys.path.insert(0, os.path.join(REPO, "tests", "integration", "elastic"))
    from live_job import LiveJob

    job = LiveJob(args, env)
    try:
        victim = job.worker_pid(f"localhost:{workers - 1}")
        job.wait_for(r"spare worker on slot \S+ is ready", 240)
        # A spare warms up (torch's lazy imports) after its first "standby" answer, 5 s
        # after it is ready: a kill before that measures the warm-up's CPU contention.
        time.sleep(settle)
        job.wait_for(r"STEP \d+ size", 60, start=job.mark())
        at = job.mark()
        if trigger:
            open(trigger, "w").close()
            killed = float(job.wait_for(r"KILL \S+ step=\d+ where=backward t=([\d.]+)", 60, at)[1])
        else:
            killed = time.time()
            os.kill(victim, signal.SIGKILL)
        job.wait_for(r"generation 1: ", 120, start=at)
        job.wait_for(rf"STEP \d+ size={workers} ", 120, start=job.mark())
        job.wait_for(rf"STEP \d+ size={workers} ", 120, start=job.mark())
    finally:
        job.stop()
    lines = job.output.splitlines()
    stdout = f"KILL localhost:{workers - 1} step=0 where=outside t={killed:.3f}\n"
    stdout += "\n".join(x for x in lines if "STEP" in x)
    return stdout, "\n".join(lines)


def _parse(stdout: str, stderr: str, args: argparse.Namespace) -> tuple:
    kill = re.search(r"KILL \S+ .*step=\d+.* t=([\d.]+)", stdout)
    formed = re.search(r"generation 1: .* ([\d.]+) s after the failure", stderr)
    if args.kill_server and "generation 1" in stderr:
        raise SystemExit(f"a server's loss formed a new generation:\n{stderr[-3000:]}")
    after = [
        float(m.group(1))
        for m in re.finditer(r"STEP \d+ size=\d+ t=([\d.]+)", stdout)
        if kill and float(m.group(1)) > float(kill.group(1))
    ]
    if not (kill and after and (formed or args.kill_server)):
        raise SystemExit(f"could not parse the run:\n{stdout[-3000:]}\n{stderr[-3000:]}")
    form = float(formed.group(1)) if formed else float("nan")
    return form, min(after) - float(kill.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--kill-step", type=int, default=8)
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("--servers", type=int, default=1)
    ap.add_argument("--spare", action="store_true", help="--spare-hosts 1 (one more slot)")
    ap.add_argument(
        "--in-place",
        choices=["on", "off"],
        default=None,
        help="with --spare: kill inside the first step after a commit, in place on or off",
    )
    ap.add_argument(
        "--settle",
        type=float,
        default=0.0,
        help="with --spare: seconds to wait after the spare is ready before the kill",
    )
    ap.add_argument(
        "--compute",
        type=float,
        default=0.0,
        help="seconds of emulated compute in each step before its backward pass",
    )
    ap.add_argument("--elastic-servers", action="store_true", help="FASTPS_ELASTIC_SERVERS=1")
    ap.add_argument("--kill-server", action="store_true", help="kill server 0, not a worker")
    args = ap.parse_args()
    if args.in_place and not args.spare:
        ap.error("--in-place needs --spare")
    if args.kill_server and args.servers < 2:
        ap.error("--kill-server needs --servers 2 or more (the last server cannot go)")
    forms, recs = [], []
    for i in range(args.runs):
        form, rec = one_run(args.workers, args.kill_step, args.steps, args)
        forms.append(form)
        recs.append(rec)
        print(f"run {i}: detect+form {form:.2f} s, kill->step {rec:.2f} s", flush=True)
    after = args.workers if args.spare or args.kill_server else args.workers - 1
    form_text = (
        ""
        if args.kill_server
        else f"detect+form median {statistics.median(forms):.2f} s (max {max(forms):.2f}), "
    )
    print(
        f"{args.workers} -> {after} workers, {args.runs} runs: {form_text}"
        f"kill->step median {statistics.median(recs):.2f} s (max {max(recs):.2f})"
    )


if __name__ == "__main__":
    main()
