"""``fastpsrun -H``/``--hostfile``/SLURM: one job over several machines.

:class:`ClusterLauncher` is the local :class:`~fastps.launcher.Launcher` with a placement
(``hosts.place``): the scheduler runs in fastpsrun, processes placed on this machine start
directly, the others through a transport (``remote.SshTransport`` or ``SrunTransport``) and
the agent. Before anything starts every remote host is checked (``remote.preflight``); the
address the processes reach the scheduler at is the one the remote hosts' ssh connections
come from (or ``--network-interface``'s). Teardown is the local one plus: remote agents get
EOF on stdin (they stop their process groups), and a sweep over every remote host stops
whatever of the job is still running there before fastpsrun exits.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

from fastps.config import default_advertised_host
from fastps.config import network_interface as stated_interface
from fastps.control.netif import interface_address
from fastps.launch.hosts import Placement, host_label, is_local_host
from fastps.launch.job import KILL_GRACE, Child, Launcher, say
from fastps.launch.remote import Transport, forwarded_env, preflight, start_agent, sweep
from fastps.version import __version__

__all__ = ["ClusterLauncher"]

PREFLIGHT_SLACK = 30.0  # seconds beyond the connect timeout for a host to answer its check


@dataclass
class _HostChild(Child):
    host: str = ""
    remote: bool = False

    @property
    def label(self) -> str:
        return f"{self.role} {self.index}@{self.host}"


class ClusterLauncher(Launcher):
    """A job placed over several hosts. ``run()`` returns fastpsrun's exit code."""

    def __init__(
        self,
        command: Sequence[str],
        placement: Placement,
        transport: Transport,
        network_interface: Optional[str] = None,
        python: Optional[str] = None,
        connect_timeout: float = 5.0,
        local_hosts: Optional[Sequence[str]] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            command,
            num_workers=len(placement.workers),
            num_servers=len(placement.servers),
            **kwargs,
        )
        self.placement = placement
        self.transport = transport
        self.python = python or sys.executable
        self.connect_timeout = connect_timeout
        self.interface = network_interface or stated_interface(self.base_env)
        if local_hosts is None:
            local_hosts = [h for h in placement.hosts if is_local_host(h)]
        self.local_hosts = set(local_hosts)
        self.remote_hosts = [h for h in placement.hosts if h not in self.local_hosts]
        self._started_remote: List[str] = []
        self._lock = threading.Lock()

    # ----------------------------------------------------------------- setup
    def _advertised_address(self, infos: Dict[str, object]) -> str:
        if self.interface:
            return interface_address(self.interface, "--network-interface")
        if not self.remote_hosts:
            return self.host_addr
        for host in self.remote_hosts:
            seen = getattr(infos.get(host), "seen_from", None)
            if seen:
                return seen  # the address this machine's ssh connections leave from
        return default_advertised_host(host_label(self.remote_hosts[0]))

    def _start(self) -> None:
        infos: Dict[str, object] = {}
        if self.remote_hosts:
            env = forwarded_env(self._child_env("worker", 0, "0.0.0.0:1"))
            env.pop("FASTPS_TOKEN", None)  # a check needs no secret
            infos = dict(
                preflight(
                    self.transport,
                    self.remote_hosts,
                    self.python,
                    env,
                    os.getcwd(),
                    self.connect_timeout + PREFLIGHT_SLACK,
                    local_fastps=__version__,
                )
            )
            for host, info in infos.items():
                if not getattr(info, "cwd_exists", True):
                    say(
                        f"host {host_label(host)} has no directory {os.getcwd()}: its processes "
                        "start in the login directory"
                    )
        if self._signal is not None:
            return  # Ctrl-C while the machines were being checked: start nothing
        self.host_addr = self._advertised_address(infos)
        say(f"scheduler at {self.host_addr}; {self.placement.describe()}")
        super()._start()

    def _child_env(self, role: str, index: int, sched_addr: str) -> Dict[str, str]:
        env = super()._child_env(role, index, sched_addr)
        if self.interface:
            env["FASTPS_IFACE"] = self.interface
        return env

    def _host_of(self, role: str, index: int) -> str:
        return (self.placement.workers if role == "worker" else self.placement.servers)[index]

    def _spawn(self, role: str, index: int, argv: List[str], sched_addr: str) -> Child:
        host = self._host_of(role, index)
        env = self._child_env(role, index, sched_addr)
        remote = host not in self.local_hosts
        if remote:
            # The remote machine advertises its own address (FASTPS_IFACE or the route to the
            # scheduler) and host name.
            proc = start_agent(
                self.transport, host, self.python, argv, forwarded_env(env), os.getcwd(), KILL_GRACE
            )
            with self._lock:
                if host not in self._started_remote:
                    self._started_remote.append(host)
        else:
            proc = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        child = _HostChild(role, index, proc, host=host_label(host), remote=remote)
        self._forward_output(child)
        self.children.append(child)
        return child

    # ---------------------------------------------------------------- teardown
    def _terminate_all(self) -> None:
        for c in self.children:
            if isinstance(c, _HostChild) and c.remote and c.proc.stdin is not None:
                try:
                    c.proc.stdin.close()  # EOF: the agent stops its process group
                except OSError:
                    pass
        super()._terminate_all()

    def _cleanup(self) -> None:
        super()._cleanup()
        if not self._started_remote:
            return
        problems = sweep(
            self.transport,
            self._started_remote,
            self.python,
            self.job_id,
            KILL_GRACE,
            self.connect_timeout + KILL_GRACE + 10.0,
        )
        for host, problem in problems.items():
            say(f"host {host_label(host)}: {problem}")
