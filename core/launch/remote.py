"""Starting job processes on other machines: through the system ``ssh`` client, or ``srun``
inside a SLURM allocation.

Every remote process is run by the agent in ``remote_agent.py``: the transport starts
``<python> -c <bootstrap>`` on the host, and the bootstrap executes the agent's source that
follows on stdin. The request (command, working directory, the job's variables with its
token) comes next on stdin, so no secret is ever on a command line that ``ps`` shows on
either machine. stdin then stays open: when fastpsrun closes it, or dies, the agent stops the
process group (SIGTERM, SIGKILL after the grace period). Before a job starts,
:func:`preflight` asks every host, in parallel and within a time bound, whether it answers
and imports the same fastps with the same Python; after the job, :func:`sweep` stops any
process of the job still running on a host (found by ``FASTPS_JOB_ID`` in its environment).
"""

from __future__ import annotations

import abc
import json
import os
import shlex
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from fastps.errors import FastPSError
from fastps.launch.hosts import host_label, split_user

__all__ = [
    "SshTransport",
    "SrunTransport",
    "Transport",
    "HostInfo",
    "agent_request",
    "start_agent",
    "preflight",
    "sweep",
    "forwarded_env",
    "BOOTSTRAP",
]

# Reads "<length>\n<agent source>" from stdin and runs it; the agent reads the rest.
BOOTSTRAP = (
    "import sys;b=sys.stdin.buffer;n=int(b.readline());"
    'exec(compile(b.read(n),"fastps-remote-agent","exec"))'
)
_AGENT_SOURCE = (Path(__file__).with_name("remote_agent.py")).read_bytes()

# Variables that describe the machine or session fastpsrun runs in, not the job: the remote
# login sets its own.
_NOT_FORWARDED = frozenset(
    {
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "HOSTNAME",
        "PWD",
        "OLDPWD",
        "SHLVL",
        "_",
        "TERM",
        "DISPLAY",
        "MAIL",
        "TMPDIR",
        "COLUMNS",
        "LINES",
        "PS1",
        "PS2",
        "PROMPT_COMMAND",
        "LS_COLORS",
        "FASTPS_HOST",
        "FASTPS_HOSTNAME",
        "TMUX",
        "TMUX_PANE",
        "STY",
        "WINDOWID",
    }
)
_NOT_FORWARDED_PREFIXES = ("SSH_", "BASH_FUNC_", "XDG_", "SLURM_", "SLURMD_")


def forwarded_env(env: Mapping[str, str]) -> Dict[str, str]:
    """The part of ``env`` a remote process gets, on top of its own login environment
    (Horovod forwards the environment the same way: PATH, PYTHONPATH, virtualenv, ...)."""
    return {
        k: v
        for k, v in env.items()
        if k not in _NOT_FORWARDED and not k.startswith(_NOT_FORWARDED_PREFIXES)
    }


class Transport(abc.ABC):
    """How to run the agent on a named host: ``argv(host)`` is a local command line whose
    stdin and output become the agent's."""

    name = "transport"

    @abc.abstractmethod
    def argv(self, host: str, python: str) -> List[str]:
        """The local command line that starts the agent on ``host``."""

    def describe_failure(self, host: str, rc: int, stderr: str) -> str:
        return f"exited with {rc}: {stderr.strip()[-400:]}"

    def client_env(self) -> Dict[str, str]:
        """The environment of the local client (ssh, srun): ours without the job's secrets."""
        return {k: v for k, v in os.environ.items() if k != "FASTPS_TOKEN"}


@dataclass
class SshTransport(Transport):
    """The system ``ssh`` client: ``-p``/``-i``/``user@host`` as usual; keys only (BatchMode:
    a password prompt would hang the job), host keys checked as the user's ssh config says."""

    port: Optional[int] = None
    identity_file: Optional[str] = None
    connect_timeout: float = 5.0
    ssh: str = "ssh"
    name: str = field(default="ssh", init=False)

    def argv(self, host: str, python: str) -> List[str]:
        user, name = split_user(host)
        if name.startswith("[") and name.endswith("]"):
            name = name[1:-1]
        cmd = [
            self.ssh,
            "-T",
            "-x",
            "-o",
            "BatchMode=yes",
            "-o",
            f"ConnectTimeout={max(1, int(round(self.connect_timeout)))}",
            # A machine that vanishes ends its ssh client within ~15 s: the job fails.
            "-o",
            "ServerAliveInterval=5",
            "-o",
            "ServerAliveCountMax=3",
            "-o",
            "LogLevel=ERROR",
        ]
        if self.port is not None:
            cmd += ["-p", str(self.port)]
        if self.identity_file is not None:
            cmd += ["-i", self.identity_file]
        if user:
            cmd += ["-l", user]
        remote = f"exec {shlex.quote(python)} -c {shlex.quote(BOOTSTRAP)}"
        return cmd + ["--", name, remote]

    def describe_failure(self, host: str, rc: int, stderr: str) -> str:
        text = stderr.strip()
        last = text.splitlines()[-1] if text else ""
        if rc == 255:
            return f"ssh failed: {last or 'exit status 255'}"
        if rc == 127 or "not found" in last or "No such file" in last:
            return f"the Python interpreter is missing there ({last})"
        return f"exited with {rc}: {text[-400:]}"


@dataclass
class SrunTransport(Transport):
    """``srun`` steps inside a SLURM allocation, one task on the named node; steps may share
    the node's CPUs with the other steps of the job (``--overlap``). Each process is a step
    of its own: EOF on its agent's stdin (forwarded by ``--input=all``) ends that step alone,
    ``scancel`` ends them all, and SLURM accounts for them. srun passes its own environment
    to the task, so the token is kept out of it and sent on stdin like ssh."""

    srun: str = "srun"
    # The allocation's job (SLURM_JOB_ID); None: srun takes it from its environment.
    job_id: Optional[str] = None
    name: str = field(default="srun", init=False)

    def argv(self, host: str, python: str) -> List[str]:
        job = [f"--jobid={self.job_id}"] if self.job_id else []
        return [
            self.srun,
            *job,
            "--nodes=1",
            "--ntasks=1",
            f"--nodelist={host_label(host)}",
            "--overlap",
            "--kill-on-bad-exit=1",
            "--input=all",
            "--quiet",
            python,
            "-c",
            BOOTSTRAP,
        ]

    def client_env(self) -> Dict[str, str]:
        # srun hands its environment to the task: an ssh session's SSH_CONNECTION there would
        # be taken for the connection the node sees fastpsrun's machine through.
        env = super().client_env()
        for var in ("SSH_CONNECTION", "SSH_CLIENT"):
            env.pop(var, None)
        return env


def agent_request(spec: Mapping[str, object]) -> bytes:
    """What the agent reads on stdin: its source, then the request line."""
    line = json.dumps(spec).encode("utf-8") + b"\n"
    return f"{len(_AGENT_SOURCE)}\n".encode() + _AGENT_SOURCE + line


def start_agent(
    transport: Transport,
    host: str,
    python: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str,
    grace: float,
) -> subprocess.Popen:
    """Starts ``argv`` on ``host``; stdin stays open (closing it stops the process)."""
    proc = subprocess.Popen(
        transport.argv(host, python),
        env=transport.client_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # Ctrl-C reaches fastpsrun only; it stops the job itself
    )
    assert proc.stdin is not None
    try:
        proc.stdin.write(
            agent_request(
                {"mode": "run", "argv": list(argv), "env": dict(env), "cwd": cwd, "grace": grace}
            )
        )
        proc.stdin.flush()
    except OSError:
        pass  # the client died already: its exit status and output tell why
    return proc


@dataclass
class HostInfo:
    host: str
    hostname: str
    python: str
    fastps: Optional[str]
    fastps_file: Optional[str]
    ssh_connection: str
    cwd_exists: bool

    @property
    def seen_from(self) -> Optional[str]:
        """The address of fastpsrun's machine as this host sees it (from SSH_CONNECTION)."""
        parts = self.ssh_connection.split()
        return parts[0] if len(parts) == 4 else None


def _ask(
    transport: Transport, host: str, python: str, spec: Mapping[str, object], timeout: float
) -> Tuple[Optional[dict], str]:
    """Runs one agent request; returns (its JSON answer, problem) with exactly one set."""
    try:
        proc = subprocess.Popen(
            transport.argv(host, python),
            env=transport.client_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        return None, f"cannot run {transport.name}: {exc}"
    try:
        out, err = proc.communicate(agent_request(spec), timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return None, f"no answer within {timeout:g} s"
    except OSError as exc:
        proc.kill()
        proc.wait()
        return None, f"{transport.name} failed: {exc}"
    text_err = err.decode("utf-8", "replace")
    lines = out.decode("utf-8", "replace").strip().splitlines()
    if proc.returncode != 0 or not lines:
        return None, transport.describe_failure(host, proc.returncode, text_err)
    try:
        return json.loads(lines[-1]), ""
    except ValueError:
        return None, f"unexpected answer: {lines[-1][:200]!r}"


def _parallel(
    hosts: Sequence[str], fn: Callable[[str], Tuple[Optional[dict], str]]
) -> Dict[str, Tuple[Optional[dict], str]]:
    results: Dict[str, Tuple[Optional[dict], str]] = {}
    lock = threading.Lock()

    def one(h: str) -> None:
        res = fn(h)
        with lock:
            results[h] = res

    threads = [threading.Thread(target=one, args=(h,), daemon=True) for h in hosts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _major_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def preflight(
    transport: Transport,
    hosts: Sequence[str],
    python: str,
    env: Mapping[str, str],
    cwd: str,
    timeout: float,
    local_fastps: str,
    local_python: Optional[str] = None,
) -> Dict[str, HostInfo]:
    """Checks every host in parallel; raises one error naming each host that fails."""
    local_python = local_python or ".".join(map(str, sys.version_info[:3]))
    spec = {"mode": "check", "env": dict(env), "cwd": cwd}
    answers = _parallel(hosts, lambda h: _ask(transport, h, python, spec, timeout))
    infos: Dict[str, HostInfo] = {}
    problems: List[str] = []
    for host in hosts:
        ans, problem = answers[host]
        label = host_label(host)
        if ans is None:
            problems.append(f"host {label}: {problem}")
            continue
        if ans.get("error"):
            problems.append(
                f"host {label}: fastps is not usable with {python} there ({ans['error']})"
            )
            continue
        py = str(ans.get("python", "?"))
        if _major_minor(py) != _major_minor(local_python):
            problems.append(f"host {label}: {python} is Python {py}, fastpsrun runs {local_python}")
            continue
        if ans.get("fastps") != local_fastps:
            problems.append(
                f"host {label}: fastps {ans.get('fastps')} "
                f"({ans.get('fastps_file')}), fastpsrun runs {local_fastps}"
            )
            continue
        infos[host] = HostInfo(
            host,
            str(ans.get("hostname", "")),
            py,
            ans.get("fastps"),
            ans.get("fastps_file"),
            str(ans.get("ssh_connection", "")),
            bool(ans.get("cwd_exists", True)),
        )
    if problems:
        raise FastPSError("hosts not ready, nothing started:\n  " + "\n  ".join(problems))
    return infos


def sweep(
    transport: Transport,
    hosts: Sequence[str],
    python: str,
    job_id: str,
    grace: float,
    timeout: float,
) -> Dict[str, str]:
    """Stops what is left of the job on each host; returns {host: problem} for hosts where
    something could not be checked or was still running."""
    spec = {"mode": "sweep", "job_id": job_id, "grace": grace}
    answers = _parallel(hosts, lambda h: _ask(transport, h, python, spec, timeout))
    problems: Dict[str, str] = {}
    for host, (ans, problem) in answers.items():
        if ans is None:
            problems[host] = f"could not check for leftover processes: {problem}"
        elif ans.get("left"):
            problems[host] = f"processes {ans['left']} of the job survived SIGKILL"
        elif ans.get("found"):
            problems[host] = f"stopped leftover processes {ans['found']}"
    return problems
