"""A job on this machine, started and torn down as one unit (the base of every launcher).

The launcher runs the scheduler in a thread, starts ``K`` servers
(``python -m fastps.server``) and ``N`` workers (the user's command), each in its own process
group, and prefixes every line they print with ``[worker 0] `` / ``[server 1] ``.

If any process fails, the others are stopped (SIGTERM to their process groups, SIGKILL after
a grace period) and fastpsrun exits non-zero naming the process. Ctrl-C or SIGTERM stops
everything as well, and no process of the job is left behind. Shared-memory files of the job
(``/dev/shm/fastps-<job id>-*``) are removed on every exit.
"""

from __future__ import annotations

import glob
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import IO, BinaryIO, Dict, List, Optional, Sequence, cast

from fastps.config import Config, validate_job_id
from fastps.control.scheduler import Scheduler
from fastps.errors import FastPSError
from fastps.launch.progress import ProgressLine, load_rich
from fastps.timeline.merge import merge_files
from fastps.timeline.recorder import clear_parts

__all__ = ["Launcher", "describe_exit"]

KILL_GRACE = 5.0  # SIGTERM → SIGKILL
STILL_RUNNING_EVERY = 30.0  # how often to name the workers still running after one finished
POLL = 0.05
SERVER_EXIT_WAIT = 30.0  # how long servers get to leave after every worker finished
SHM_DIR = "/dev/shm"
LINE_LIMIT = 65536  # longer lines are forwarded in pieces

HOROVOD_VARS = (
    "HOROVOD_RANK",
    "HOROVOD_SIZE",
    "HOROVOD_LOCAL_RANK",
    "HOROVOD_LOCAL_SIZE",
    "HOROVOD_CROSS_RANK",
    "HOROVOD_CROSS_SIZE",
)

_out_lock = threading.Lock()
# The --progress status line while it is up: output that shares its terminal goes through it.
_progress: Optional[ProgressLine] = None


def _write(stream: BinaryIO, data: bytes) -> None:
    with _out_lock:
        line = _progress
        if line is not None and (stream is stderr_bytes() or line.routes_stdout):
            line.write(data)
            return
        try:
            stream.write(data)
            stream.flush()
        except (OSError, ValueError):
            pass  # our own output is gone (closed pipe); keep draining the children


def stderr_bytes() -> BinaryIO:
    return cast(BinaryIO, getattr(sys.stderr, "buffer", sys.stderr))


def stdout_bytes() -> BinaryIO:
    return cast(BinaryIO, getattr(sys.stdout, "buffer", sys.stdout))


def say(message: str) -> None:
    """Prints one ``fastpsrun: ...`` line on stderr."""
    _write(stderr_bytes(), f"fastpsrun: {message}\n".encode("utf-8", "replace"))


class PrefixHandler(logging.Handler):
    """Writes log records on stderr, line by line under the output lock."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
        except Exception:
            self.handleError(record)
            return
        lines = "".join(f"{self.prefix}{line}\n" for line in text.splitlines())
        _write(stderr_bytes(), lines.encode("utf-8", "replace"))


def describe_exit(returncode: int) -> str:
    """``exited with code 3`` or ``killed by SIGKILL``."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}"
    return f"exited with code {returncode}"


def _exit_status(returncode: int) -> int:
    """fastpsrun's exit code for a failed child: its code, or 128+signal."""
    if returncode < 0:
        return 128 - returncode
    return returncode or 1


def pump(stream: IO[bytes], prefix: bytes, sink: BinaryIO, copy: Optional[BinaryIO] = None) -> None:
    """Copies ``stream`` to ``sink`` putting ``prefix`` at the start of every line, and, if
    given, unprefixed to ``copy`` (``--output-filename``), which it closes at the end."""
    at_line_start = True
    try:
        while True:
            chunk = stream.readline(LINE_LIMIT)
            if not chunk:
                break
            if copy is not None:
                try:
                    copy.write(chunk)
                    copy.flush()  # a hung job's files must show its last lines
                except (OSError, ValueError):
                    copy = None  # a full disk must not stop the console stream
            if not chunk.endswith(b"\n") and len(chunk) < LINE_LIMIT:
                chunk += b"\n"  # the last line, unterminated: finish it in the same write
            data = (prefix + chunk) if at_line_start else chunk
            at_line_start = chunk.endswith(b"\n")
            _write(sink, data)
        if not at_line_start:
            _write(sink, b"\n")
    except (OSError, ValueError):
        pass
    finally:
        for f in (stream, copy):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass


@dataclass
class Child:
    role: str
    index: int
    proc: subprocess.Popen[bytes]
    readers: List[threading.Thread] = field(default_factory=list)
    reported: bool = False

    @property
    def label(self) -> str:
        return f"{self.role} {self.index}"

    @property
    def pid(self) -> int:
        return self.proc.pid


def _group_alive(pgid: int) -> bool:
    """True while process group ``pgid`` has a member that is not a zombie.

    Zombies count as gone: an orphaned grandchild that already died waits for init to reap
    it, which may take a while and is not ours to wait for.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        entries = os.listdir("/proc")
    except OSError:
        return True
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # After the command name: state, ppid, pgrp, ...
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class Launcher:
    """One local job. :meth:`run` returns fastpsrun's exit code."""

    def __init__(
        self,
        command: Sequence[str],
        num_workers: int,
        num_servers: int = 1,
        timeout: Optional[float] = None,
        job_id: Optional[str] = None,
        partition_bytes: Optional[int] = None,
        host_addr: str = "127.0.0.1",
        env: Optional[Dict[str, str]] = None,
        finish_timeout: Optional[float] = None,
        report_every: float = STILL_RUNNING_EVERY,
        timeline: Optional[str] = None,
        progress: bool = False,
    ) -> None:
        if num_workers < 1:
            raise FastPSError(f"-np must be >= 1, got {num_workers}")
        if num_servers < 0:
            raise FastPSError(f"--num-servers must be >= 0, got {num_servers}")
        if not command:
            raise FastPSError("no command to run")
        self.command = list(command)
        self.num_workers = num_workers
        self.num_servers = num_servers
        self.job_id = validate_job_id(job_id, "--job-id") if job_id else secrets.token_hex(4)
        self.token = secrets.token_hex(16)
        self.host_addr = host_addr
        self.base_env = dict(os.environ if env is None else env)
        self.config = Config.from_env({**self.base_env, "FASTPS_ROLE": "scheduler"})
        self.timeout = self.config.timeout if timeout is None else float(timeout)
        if not self.timeout > 0:
            raise FastPSError(f"--timeout must be > 0, got {timeout}")
        self.partition_bytes = partition_bytes
        if finish_timeout is not None and not finish_timeout > 0:
            raise FastPSError(f"--finish-timeout must be > 0, got {finish_timeout}")
        self.finish_timeout = finish_timeout
        self.report_every = report_every
        # One merged trace for the job: every process writes its share next to it, and
        # fastpsrun merges them when the job ends (docs/guide/timeline.md).
        timeline = timeline or self.config.timeline
        self.timeline = os.path.abspath(timeline) if timeline else None
        self.progress = progress
        if progress:
            load_rich()  # fail before anything starts if it is missing
        self._abort_announced: Optional[str] = None
        self._announce_lock = threading.Lock()
        self.scheduler: Optional[Scheduler] = None
        self.children: List[Child] = []
        self._signal: Optional[int] = None
        self._force = threading.Event()
        self._server_env_path: Optional[str] = None
        self.output_dir: Optional[str] = None
        self.verbose = False

    # --------------------------------------------------------------- signals
    def _signalled(self) -> bool:
        """Whether a signal arrived; set by the handler at any time, so read afresh."""
        return self._signal is not None

    def _on_signal(self, signum: int, _frame: object) -> None:
        if self._signal is None:
            self._signal = signum
        else:
            self._force.set()  # second Ctrl-C: kill without waiting

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._on_signal)

    # ----------------------------------------------------------------- setup
    def _child_env(self, role: str, index: int, sched_addr: str) -> Dict[str, str]:
        env = dict(self.base_env)
        for var in ("FASTPS_RANK", "FASTPS_SERVER_ID", "FASTPS_SERVER_PORT", *HOROVOD_VARS):
            env.pop(var, None)
        env.update(
            FASTPS_ROLE=role,
            FASTPS_SCHEDULER_ADDR=sched_addr,
            FASTPS_JOB_ID=self.job_id,
            FASTPS_TOKEN=self.token,
            FASTPS_NUM_WORKERS=str(self.num_workers),
            FASTPS_NUM_SERVERS=str(self.num_servers),
            FASTPS_HOST=self.host_addr,
            FASTPS_TIMEOUT=f"{self.timeout:g}",
            FASTPS_LAUNCHER="fastpsrun",  # fastpsrun reports an abort's reason: don't repeat it
        )
        if self.partition_bytes is not None:
            env["FASTPS_PARTITION_BYTES"] = str(self.partition_bytes)
        if self.timeline is not None:
            env["FASTPS_TIMELINE"] = self.timeline
        env.setdefault("PYTHONUNBUFFERED", "1")
        if role == "worker":
            env["FASTPS_RANK"] = str(index)
            # Horovod's variables, for scripts that read them: every process of a
            # fastpsrun job runs on this machine (one host: local = global, one cross rank).
            env.update(
                HOROVOD_RANK=str(index),
                HOROVOD_SIZE=str(self.num_workers),
                HOROVOD_LOCAL_RANK=str(index),
                HOROVOD_LOCAL_SIZE=str(self.num_workers),
                HOROVOD_CROSS_RANK="0",
                HOROVOD_CROSS_SIZE="1",
            )
        else:
            env["FASTPS_SERVER_ID"] = str(index)
        return env

    def _spawn(self, role: str, index: int, argv: List[str], sched_addr: str) -> Child:
        proc = subprocess.Popen(
            argv,
            env=self._child_env(role, index, sched_addr),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # own process group: we signal the whole group
        )
        child = Child(role, index, proc)
        self._forward_output(child)
        self.children.append(child)
        return child

    def set_output(self, output_dir: Optional[str] = None, verbose: bool = False) -> None:
        """``--output-filename DIR``: each process's stdout and stderr also go, unprefixed,
        to ``DIR/rank.<i>/`` (workers; Horovod's layout) or ``DIR/server.<i>/``.
        ``--verbose``: name every process as it starts."""
        self.output_dir = os.path.abspath(output_dir) if output_dir else None
        self.verbose = verbose
        if self.output_dir is not None:
            try:
                os.makedirs(self.output_dir, exist_ok=True)
            except OSError as exc:
                raise FastPSError(f"--output-filename {output_dir}: {exc.strerror}") from None

    def _output_copies(self, child: Child) -> List[Optional[BinaryIO]]:
        if self.output_dir is None:
            return [None, None]
        folder = "rank" if child.role == "worker" else child.role
        where = os.path.join(self.output_dir, f"{folder}.{child.index}")
        os.makedirs(where, exist_ok=True)
        return [open(os.path.join(where, name), "wb") for name in ("stdout", "stderr")]

    def _forward_output(self, child: Child) -> None:
        """Starts the threads that prefix ``child``'s lines onto fastpsrun's own streams."""
        proc = child.proc
        if self.verbose:
            args = proc.args
            text = (
                str(args)
                if isinstance(args, (str, bytes, os.PathLike))
                else " ".join(map(str, args))
            )
            say(f"started {child.label} (pid {child.pid}): {text}")
        prefix = f"[{child.label}] ".encode()
        copies = self._output_copies(child)
        for stream, sink, copy in zip(
            (proc.stdout, proc.stderr), (stdout_bytes(), stderr_bytes()), copies
        ):
            assert stream is not None
            t = threading.Thread(
                target=pump,
                args=(stream, prefix, sink, copy),
                name=f"fastpsrun-{child.role}{child.index}",
                daemon=True,
            )
            t.start()
            child.readers.append(t)

    def _start(self) -> None:
        scheduler = Scheduler(
            num_workers=self.num_workers,
            num_servers=self.num_servers,
            job_id=self.job_id,
            token=self.token,
            host=self.host_addr,
            port=0,
            timeout=self.timeout,
            heartbeat_timeout=self.config.heartbeat_timeout,
            auth_timeout=self.config.handshake_timeout,
            elastic_servers=self.config.elastic_servers,
        )
        self.scheduler = scheduler
        scheduler.on_abort = self._announce_abort
        scheduler.start()
        if self.progress:
            global _progress
            line = ProgressLine(scheduler.worker_stats)
            line.start()
            with _out_lock:
                _progress = line
        addr = scheduler.address_text
        if self.config.elastic_servers:
            self._write_server_env(addr)
        for sid in range(self.num_servers):
            self._spawn("server", sid, [sys.executable, "-m", "fastps.server"], addr)
        for rank in range(self.num_workers):
            self._spawn("worker", rank, self.command, addr)

    def _write_server_env(self, addr: str, announce: bool = True) -> None:
        """With elastic servers: the settings a server started by hand needs to join this
        job, in a file only this user can read (it holds the job's token). An elastic job
        rewrites it for each generation (``announce`` only the first time)."""
        env = self._child_env("server", 0, addr)
        keep = ["FASTPS_ROLE", "FASTPS_SCHEDULER_ADDR", "FASTPS_JOB_ID", "FASTPS_TOKEN"]
        keep += ["FASTPS_NUM_WORKERS", "FASTPS_NUM_SERVERS", "FASTPS_TIMEOUT"]
        lines = [f"export {k}={env[k]}" for k in keep]
        lines.append("export FASTPS_ELASTIC_SERVERS=1")
        path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"fastps-{self.job_id}-servers.env")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(lines) + "\n")
        self._server_env_path = path
        if not announce:
            return
        say(
            f"elastic servers: add one with `. {path}; FASTPS_SERVER_ID=<new id> "
            "python -m fastps.server`; remove one by killing its process"
        )

    # ---------------------------------------------------------------- running
    def run(self) -> int:
        if self.timeline is not None:
            clear_parts(self.timeline)
        try:
            try:
                self._start()
            except OSError as exc:
                say(f"cannot start {self.command[0]!r}: {exc}")
                return 127
            return self._monitor()
        finally:
            self._cleanup()
            if self.timeline is not None:
                self._merge_timeline()

    def _merge_timeline(self) -> None:
        assert self.timeline is not None
        try:
            info = merge_files(self.timeline)
        except (OSError, ValueError, KeyError) as exc:
            say(f"could not merge the timeline into {self.timeline}: {exc}")
            return
        if info is None:
            say(f"no process wrote a timeline share for {self.timeline}")
            return
        note = f"timeline: {self.timeline} ({info['processes']} processes, clocks aligned "
        note += f"within {info['max_clock_error_us']:.0f} us"
        if info["dropped_events"]:
            note += f", {info['dropped_events']} events dropped"
        say(note + ")")

    def _first_failure(self, roles: Sequence[str]) -> Optional[Child]:
        for child in self.children:
            if child.role not in roles or child.reported:
                continue
            rc = child.proc.poll()
            if rc is None:
                continue
            child.reported = True
            if rc != 0:
                return child
        return None

    def _announce_abort(self, reason: str) -> bool:
        """Prints the job's root cause, once; True if this call printed it."""
        with self._announce_lock:
            if self._abort_announced is not None:
                return False
            self._abort_announced = reason
        say(f"job aborted: {reason}")
        return True

    def _fail(self, child: Child) -> int:
        rc = child.proc.returncode
        what = f"{child.label} (pid {child.pid}) {describe_exit(rc)}"
        sched = self.scheduler
        announced = self._abort_announced
        if announced is not None:
            # Printed after the root cause; a process the cause does not name is only a
            # consequence of it.
            say(what if f"{child.label} (" in announced else f"{what} after the abort")
        else:
            say(what)
            if sched is not None:
                if sched.abort_reason is not None:
                    self._announce_abort(sched.abort_reason)
                else:
                    sched.abort(what)
        self._terminate_all()
        return _exit_status(rc)

    def _still_running(self, workers: List[Child], first_done: Child, since: float) -> str:
        running = [c for c in workers if c.proc.poll() is None]
        names = ", ".join(f"{c.label} (pid {c.pid})" for c in running)
        return (
            f"{names} still running {time.monotonic() - since:.0f} s after "
            f"{first_done.label} finished"
        )

    def _interrupted(self) -> int:
        signum = self._signal or signal.SIGINT
        name = signal.Signals(signum).name
        say(f"received {name}: stopping the job")
        if self.scheduler is not None:
            self.scheduler.abort(f"fastpsrun received {name}")
        self._terminate_all()
        return 128 + signum

    def _monitor(self) -> int:
        workers = [c for c in self.children if c.role == "worker"]
        servers = [c for c in self.children if c.role == "server"]
        first_done: Optional[Child] = None
        done_at = next_report = 0.0
        while True:
            if self._signalled():
                return self._interrupted()
            # With elastic servers a server's exit is not the job's end: its keys move to
            # the other servers (core/control/server_pool.py); the scheduler aborts if
            # none is left.
            elastic = self.config.elastic_servers
            failed = self._first_failure(("worker",) if elastic else ("worker", "server"))
            if failed is not None:
                return self._fail(failed)
            if elastic:
                gone = self._first_failure(("server",))
                if gone is not None:
                    say(f"{gone.label} (pid {gone.pid}) {describe_exit(gone.proc.returncode)}")
            if all(c.proc.poll() == 0 for c in workers):
                break
            now = time.monotonic()
            if first_done is None:
                first_done = next((c for c in workers if c.proc.poll() == 0), None)
                done_at = now
                next_report = now + self.report_every
            elif self.finish_timeout is not None and now - done_at > self.finish_timeout:
                say(
                    f"{self._still_running(workers, first_done, done_at)}: stopping the job "
                    f"(--finish-timeout {self.finish_timeout:g} s)"
                )
                if self.scheduler is not None:
                    self._abort_announced = "finish timeout"
                    self.scheduler.abort("fastpsrun: --finish-timeout expired")
                self._terminate_all()
                return 1
            elif now >= next_report:
                say(self._still_running(workers, first_done, done_at))
                next_report = now + self.report_every
            time.sleep(POLL)
        # Every worker finished: servers leave once the scheduler tells them to.
        if self.scheduler is not None:
            self.scheduler.request_shutdown()
        deadline = time.monotonic() + min(self.timeout, SERVER_EXIT_WAIT)
        while any(c.proc.poll() is None for c in servers):
            if self._signalled():
                return self._interrupted()
            if time.monotonic() > deadline:
                say(
                    f"servers still running {min(self.timeout, SERVER_EXIT_WAIT):g} s after all "
                    "workers finished: terminating them"
                )
                self._terminate_all()
                return 1
            time.sleep(POLL)
        failed = self._first_failure(("server",))
        if failed is not None:
            return self._fail(failed)
        return 0

    # ---------------------------------------------------------------- teardown
    def _terminate_all(self) -> None:
        """SIGTERM to every child's process group, SIGKILL to what is left after the grace."""
        pgids = [c.pid for c in self.children]
        for pgid in pgids:
            signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + KILL_GRACE
        while time.monotonic() < deadline and not self._force.is_set():
            for c in self.children:
                c.proc.poll()  # reap, so a dead group leader stops counting as alive
            if not any(_group_alive(p) for p in pgids):
                break
            time.sleep(POLL)
        for pgid in pgids:
            if _group_alive(pgid):
                signal_group(pgid, signal.SIGKILL)
        for c in self.children:
            try:
                c.proc.wait(timeout=KILL_GRACE)
            except subprocess.TimeoutExpired:
                say(f"{c.label} (pid {c.pid}) did not exit after SIGKILL")

    def _cleanup(self) -> None:
        # Anything still running, stray grandchildren of finished children included, goes.
        self._terminate_all()
        if self._server_env_path is not None:
            try:
                os.unlink(self._server_env_path)
            except OSError:
                pass
        global _progress
        line = _progress
        if line is not None:
            for c in self.children:  # their last lines go above the status line
                for t in c.readers:
                    t.join(timeout=2.0)
            with _out_lock:
                _progress = None
            line.stop()
        sched = self.scheduler
        if sched is not None:
            # Every process of the job is gone now, so the scheduler has nobody left to serve.
            sched.stop()
            sched.join(timeout=3.0)
        for c in self.children:
            for t in c.readers:
                t.join(timeout=2.0)
        remove_shm(self.job_id)


def remove_shm(job_id: str) -> List[str]:
    """Removes the job's shared-memory files; returns the paths removed."""
    removed = []
    for path in glob.glob(os.path.join(SHM_DIR, f"fastps-{glob.escape(job_id)}-*")):
        try:
            os.unlink(path)
            removed.append(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            say(f"could not remove {path}: {exc}")
    return removed
