"""Two jobs sharing one server host on the emulated rack: fairness on a shared NIC.

Rack: 4 worker hosts and 1 CPU host c0 at ``--rate`` Mbit/s. ``python -m
fastps.shared_server`` runs on c0 for the whole benchmark; job A's 2 workers run on w0/w1,
job B's on w2/w3, each job with its scheduler on its first worker host and c0's shared host
as its one server. Every job push_pulls a ``--elems`` float32 tensor in a loop for
``--seconds`` (tests/workers/tenant_worker.py, every sum checked), so c0's link carries
both jobs' pushes and answers. Scenarios: A alone, then A and B together.

Reported: rounds/s of each job, Gbit/s it moved through c0, and the fairness
min(a, b) / ((a + b) / 2) of the pair.

    python -m benchmarks.tenants_rack --seconds 20

Needs root (network namespaces).
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastps.control.shared_server import JobSpec, admit  # noqa: E402

from benchmarks import rack_common as rc  # noqa: E402

TENANT = str(rc.REPO / "tests" / "workers" / "tenant_worker.py")


def _start_job(rack, tag: int, hosts: List[str], jobs_dir: str, port: int, args) -> List:
    first = rack.host(hosts[0])
    job_id, token = f"tenant{tag}-{port}", secrets.token_hex(16)
    env = {
        "FASTPS_SCHEDULER_ADDR": f"{first.addr}:{port}",
        "FASTPS_JOB_ID": job_id,
        "FASTPS_TOKEN": token,
        "FASTPS_NUM_WORKERS": str(len(hosts)),
        "FASTPS_NUM_SERVERS": "1",
        "FASTPS_TIMEOUT": "120",
        "FASTPS_LOG_LEVEL": "WARNING",
        **rc.QUIET_THREADS,
    }
    py = sys.executable
    procs = [
        rack.spawn(
            hosts[0],
            [py, "-m", "fastps.scheduler"],
            env={**env, "FASTPS_ROLE": "scheduler"},
            cwd=str(rc.REPO),
            label=f"{job_id}-sched",
        )
    ]
    admit(jobs_dir, JobSpec(job_id, token, env["FASTPS_SCHEDULER_ADDR"], len(hosts), 1, 0))
    for rank, h in enumerate(hosts):
        procs.append(
            rack.spawn(
                h,
                [py, TENANT, str(tag), str(args.elems), str(args.seconds)],
                env={**env, "FASTPS_ROLE": "worker", "FASTPS_RANK": str(rank)},
                cwd=str(rc.REPO),
                label=f"{job_id}-w{rank}",
            )
        )
    return procs


def _rates(rack, labels: Dict[int, str]) -> Dict[int, float]:
    text = "\n".join(rack.logs().values())
    out: Dict[int, float] = {}
    for tag, prefix in labels.items():
        found = re.findall(
            rf"\[[^\]]*/{re.escape(prefix)}-w\d\] TENANT-ROUNDS (\d+) ([\d.]+)", text
        )
        if len(found) < 2:
            raise RuntimeError(f"job {prefix}: no result\n{text[-3000:]}")
        out[tag] = min(int(n) / float(s) for n, s in found)
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    from benchmarks.rack import Rack, is_supported

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--elems", type=int, default=1 << 20)
    p.add_argument("--rate", type=float, default=1000.0)
    p.add_argument("--prefix", default="fpten")
    p.add_argument("--base-port", type=int, default=29600)
    args = p.parse_args(argv)
    ok, why = is_supported()
    if not ok:
        print(f"tenants_rack: emulated rack not supported here: {why}", file=sys.stderr)
        return 2
    mb = args.elems * 4 / 1e6
    port = args.base_port
    with (
        tempfile.TemporaryDirectory(prefix="tenants-") as jobs_dir,
        Rack(n_workers=4, n_cpu_hosts=1, rate_mbit=args.rate, prefix=args.prefix) as rack,
    ):
        os.chmod(jobs_dir, 0o700)
        c0 = rack.host("c0")
        rack.spawn(
            "c0",
            [sys.executable, "-m", "fastps.shared_server", "--jobs", jobs_dir, "--host", c0.addr],
            cwd=str(rc.REPO),
            label="shared-host",
        )
        results = {}
        for scenario, tags in (("alone", [1]), ("shared", [1, 2])):
            procs, labels = [], {}
            for tag in tags:
                port += 2
                hosts = ["w0", "w1"] if tag == 1 else ["w2", "w3"]
                procs += _start_job(rack, tag, hosts, jobs_dir, port, args)
                labels[tag] = f"tenant{tag}-{port}"
            rack.run_all(procs, timeout=args.seconds + 180)
            results[scenario] = _rates(rack, labels)
    print(f"tenants_rack: 2 workers per job, {mb:.1f} MB tensor, c0 at {args.rate:g} Mbit/s")
    for scenario, rates in results.items():
        # Each round moves the tensor up and down once per worker through c0.
        line = f"  {scenario:7s} " + "  ".join(
            f"job{t}: {r:6.2f} rounds/s ({r * 2 * 2 * mb * 8 / 1000:.2f} Gbit/s in+out of c0)"
            for t, r in rates.items()
        )
        if len(rates) == 2:
            a, b = rates.values()
            line += f"  fairness {min(a, b) / ((a + b) / 2):.3f}"
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
