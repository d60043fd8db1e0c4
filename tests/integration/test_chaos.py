"""Chaos: a random worker or server is killed (SIGKILL) or stopped (SIGSTOP) at a random
moment of a running job. Every survivor must name it within the heartbeat timeout, no sum
may be wrong, and nothing may be left in /dev/shm. FASTPS_CHAOS_ROUNDS sets how many rounds
(default 4); FASTPS_CHAOS_SEED replays one."""

from __future__ import annotations

import glob
import os
import random
import re
import signal
import time

from jobs import WORKERS, Job

CHAOS_WORKER = os.path.join(WORKERS, "chaos_worker.py")
ROUNDS = int(os.environ.get("FASTPS_CHAOS_ROUNDS", "4"))
SEED = int(os.environ.get("FASTPS_CHAOS_SEED", str(random.randrange(1 << 30))))
HEARTBEAT_TIMEOUT = 3.0


def _round(rng: random.Random) -> None:
    workers, servers = rng.choice([(2, 1), (3, 2), (4, 1)])
    # Some jobs on one host (shared memory, local reduce), some on emulated separate hosts.
    hosts = None if rng.random() < 0.5 else [f"h{r % 2}" for r in range(workers)]
    with Job(
        workers,
        servers,
        [CHAOS_WORKER],
        heartbeat_timeout=HEARTBEAT_TIMEOUT,
        worker_hosts=hosts,
        server_hosts=hosts and [f"h{s % 2}" for s in range(servers)],
    ) as job:
        deadline = time.monotonic() + 60
        while not all("READY" in w.output for w in job.workers()):
            assert time.monotonic() < deadline, job.dump()
            time.sleep(0.05)
        time.sleep(rng.uniform(0, 1.5))
        victim = rng.choice(job.procs)
        sig = rng.choice([signal.SIGKILL, signal.SIGSTOP])
        what = f"{victim.role} {victim.index} {sig.name} (seed {SEED})"
        os.kill(victim.popen.pid, sig)
        hit = time.monotonic()
        survivors = [p for p in job.procs if p is not victim]
        job.wait(HEARTBEAT_TIMEOUT + 30, survivors)
        for p in survivors:
            assert "WRONG-SUM" not in p.output, (what, job.dump())
            assert p.popen.returncode not in (0, -6, -11), (what, job.dump())
            assert re.search(rf"\b{victim.role} {victim.index}\b", p.output), (what, job.dump())
            assert p.exited_at is not None
            assert p.exited_at - hit < HEARTBEAT_TIMEOUT + 3, (what, p.exited_at - hit, job.dump())
        latest = max(p.exited_at for p in survivors if p.exited_at is not None) - hit
        print(
            f"{workers} workers, {servers} servers, {'2 hosts' if hosts else '1 host'}: "
            f"{what}: every survivor out {latest:.2f} s later"
        )
        if sig == signal.SIGSTOP:
            os.kill(victim.popen.pid, signal.SIGKILL)
    assert not glob.glob(f"/dev/shm/fastps-{job.job_id}-*"), what


def test_chaos_kill_or_stop_random_processes() -> None:
    rng = random.Random(SEED)
    print(f"chaos seed {SEED}")
    for _ in range(ROUNDS):
        _round(rng)
