"""A long-running multi-tenant server host: ``python -m fastps.shared_server --jobs DIR``.

PHub's boxes serve many jobs at once. Here one long-running process per server machine
admits jobs while it runs and serves each with its own summation server, so jobs join and
leave without restarting anything:

* **Admission**: a job is admitted by writing ``DIR/<job id>.job`` (``admit()``; JSON with
  the job id, its token, its scheduler's address, its worker and server counts, this
  host's server id in the job, an optional memory quota). The file holds the token, so it
  must be readable by its owner only (mode 0600), or it is rejected. The host answers in
  ``DIR/<job id>.state``: ``serving``, then ``done`` / ``failed`` / ``rejected`` with why.
* **Isolation**: each job's server is a child process of its own (its own address space:
  no job can read another's sums) on its own port, and its data connections authenticate
  with the job's own id and token (the HMAC challenge of csrc/transport/handshake.h): a
  worker of another job — a wrong token, or the right token with another job id — is
  turned away at the handshake. Two live jobs with one job id are refused.
* **Per-job memory quota**: the child's data segment is capped (RLIMIT_DATA); a job that
  pushes more than its quota fails alone, and the state file says it hit its quota. The
  other jobs' servers are other processes and keep serving.
* **Fair sharing**: every job's server gets the same number of engine and I/O threads and
  the same scheduling priority, so the kernel divides the cores between jobs evenly when
  they compete, and each job's connections count alike on the NIC.

The host runs until SIGTERM/SIGINT, which stops every job's server.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import resource
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from fastps.config import default_advertised_host, stated_host

__all__ = ["JobSpec", "SharedServerHost", "admit", "main", "read_state"]

log = logging.getLogger("fastps.shared_server")

POLL = 0.2  # how often the jobs folder is scanned
_OUT_OF_MEMORY = (
    "bad_alloc",
    "MemoryError",
    "Cannot allocate memory",
    "Resource temporarily unavailable",
)
_JOB_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


@dataclass(frozen=True)
class JobSpec:
    """What a job hands the shared host: enough to start and register its server."""

    job_id: str
    token: str
    scheduler_addr: str
    num_workers: int
    num_servers: int
    server_id: int
    quota_mb: float = 0.0  # 0: the host's default

    @staticmethod
    def parse(text: str, source: str) -> JobSpec:
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{source}: not JSON ({exc})") from None
        if not isinstance(raw, dict):
            raise ValueError(f"{source}: expected a JSON object")
        missing = [k for k in ("job_id", "token", "scheduler_addr", "num_workers") if k not in raw]
        if missing:
            raise ValueError(f"{source}: missing {', '.join(missing)}")
        spec = JobSpec(
            job_id=str(raw["job_id"]),
            token=str(raw["token"]),
            scheduler_addr=str(raw["scheduler_addr"]),
            num_workers=int(raw["num_workers"]),
            num_servers=int(raw.get("num_servers", 1)),
            server_id=int(raw.get("server_id", 0)),
            quota_mb=float(raw.get("quota_mb", 0.0)),
        )
        if not _JOB_ID.match(spec.job_id):
            raise ValueError(f"{source}: job id {spec.job_id!r} is not [A-Za-z0-9_.-]{{1,64}}")
        if len(spec.token) < 16:
            raise ValueError(f"{source}: job {spec.job_id}: token shorter than 16 characters")
        if spec.num_workers < 1 or spec.num_servers < 1:
            raise ValueError(f"{source}: job {spec.job_id}: worker and server counts must be >= 1")
        if not 0 <= spec.server_id < spec.num_servers:
            raise ValueError(
                f"{source}: job {spec.job_id}: server_id {spec.server_id} outside "
                f"0..{spec.num_servers - 1}"
            )
        if spec.quota_mb < 0:
            raise ValueError(f"{source}: job {spec.job_id}: negative quota_mb {spec.quota_mb}")
        return spec


def admit(jobs_dir: str, spec: JobSpec) -> Path:
    """Hands ``spec`` to the shared host watching ``jobs_dir`` (atomically, mode 0600)."""
    folder = Path(jobs_dir)
    body = json.dumps(spec.__dict__, sort_keys=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{spec.job_id}.", dir=folder)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, body.encode())
    finally:
        os.close(fd)
    path = folder / f"{spec.job_id}.job"
    os.replace(tmp, path)
    return path


def read_state(jobs_dir: str, job_id: str) -> Optional[Dict[str, Any]]:
    """The host's answer for ``job_id`` (None before it has one)."""
    try:
        return json.loads((Path(jobs_dir) / f"{job_id}.state").read_text())
    except (OSError, ValueError):
        return None


@dataclass
class _Tenant:
    spec: JobSpec
    proc: subprocess.Popen
    quota_bytes: int
    started: float = field(default_factory=time.monotonic)
    tail: List[str] = field(default_factory=list)


class SharedServerHost:
    """Watches ``jobs_dir`` and runs one server child per admitted job."""

    def __init__(
        self,
        jobs_dir: str,
        host: str = "127.0.0.1",
        default_quota_mb: float = 1024.0,
        threads_per_job: int = 2,
        python: str = sys.executable,
    ) -> None:
        self.dir = Path(jobs_dir)
        if not self.dir.is_dir():
            raise ValueError(f"--jobs {jobs_dir}: not a folder")
        self.host = host
        self.default_quota_mb = default_quota_mb
        self.threads = threads_per_job
        self.python = python
        self.tenants: Dict[str, _Tenant] = {}
        self._stop = threading.Event()
        self._signalled = False

    # ---------------------------------------------------------------- one scan

    def scan(self) -> None:
        """Admits new job files and settles the jobs whose server exited."""
        for path in sorted(self.dir.glob("*.job")):
            job_id = path.name[: -len(".job")]
            if job_id in self.tenants:
                continue
            self._admit(path, job_id)
        for job_id, t in list(self.tenants.items()):
            code = t.proc.poll()
            if code is not None:
                self._settle(job_id, t, code)

    def _admit(self, path: Path, job_id: str) -> None:
        try:
            st = path.stat()
            if stat.S_IMODE(st.st_mode) & 0o077:
                raise ValueError(
                    f"{path.name}: readable by others (mode {oct(stat.S_IMODE(st.st_mode))}); "
                    "job files hold the token and must be 0600"
                )
            spec = JobSpec.parse(path.read_text(), path.name)
            if spec.job_id != job_id:
                raise ValueError(f"{path.name}: names job {spec.job_id!r}, not {job_id!r}")
        except (OSError, ValueError) as exc:
            self._answer(job_id, "rejected", str(exc))
            _unlink(path)
            log.warning("rejected %s", exc)
            return
        quota_mb = spec.quota_mb or self.default_quota_mb
        # The host's own FASTPS_* settings are not the job's, except the machine's name.
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("FASTPS_") or k == "FASTPS_HOSTNAME"
        }
        env.update(
            {
                "FASTPS_ROLE": "server",
                "FASTPS_JOB_ID": spec.job_id,
                "FASTPS_TOKEN": spec.token,
                "FASTPS_SCHEDULER_ADDR": spec.scheduler_addr,
                "FASTPS_NUM_WORKERS": str(spec.num_workers),
                "FASTPS_NUM_SERVERS": str(spec.num_servers),
                "FASTPS_SERVER_ID": str(spec.server_id),
                "FASTPS_HOST": self.host,
                "FASTPS_ENGINE_THREADS": str(self.threads),
                "FASTPS_IO_THREADS": str(self.threads),
                # Few malloc arenas: the quota then measures buffers, not reserved arenas.
                "MALLOC_ARENA_MAX": "2",
            }
        )
        quota = int(quota_mb * 1024 * 1024)

        def limit() -> None:  # in the child, before exec
            os.setsid()
            resource.setrlimit(resource.RLIMIT_DATA, (quota, quota))

        proc = subprocess.Popen(
            [self.python, "-m", "fastps.server"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=limit,  # noqa: PLW1509 - setrlimit must run in the child
        )
        tenant = _Tenant(spec, proc, quota)
        threading.Thread(target=_collect, args=(tenant,), daemon=True).start()
        self.tenants[job_id] = tenant
        self._answer(job_id, "serving", f"server pid {proc.pid}, quota {quota_mb:g} MiB")
        log.info("job %s: serving (server %d, quota %g MiB)", job_id, spec.server_id, quota_mb)

    def _settle(self, job_id: str, t: _Tenant, code: int) -> None:
        del self.tenants[job_id]
        out = "".join(t.tail)
        if code == 0:
            self._answer(job_id, "done", "the job finished")
        else:
            # Out of its data segment: malloc fails (bad_alloc, MemoryError, ENOMEM), or a
            # thread's stack cannot be mapped (EAGAIN from pthread_create).
            over = any(s in out for s in _OUT_OF_MEMORY)
            why = (
                f"the job's server exceeded its memory quota of {t.quota_bytes >> 20} MiB"
                if over or code == -signal.SIGABRT
                else f"the job's server exited with code {code}"
            )
            lines = [line for line in out.splitlines() if line.strip()][-3:]
            self._answer(job_id, "failed", why + (": " + " | ".join(lines) if lines else ""))
            log.warning("job %s: %s", job_id, why)
        _unlink(self.dir / f"{job_id}.job")

    def _answer(self, job_id: str, state: str, why: str) -> None:
        body = json.dumps({"job_id": job_id, "state": state, "why": why, "t": time.time()})
        tmp = self.dir / f".{job_id}.state.tmp"
        tmp.write_text(body)
        os.replace(tmp, self.dir / f"{job_id}.state")

    # ---------------------------------------------------------------- lifetime

    def serve(self) -> None:
        while not self._stop.is_set() and not self._signalled:
            self.scan()
            self._stop.wait(POLL)
        self.close()

    def stop(self) -> None:
        self._stop.set()

    def on_signal(self, _signum: int, _frame: object) -> None:
        """A signal handler's stop: only a flag (serve polls every POLL seconds). The
        handler runs in the main thread, possibly inside serve's _stop.wait() holding the
        Event's lock, where _stop.set() would wait forever."""
        self._signalled = True

    def close(self) -> None:
        for t in self.tenants.values():
            if t.proc.poll() is None:
                t.proc.terminate()
        deadline = time.monotonic() + 10
        for t in self.tenants.values():
            try:
                t.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                t.proc.kill()
                t.proc.wait(5)


def _collect(t: _Tenant) -> None:
    """Keeps the last lines of a job server's output (for the failure reason)."""
    assert t.proc.stdout is not None
    for line in t.proc.stdout:
        t.tail.append(line)
        del t.tail[:-40]
        sys.stderr.write(f"[{t.spec.job_id}] {line}")


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fastps.shared_server", description=__doc__)
    p.add_argument("--jobs", required=True, help="folder where jobs are admitted")
    p.add_argument("--host", default=stated_host() or default_advertised_host(None))
    p.add_argument("--quota-mb", type=float, default=1024.0, help="default per-job quota")
    p.add_argument("--threads-per-job", type=int, default=2)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="fastps shared server: %(message)s")
    try:
        host = SharedServerHost(args.jobs, args.host, args.quota_mb, args.threads_per_job)
    except ValueError as exc:
        print(f"fastps shared server: {exc}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, host.on_signal)
    signal.signal(signal.SIGINT, host.on_signal)
    log.info("watching %s", args.jobs)
    host.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
