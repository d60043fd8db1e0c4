"""``FastPSEnvironment``: Lightning's view of a job that ``fastpsrun`` started.

Lightning picks a cluster environment from the variables a launcher sets (torchrun's,
SLURM's, LSF's, MPI's) and otherwise starts the processes itself. A fastpsrun worker has
none of those, only fastps's own (``FASTPS_SCHEDULER_ADDR``, ``FASTPS_RANK``,
``FASTPS_NUM_WORKERS``, Horovod's ``HOROVOD_LOCAL_RANK``/``HOROVOD_CROSS_RANK``), so the
``fastps`` strategy uses this environment there: the processes exist already, and their
ranks are fastpsrun's.
"""

from __future__ import annotations

import os

from fastps.config import Config, scheduler_given, torch_launched
from lightning.fabric.plugins.environments import ClusterEnvironment

__all__ = ["FastPSEnvironment"]


def _int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(
            f"fastps Lightning environment: {name}={raw!r} is not an integer"
        ) from None


class FastPSEnvironment(ClusterEnvironment):
    """The processes of a ``fastpsrun -np N python train.py`` job."""

    @property
    def creates_processes_externally(self) -> bool:
        return True  # fastpsrun started them

    @property
    def main_address(self) -> str:
        # Not a rendezvous address: the strategy forms the process group through the job.
        return Config.from_env().host

    @property
    def main_port(self) -> int:
        return 0

    @staticmethod
    def detect() -> bool:
        """A fastpsrun worker: the scheduler's address is given, torchrun's variables are
        not (under torchrun the torch store forms the job instead)."""
        return scheduler_given() and not torch_launched()

    def world_size(self) -> int:
        return Config.from_env().num_workers

    def set_world_size(self, size: int) -> None:
        pass  # fastpsrun fixed it

    def global_rank(self) -> int:
        return Config.from_env().rank

    def set_global_rank(self, rank: int) -> None:
        pass  # fastpsrun fixed it

    def local_rank(self) -> int:
        return _int("HOROVOD_LOCAL_RANK", self.global_rank())

    def node_rank(self) -> int:
        return _int("HOROVOD_CROSS_RANK", 0)
