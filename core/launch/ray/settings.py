"""The settings of a job on Ray: what Horovod's ``RayExecutor.create_settings`` returns."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional, Set

from fastps.errors import FastPSError

__all__ = ["RaySettings", "create_settings"]


@dataclass
class RaySettings:
    """``timeout_s``: how long the workers wait for each other when they join (fastps's
    registration timeout) and how long each step of start() may take;
    ``placement_group_timeout_s``: how long start() waits for the cluster to grant the
    workers' resources (then ``TimeoutError``). ``nics``: the network interfaces fastps may
    use (the first is given to fastps as ``FASTPS_IFACE``). The ssh fields are accepted for
    Horovod's signature; fastps on Ray never uses ssh."""

    timeout_s: float = 30.0
    placement_group_timeout_s: float = 100.0
    nics: Optional[Set[str]] = None
    ssh_identity_file: Optional[str] = None
    verbose: int = 1
    elastic: bool = False

    def __post_init__(self) -> None:
        if not self.timeout_s or self.timeout_s <= 0:
            raise FastPSError(f"RayExecutor settings: timeout_s must be > 0, got {self.timeout_s}")
        if not self.placement_group_timeout_s or self.placement_group_timeout_s <= 0:
            raise FastPSError(
                "RayExecutor settings: placement_group_timeout_s must be > 0, got "
                f"{self.placement_group_timeout_s}"
            )


def create_settings(
    timeout_s: float = 30,
    ssh_identity_file: Optional[str] = None,
    ssh_str: Optional[str] = None,
    placement_group_timeout_s: float = 100,
    nics: Optional[Set[str]] = None,
) -> RaySettings:
    """Horovod's ``RayExecutor.create_settings``. ``ssh_str`` (a private key) is written to
    ``ssh_identity_file`` as Horovod does, though fastps on Ray does not use it."""
    if ssh_str and ssh_identity_file and not os.path.exists(ssh_identity_file):
        fd = os.open(ssh_identity_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(ssh_str)
    return RaySettings(
        timeout_s=float(timeout_s),
        placement_group_timeout_s=float(placement_group_timeout_s),
        nics=set(nics) if nics else None,
        ssh_identity_file=ssh_identity_file,
    )
