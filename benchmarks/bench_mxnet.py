"""Gluon training throughput: fastps against MXNet's own parameter server (dist_sync).

Runs the Gluon digits examples with the same number of workers and servers on this machine,
interleaving the systems so that they see the same conditions, and prints a table:

* fastps DistributedTrainer  examples/mxnet/gluon_digits.py under fastpsrun
* fastps KVStore             examples/mxnet/gluon_digits_kvstore.py --kvstore fastps
* MXNet dist_sync            examples/mxnet/gluon_digits_kvstore.py --kvstore dist_sync, with
                             MXNet's scheduler and servers started here through the DMLC_*
                             variables (ps-lite over TCP on 127.0.0.1)

Run it with the MXNet environment's python (tests/envs/mxnet.sh prints it):

    .venv-mxnet/bin/python benchmarks/bench_mxnet.py --workers 2 --servers 1
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "mxnet"
RATE = re.compile(r"test accuracy: ([0-9.]+)\s+samples/s: ([0-9.]+)")


def base_env(threads: int) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FASTPS_", "DMLC_"))}
    env.update(
        PYTHONUNBUFFERED="1",
        PYTHONWARNINGS="ignore",
        OMP_NUM_THREADS=str(threads),
        MXNET_CPU_WORKER_NTHREADS=str(threads),
    )
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop(procs: List[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def parse(output: str, what: str) -> Tuple[float, float]:
    m = RATE.search(output)
    if not m:
        raise RuntimeError(f"{what}: no 'samples/s' line in its output:\n{output[-3000:]}")
    return float(m.group(1)), float(m.group(2))


def run_fastps(
    example: str, args: List[str], workers: int, servers: int, threads: int, timeout: float
) -> Tuple[float, float]:
    cmd = [
        sys.executable,
        "-m",
        "fastps.launcher",
        "-np",
        str(workers),
        "--num-servers",
        str(servers),
        sys.executable,
        str(EXAMPLES / example),
        *args,
    ]
    res = subprocess.run(
        cmd,
        env=base_env(threads),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    if res.returncode != 0:
        raise RuntimeError(f"fastps {example} failed ({res.returncode}):\n{res.stdout[-3000:]}")
    return parse(res.stdout, example)


def run_dist_sync(
    args: List[str], workers: int, servers: int, threads: int, timeout: float
) -> Tuple[float, float]:
    """MXNet's ps-lite job: one scheduler, ``servers`` servers, ``workers`` workers."""
    env = base_env(threads)
    env.update(
        DMLC_PS_ROOT_URI="127.0.0.1",
        DMLC_PS_ROOT_PORT=str(free_port()),
        DMLC_NUM_SERVER=str(servers),
        DMLC_NUM_WORKER=str(workers),
        DMLC_NODE_HOST="127.0.0.1",
    )
    # Importing mxnet with DMLC_ROLE=scheduler/server runs that role until the job ends.
    role_cmd = [sys.executable, "-c", "import mxnet"]
    procs: List[subprocess.Popen] = []
    try:
        procs.append(
            subprocess.Popen(
                role_cmd,
                env=dict(env, DMLC_ROLE="scheduler"),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        )
        for _ in range(servers):
            procs.append(
                subprocess.Popen(
                    role_cmd,
                    env=dict(env, DMLC_ROLE="server"),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
        wcmd = [
            sys.executable,
            str(EXAMPLES / "gluon_digits_kvstore.py"),
            "--kvstore",
            "dist_sync",
            *args,
        ]
        wprocs = [
            subprocess.Popen(
                wcmd,
                env=dict(env, DMLC_ROLE="worker"),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
            for _ in range(workers)
        ]
        procs.extend(wprocs)
        deadline = time.monotonic() + timeout
        outputs = []
        for p in wprocs:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            if p.returncode != 0:
                raise RuntimeError(f"dist_sync worker failed ({p.returncode}):\n{out[-3000:]}")
            outputs.append(out)
        for p in procs[: servers + 1]:  # the scheduler and servers leave after the workers
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        # rank 0 prints the job's line; which process got rank 0 is up to ps-lite
        return parse("\n".join(outputs), "dist_sync")
    finally:
        _stop(procs)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--servers", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=32, help="per worker")
    ap.add_argument(
        "--models",
        default="64x1,1024x2",
        help="comma-separated HIDDENxLAYERS of the MLP (64x1 is the example's)",
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="MXNet/OpenMP threads per process")
    ap.add_argument("--timeout", type=float, default=600)
    opts = ap.parse_args(argv)

    systems = ["fastps DistributedTrainer", "fastps KVStore", "MXNet dist_sync"]
    rows = []
    for model in opts.models.split(","):
        hidden, layers = (int(v) for v in model.lower().split("x"))
        params = 64 * hidden + hidden + (layers - 1) * (hidden * hidden + hidden) + hidden * 10 + 10
        args = [
            "--epochs",
            str(opts.epochs),
            "--batch-size",
            str(opts.batch_size),
            "--hidden",
            str(hidden),
            "--layers",
            str(layers),
            "--min-accuracy",
            "0",
        ]
        rates: Dict[str, List[float]] = {s: [] for s in systems}
        accuracy: Dict[str, List[float]] = {s: [] for s in systems}
        for rep in range(opts.repeats):
            order = systems if rep % 2 == 0 else list(reversed(systems))
            for system in order:
                if system == "fastps DistributedTrainer":
                    acc, rate = run_fastps(
                        "gluon_digits.py",
                        args,
                        opts.workers,
                        opts.servers,
                        opts.threads,
                        opts.timeout,
                    )
                elif system == "fastps KVStore":
                    acc, rate = run_fastps(
                        "gluon_digits_kvstore.py",
                        ["--kvstore", "fastps", *args],
                        opts.workers,
                        opts.servers,
                        opts.threads,
                        opts.timeout,
                    )
                else:
                    acc, rate = run_dist_sync(
                        args, opts.workers, opts.servers, opts.threads, opts.timeout
                    )
                rates[system].append(rate)
                accuracy[system].append(acc)
                print(
                    f"# {model} run {rep + 1} {system}: {rate:.0f} samples/s, accuracy {acc:.4f}",
                    file=sys.stderr,
                    flush=True,
                )
        base = statistics.median(rates["MXNet dist_sync"])
        for system in systems:
            med = statistics.median(rates[system])
            rows.append(
                (
                    f"{hidden}x{layers} ({params * 4 / 2**20:.2f} MiB)",
                    system,
                    med,
                    min(rates[system]),
                    max(rates[system]),
                    statistics.median(accuracy[system]),
                    med / base,
                )
            )

    print(
        f"workers={opts.workers} servers={opts.servers} batch={opts.batch_size}/worker "
        f"epochs={opts.epochs} repeats={opts.repeats} threads/process={opts.threads}"
    )
    print()
    print(
        "| model (gradients) | system | samples/s (median) | min | max | accuracy | vs dist_sync |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for model, system, med, lo, hi, acc, ratio in rows:
        print(
            f"| {model} | {system} | {med:.0f} | {lo:.0f} | {hi:.0f} | {acc:.4f} | {ratio:.2f}x |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
