"""Job processes on other machines, for the launchers that start some there.

``fastpsrun -H`` (``cluster.py``) and elastic jobs whose hosts are other machines
(``elastic_driver.py``) start a process on a remote host the same way: through a transport
(``remote.SshTransport`` or ``SrunTransport``) and the agent, which runs the process in its
own group and stops that group when its stdin closes. :class:`RemoteSpawner` holds what
they share: the check of a host before anything starts there (``remote.preflight``), the
address the remote processes reach this machine at, starting a process, hanging up on one
(EOF on the agent's stdin), and the sweep of every host used when the job ends.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence

from fastps.config import default_advertised_host
from fastps.control.netif import interface_address
from fastps.launch.hosts import host_label
from fastps.launch.job import KILL_GRACE, Child, say
from fastps.launch.remote import (
    HostInfo,
    Transport,
    forwarded_env,
    preflight,
    start_agent,
    sweep,
)
from fastps.version import __version__

__all__ = ["HostChild", "RemoteSpawner", "PREFLIGHT_SLACK"]

PREFLIGHT_SLACK = 30.0  # seconds beyond the connect timeout for a host to answer its check


@dataclass
class HostChild(Child):
    """A job process with the host it runs on; ``remote``: started through the agent (its
    ``proc`` is the local ssh/srun client, its stdin the agent's)."""

    host: str = ""
    remote: bool = False

    @property
    def label(self) -> str:
        return f"{self.role} {self.index}@{self.host}"


class RemoteSpawner:
    """Starts processes on remote hosts through ``transport`` and cleans up after them."""

    def __init__(
        self,
        transport: Transport,
        python: Optional[str] = None,
        connect_timeout: float = 5.0,
        interface: Optional[str] = None,
    ) -> None:
        self.transport = transport
        self.python = python or sys.executable
        self.connect_timeout = connect_timeout
        self.interface = interface  # --network-interface (or FASTPS_IFACE)
        self.started: List[str] = []  # hosts a process was started on, in order
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ before
    def check(self, hosts: Sequence[str], env: Mapping[str, str]) -> Dict[str, HostInfo]:
        """Asks every host in parallel, bounded in time, whether it answers and imports the
        same fastps with the same Python; raises one error naming each host that fails.
        ``env`` is a job process's environment (its token is not sent)."""
        sent = forwarded_env(env)
        sent.pop("FASTPS_TOKEN", None)  # a check needs no secret
        infos = preflight(
            self.transport,
            hosts,
            self.python,
            sent,
            os.getcwd(),
            self.connect_timeout + PREFLIGHT_SLACK,
            local_fastps=__version__,
        )
        for host, info in infos.items():
            if not info.cwd_exists:
                say(
                    f"host {host_label(host)} has no directory {os.getcwd()}: its processes "
                    "start in the login directory"
                )
        return infos

    def advertised_address(
        self, infos: Mapping[str, HostInfo], remote_hosts: Sequence[str], fallback: str
    ) -> str:
        """The address the remote hosts reach this machine at: ``--network-interface``'s,
        else the one their ssh connections came from, else the route to the first of them;
        ``fallback`` when there is no remote host."""
        if self.interface:
            return interface_address(self.interface, "--network-interface")
        if not remote_hosts:
            return fallback
        for host in remote_hosts:
            info = infos.get(host)
            seen = info.seen_from if info is not None else None
            if seen:
                return seen  # the address this machine's ssh connections leave from
        return default_advertised_host(host_label(remote_hosts[0]))

    # ------------------------------------------------------------------ during
    def start(self, host: str, argv: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen:
        """Starts ``argv`` on ``host`` with the job's variables of ``env`` (the remote login
        keeps its own machine's: FASTPS_HOST, HOME, ...). The process advertises its own
        machine's address (FASTPS_IFACE, or the route to the scheduler)."""
        proc = start_agent(
            self.transport, host, self.python, argv, forwarded_env(env), os.getcwd(), KILL_GRACE
        )
        with self._lock:
            if host not in self.started:
                self.started.append(host)
        return proc

    @staticmethod
    def hang_up(child: Child) -> bool:
        """Closes the agent's stdin: it stops the remote process group (SIGTERM, SIGKILL
        after the grace period) and exits. A host cut off hears it only once its link
        heals (or never, when its ssh client gives up first: then the remote sshd ends the
        session, which closes the agent's stdin all the same). False if not remote."""
        if not (isinstance(child, HostChild) and child.remote):
            return False
        stdin = child.proc.stdin
        if stdin is not None:
            try:
                stdin.close()
            except OSError:
                pass
        return True

    def hang_up_all(self, children: Sequence[Child]) -> None:
        for c in children:
            self.hang_up(c)

    # ------------------------------------------------------------------ after
    def sweep(self, job_id: str) -> None:
        """Stops whatever of job ``job_id`` still runs on any host used (found by
        ``FASTPS_JOB_ID`` in its environment: strays that left their group too), and says
        what it found; bounded in time."""
        with self._lock:
            hosts = list(self.started)
        if not hosts:
            return
        problems = sweep(
            self.transport,
            hosts,
            self.python,
            job_id,
            KILL_GRACE,
            self.connect_timeout + KILL_GRACE + 10.0,
        )
        for host, problem in problems.items():
            say(f"host {host_label(host)}: {problem}")
