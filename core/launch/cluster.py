"""``fastpsrun -H``/``--hostfile``/SLURM: one job over several machines.

:class:`ClusterLauncher` is the local :class:`~fastps.launcher.Launcher` with a placement
(``hosts.place``): the scheduler runs in fastpsrun, processes placed on this machine start
directly, the others through a transport (``remote.SshTransport`` or ``SrunTransport``) and
the agent (``remote_spawn.RemoteSpawner``, shared with the elastic driver). Before anything
starts every remote host is checked (``remote.preflight``); the address the processes reach
the scheduler at is the one the remote hosts' ssh connections come from (or
``--network-interface``'s). Teardown is the local one plus: remote agents get EOF on stdin
(they stop their process groups), and a sweep over every remote host stops whatever of the
job is still running there before fastpsrun exits.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any, Dict, List, Optional, Sequence

from fastps.config import network_interface as stated_interface
from fastps.launch.hosts import Placement, host_label, is_local_host
from fastps.launch.job import Child, Launcher, say
from fastps.launch.remote import HostInfo, Transport
from fastps.launch.remote_spawn import HostChild, RemoteSpawner

__all__ = ["ClusterLauncher"]


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
        self.remote = RemoteSpawner(transport, self.python, connect_timeout, self.interface)
        if local_hosts is None:
            local_hosts = [h for h in placement.hosts if is_local_host(h)]
        self.local_hosts = set(local_hosts)
        self.remote_hosts = [h for h in placement.hosts if h not in self.local_hosts]

    # ----------------------------------------------------------------- setup
    def _advertised_address(self, infos: Dict[str, HostInfo]) -> str:
        return self.remote.advertised_address(infos, self.remote_hosts, self.host_addr)

    def _start(self) -> None:
        infos: Dict[str, HostInfo] = {}
        if self.remote_hosts:
            env = self._child_env("worker", 0, "0.0.0.0:1")
            infos = self.remote.check(self.remote_hosts, env)
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
            proc = self.remote.start(host, argv, env)
        else:
            proc = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        child = HostChild(role, index, proc, host=host_label(host), remote=remote)
        self._forward_output(child)
        self.children.append(child)
        return child

    # ---------------------------------------------------------------- teardown
    def _terminate_all(self) -> None:
        self.remote.hang_up_all(self.children)  # EOF: each agent stops its process group
        super()._terminate_all()

    def _cleanup(self) -> None:
        super()._cleanup()
        self.remote.sweep(self.job_id)
