"""``horovod.runner.launch``: horovodrun's command line, run by fastpsrun.

Horovod's elastic integration tests build a ``horovodrun`` command line, parse it with
``parse_args()`` and run it in their own process with ``_run_elastic(args)``. Here the same
flags start ``fastpsrun`` (a subprocess) with fastps's names for them:

- ``-np``, ``--min-np``/``--min-num-proc``, ``--max-np``/``--max-num-proc``,
  ``--host-discovery-script``, ``--elastic-timeout``, ``--reset-limit`` and
  ``--blacklist-cooldown-range`` keep their meaning;
- ``-H host:slots,...`` (fixed hosts, elastic because ``--min-np`` is given) becomes a
  discovery script that prints those hosts;
- horovodrun blacklists a failed worker's whole host: ``--blacklist host``;
- ``driver.DISCOVER_HOSTS_FREQUENCY_SECS`` and ``driver.ELASTIC_TIMEOUT_SECS`` (patched by
  the tests) become FASTPS_ELASTIC_DISCOVERY_INTERVAL and the default ``--elastic-timeout``;
- a failed job raises what horovodrun raises: ``RuntimeError`` naming the non-zero exit,
  or the reset-limit message of ``elastic.constants``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import stat
import subprocess
import sys
import tempfile
import threading
from typing import Any, List, Optional

from .elastic import constants, driver

# Bound on one fastpsrun run (the tests' scenarios take seconds; a hang must not last).
RUN_TIMEOUT = float(os.environ.get("HVD_ELASTIC_RUN_TIMEOUT", "300"))


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """horovodrun's flags that elastic jobs use (``sys.argv[1:]`` by default)."""
    p = argparse.ArgumentParser(prog="horovodrun")
    p.add_argument("-np", "--num-proc", dest="num_proc", type=int)
    p.add_argument("--min-np", "--min-num-proc", dest="min_num_proc", type=int)
    p.add_argument("--max-np", "--max-num-proc", dest="max_num_proc", type=int)
    p.add_argument("--slots-per-host", dest="slots", type=int)
    p.add_argument("--elastic-timeout", dest="elastic_timeout", type=int)
    p.add_argument("--reset-limit", dest="reset_limit", type=int)
    p.add_argument("--blacklist-cooldown-range", dest="cooldown_range", type=int, nargs=2)
    p.add_argument("--log-level", dest="log_level")
    p.add_argument("-H", "--hosts", dest="hosts")
    p.add_argument("--host-discovery-script", dest="host_discovery_script")
    p.add_argument("command", nargs=argparse.REMAINDER)
    return p.parse_args(sys.argv[1:] if argv is None else argv)


def _fixed_hosts_script(hosts: str, folder: str) -> str:
    lines = [h.strip() for h in hosts.split(",") if h.strip()]
    if len(lines) < 2:
        raise ValueError("Cannot run in fault tolerance mode with fewer than 2 hosts.")
    path = os.path.join(folder, "hosts.sh")
    with open(path, "w") as f:
        f.write("#!/bin/sh\n" + "".join(f"echo {shlex.quote(h)}\n" for h in lines))
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path


def fastpsrun_command(args: argparse.Namespace, script: str) -> List[str]:
    cmd = [sys.executable, "-m", "fastps.launcher"]
    if args.num_proc is not None:
        cmd += ["-np", str(args.num_proc)]
    min_np = args.min_num_proc or args.num_proc
    if min_np is not None:
        cmd += ["--min-np", str(min_np)]
    if args.max_num_proc is not None:
        cmd += ["--max-np", str(args.max_num_proc)]
    timeout = args.elastic_timeout or driver.ELASTIC_TIMEOUT_SECS
    cmd += ["--host-discovery-script", script, "--elastic-timeout", str(timeout)]
    cmd += ["--blacklist", "host"]
    if args.reset_limit is not None:
        cmd += ["--reset-limit", str(args.reset_limit)]
    if args.cooldown_range:
        cmd += ["--blacklist-cooldown-range", *(str(x) for x in args.cooldown_range)]
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if command and command[0] in ("python", "python3"):
        command[0] = sys.executable  # the interpreter that has fastps
    return cmd + command


def _run_elastic(args: argparse.Namespace) -> None:
    if not args.command:
        raise ValueError("horovodrun: no command to run")
    with tempfile.TemporaryDirectory(prefix="hvd-fastpsrun-") as folder:
        if args.host_discovery_script:
            script = args.host_discovery_script
        elif args.hosts:
            script = _fixed_hosts_script(args.hosts, folder)
        else:
            raise ValueError("One of --host-discovery-script, --hosts must be provided")
        cmd = fastpsrun_command(args, script)
        env = dict(os.environ)
        env["FASTPS_ELASTIC_DISCOVERY_INTERVAL"] = str(driver.DISCOVER_HOSTS_FREQUENCY_SECS)
        rc, stderr = _run_fastpsrun(cmd, env)
    if rc == 0:
        return
    if "--reset-limit" in stderr and "resets exceeded" in stderr:
        raise RuntimeError(constants.RESET_LIMIT_EXCEEDED_MESSAGE.format(args.reset_limit))
    last = [line for line in stderr.splitlines() if line.strip()][-3:]
    raise RuntimeError(
        "Horovod detected that one or more processes exited with non-zero status, thus "
        f"causing the job to be terminated (fastpsrun exit {rc}: {' | '.join(last)})"
    )


def _run_fastpsrun(cmd: List[str], env: Any) -> tuple[int, str]:
    """Runs fastpsrun (bounded), echoing its stderr while keeping a copy."""
    print("fastpsrun:", " ".join(shlex.quote(c) for c in cmd), flush=True)
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines: List[str] = []

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            sys.stderr.write(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        reader.join(timeout=5)
        raise RuntimeError(f"fastpsrun ran longer than {RUN_TIMEOUT:g} s: {cmd}") from None
    reader.join(timeout=5)
    return rc, "".join(lines)


def _run(args: Any) -> None:
    """horovodrun's entry with parsed arguments (``horovod.runner._HorovodArgs``): elastic
    when a minimum or a discovery script is given, as horovodrun decides."""
    if args.min_num_proc is not None or args.host_discovery_script:
        _run_elastic(args)
        return
    cmd = [sys.executable, "-m", "fastps.launcher", "-np", str(args.num_proc)]
    if args.hosts:
        cmd += ["-H", args.hosts]
    rc, stderr = _run_fastpsrun(cmd + list(args.command), dict(os.environ))
    if rc != 0:
        raise RuntimeError(f"fastpsrun exit {rc}: {stderr.strip()[-300:]}")
