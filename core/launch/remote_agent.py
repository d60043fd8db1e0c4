"""The agent fastpsrun runs on another machine (over ssh or srun) to start one job process.

It is sent as source on the agent's stdin (``python -c`` reads a length line, then this file,
and executes it), so it needs nothing installed on the remote machine but Python, and uses
the standard library only. After the source comes one JSON line, the request; then stdin
stays open for as long as the process should live:

* ``{"mode": "run", "argv", "env", "cwd", "grace"}``: starts ``argv`` in its own process
  group with the remote login environment updated by ``env`` (the job's variables, the token
  among them: they travel on stdin, never on a command line) and its output on the agent's.
  When stdin reaches EOF (fastpsrun closed it, or its ssh/srun client died) or the agent gets
  SIGTERM/SIGHUP/SIGINT, the process group gets SIGTERM, then SIGKILL after ``grace``
  seconds. When the process exits on its own, what is left of its group goes the same way.
  The agent exits with the process's code, or 128 + the signal that killed it.
* ``{"mode": "check", "env", "cwd"}``: prints one JSON line describing this machine (host
  name, Python, fastps as the job's environment imports it, the ssh connection) and exits.
* ``{"mode": "sweep", "job_id", "grace"}``: stops every process of this user whose
  environment has ``FASTPS_JOB_ID=<job_id>`` (strays that left their process group), SIGTERM
  then SIGKILL, and prints one JSON line with what it found.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

POLL = 0.05

# Run with the job's environment: what would `import fastps` give the job's processes?
_CHECK = r"""
import json, sys
out = {"python": "%d.%d.%d" % sys.version_info[:3], "executable": sys.executable}
try:
    import fastps
    out["fastps"] = getattr(fastps, "__version__", None)
    out["fastps_file"] = getattr(fastps, "__file__", None)
    from fastps import _core  # noqa: F401  (the compiled core must load too)
except Exception as exc:
    out["error"] = "%s: %s" % (type(exc).__name__, exc)
print(json.dumps(out))
"""


def _emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _group_alive(pgid):
    """True while process group pgid has a member that is not a zombie."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


def _stop_group(proc, grace):
    """SIGTERM to proc's group, SIGKILL after grace seconds; reaps proc."""
    pgid = proc.pid
    try:
        os.killpg(pgid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        proc.poll()
        if not _group_alive(pgid):
            break
        time.sleep(POLL)
    if _group_alive(pgid):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        proc.wait(timeout=max(grace, 5.0))
    except subprocess.TimeoutExpired:
        pass


def _copy(src, dst):
    try:
        while True:
            data = os.read(src, 65536)
            if not data:
                return
            while data:
                data = data[os.write(dst, data) :]
    except OSError:
        pass


def _job_env(spec):
    env = dict(os.environ)
    env.update(spec.get("env") or {})
    return env


def _chdir(spec):
    cwd = spec.get("cwd")
    if not cwd:
        return True
    try:
        os.chdir(cwd)
        return True
    except OSError:
        return False


def _run(spec, stdin):
    stop = threading.Event()
    signalled = []

    def on_signal(signum, _frame):
        # Only a list append: the handler runs in the main thread, possibly inside
        # stop.wait() holding the Event's lock, where stop.set() would wait forever.
        signalled.append(signum)

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, on_signal)

    def watch_stdin():
        # The raw descriptor, not the buffered reader: a thread blocked inside the reader
        # holds its lock and makes interpreter shutdown abort. Nothing is buffered beyond
        # the request line, which is the last thing fastpsrun sends.
        fd = stdin.fileno()
        try:
            while os.read(fd, 65536):
                pass
        except OSError:
            pass
        stop.set()

    if not _chdir(spec):
        sys.stderr.write(
            "fastps agent on {}: working directory {} does not exist here; starting in {}\n".format(
                socket.gethostname(), spec["cwd"], os.getcwd()
            )
        )
    try:
        # Output goes through pipes the agent copies: a stray the process leaves behind
        # may hold them open, but not the ssh session, which then ends with the agent.
        proc = subprocess.Popen(
            spec["argv"],
            env=_job_env(spec),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        sys.stderr.write(
            f"fastps agent on {socket.gethostname()}: cannot start {spec['argv'][0]!r}: {exc}\n"
        )
        return 127
    threading.Thread(target=watch_stdin, daemon=True).start()
    assert proc.stdout is not None and proc.stderr is not None  # both are pipes
    copiers = [
        threading.Thread(target=_copy, args=(proc.stdout.fileno(), 1), daemon=True),
        threading.Thread(target=_copy, args=(proc.stderr.fileno(), 2), daemon=True),
    ]
    for t in copiers:
        t.start()
    grace = float(spec.get("grace", 5.0))
    while proc.poll() is None and not stop.is_set() and not signalled:
        stop.wait(POLL)
    _stop_group(proc, grace)  # stops the process, or the strays it left in its group
    deadline = time.monotonic() + 1.0  # the last output; a stray may keep the pipes open
    for t in copiers:
        t.join(max(0.0, deadline - time.monotonic()))
    rc = proc.returncode
    if rc is None:
        return 128 + signal.SIGKILL
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        if not stop.is_set() and not signalled:
            sys.stderr.write(f"fastps agent on {socket.gethostname()}: process killed by {name}\n")
        return 128 - rc
    return rc


def _check(spec):
    out = {
        "hostname": socket.gethostname(),
        "agent_python": ".".join(map(str, sys.version_info[:3])),
        "ssh_connection": os.environ.get("SSH_CONNECTION", ""),
        "cwd_exists": _chdir(spec),
    }
    try:
        res = subprocess.run(
            [sys.executable, "-c", _CHECK], env=_job_env(spec), capture_output=True, timeout=60
        )
        lines = res.stdout.decode("utf-8", "replace").strip().splitlines()
        if lines:
            out.update(json.loads(lines[-1]))
        else:
            tail = res.stderr.decode("utf-8", "replace")[-500:]
            out["error"] = f"{sys.executable} -c exited with {res.returncode}: {tail}"
    except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    _emit(out)
    return 0


def _job_pids(job_id):
    mark = (f"FASTPS_JOB_ID={job_id}").encode()
    me = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                if mark not in fh.read().split(b"\0"):
                    continue
            with open(f"/proc/{name}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in (b"Z", b"X"):
            found.append(int(name))
    return found


def _sweep(spec):
    job_id = spec["job_id"]
    grace = float(spec.get("grace", 5.0))
    first = _job_pids(job_id)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = _job_pids(job_id)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 5.0)
        while _job_pids(job_id) and time.monotonic() < deadline:
            time.sleep(POLL)
    _emit({"hostname": socket.gethostname(), "found": first, "left": _job_pids(job_id)})
    return 0


def main():
    stdin = sys.stdin.buffer
    line = stdin.readline()
    if not line:
        return 2
    spec = json.loads(line.decode("utf-8"))
    mode = spec.get("mode")
    if mode == "run":
        return _run(spec, stdin)
    if mode == "check":
        return _check(spec)
    if mode == "sweep":
        return _sweep(spec)
    sys.stderr.write(f"fastps agent: unknown mode {mode!r}\n")
    return 2


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter shutdown with the stdin watcher still blocked
