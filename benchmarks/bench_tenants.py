"""Two jobs on one shared multi-tenant server host vs each with its own server vs alone.

Each job: 2 workers push_pulling one tensor (``--elems`` float32, shared memory off so
every part reaches the server over TCP and is summed there) in a loop for ``--seconds``;
every sum is checked exactly (tests/workers/tenant_worker.py). Scenarios, one after the
other on this machine:

- ``alone``: job A alone on the shared host (``python -m fastps.shared_server``);
- ``shared``: jobs A and B at once on the same shared host;
- ``own``: jobs A and B at once, each with its own ``fastps.server`` process.

Reported: rounds/s of each job, and for the pairs the fairness min(a, b) / ((a + b) / 2)
— the share of its fair share that the slower job got (1.0: an even split).

    python -m benchmarks.bench_tenants --seconds 10 --elems 1048576
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from fastps.control.shared_server import JobSpec, admit  # noqa: E402
from jobs import WORKERS, Job  # noqa: E402

TENANT = os.path.join(WORKERS, "tenant_worker.py")


def _rate(job: Job) -> float:
    """Rounds per second of the job (its slowest worker)."""
    rates = []
    for w in job.workers():
        m = re.search(r"TENANT-ROUNDS (\d+) ([\d.]+)", w.output)
        if m is None or w.popen.returncode != 0:
            raise RuntimeError(f"job {job.job_id} failed:\n{job.dump()[-3000:]}")
        rates.append(int(m.group(1)) / float(m.group(2)))
    return min(rates)


def _jobs(count: int, tag0: int, args: argparse.Namespace, jobs_dir: Optional[str]) -> List[Job]:
    env = {"FASTPS_SHM": "0", "OMP_NUM_THREADS": "1"}
    out = []
    for i in range(count):
        argv = [TENANT, str(tag0 + i), str(args.elems), str(args.seconds)]
        if jobs_dir is None:  # its own server
            out.append(Job(2, 1, argv, env=env))
            continue
        job = Job(2, 1, argv, env=env, custom={("server", 0): ["-c", "pass"]})
        admit(jobs_dir, JobSpec(job.job_id, job.token, job.scheduler.address_text, 2, 1, 0))
        out.append(job)
    return out


def _run(jobs: List[Job], timeout: float) -> List[float]:
    try:
        for job in jobs:
            job.wait(timeout)
        return [_rate(job) for job in jobs]
    finally:
        for job in jobs:
            job.close()


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--elems", type=int, default=1 << 20)
    p.add_argument("--threads-per-job", type=int, default=2)
    args = p.parse_args(argv)
    timeout = args.seconds + 120
    results: Dict[str, List[float]] = {}
    with tempfile.TemporaryDirectory(prefix="tenants-") as jobs_dir:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPS_")}
        host = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fastps.shared_server",
                "--jobs",
                jobs_dir,
                "--threads-per-job",
                str(args.threads_per_job),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            results["alone"] = _run(_jobs(1, 1, args, jobs_dir), timeout)
            results["shared"] = _run(_jobs(2, 1, args, jobs_dir), timeout)
        finally:
            host.terminate()
            host.wait(30)
    results["own"] = _run(_jobs(2, 1, args, None), timeout)
    mb = args.elems * 4 / 1e6
    print(f"bench_tenants: 2 workers per job, {mb:.1f} MB tensor, {args.seconds:g} s per run")
    print(f"load: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for name, rates in results.items():
        line = f"  {name:7s} " + "  ".join(
            f"job{i}: {r:7.1f} rounds/s" for i, r in enumerate(rates)
        )
        if len(rates) == 2:
            fair = min(rates) / (sum(rates) / 2)
            line += f"  total {sum(rates):7.1f}  fairness {fair:.3f}"
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
