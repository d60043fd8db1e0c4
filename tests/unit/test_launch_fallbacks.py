"""Which launchers' variables make ``fastps.init()`` join through the store at
MASTER_ADDR:MASTER_PORT (``config.torch_launched``) and the rank and size it then takes
(``config.torch_launch_settings``): torchrun's RANK/WORLD_SIZE, mpirun's OMPI_COMM_WORLD_*,
srun's SLURM_PROCID/SLURM_NTASKS; never in a fastpsrun job (FASTPS_SCHEDULER_ADDR)."""

from __future__ import annotations

from typing import Dict

import pytest
from fastps.config import torch_launch_settings, torch_launched
from fastps.errors import FastPSError

MASTER = {"MASTER_ADDR": "node1", "MASTER_PORT": "29500"}
TORCHRUN = {"RANK": "3", "WORLD_SIZE": "4"}
MPIRUN = {
    "OMPI_COMM_WORLD_RANK": "2",
    "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_LOCAL_RANK": "0",
}
SRUN = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1"}


def env(*parts: Dict[str, str]) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for part in parts:
        out.update(part)
    return out


@pytest.mark.parametrize(
    "launcher, rank, size",
    [(TORCHRUN, 3, 4), (MPIRUN, 2, 4), (SRUN, 1, 2)],
    ids=["torchrun", "mpirun", "srun"],
)
def test_each_launcher_with_master_joins_through_the_store(
    launcher: Dict[str, str], rank: int, size: int
) -> None:
    e = env(MASTER, launcher)
    assert torch_launched(e)
    assert torch_launch_settings(e) == ("node1", 29500, rank, size)


@pytest.mark.parametrize("launcher", [TORCHRUN, MPIRUN, SRUN], ids=["torchrun", "mpirun", "srun"])
def test_without_master_addr_or_port_nothing_changes(launcher: Dict[str, str]) -> None:
    assert not torch_launched(launcher)
    assert not torch_launched(env(launcher, {"MASTER_ADDR": "node1"}))
    assert not torch_launched(env(launcher, {"MASTER_PORT": "29500"}))
    assert not torch_launched(env(launcher, {"MASTER_ADDR": " ", "MASTER_PORT": "29500"}))


@pytest.mark.parametrize("launcher", [TORCHRUN, MPIRUN, SRUN], ids=["torchrun", "mpirun", "srun"])
def test_a_fastpsrun_job_is_never_taken_for_one(launcher: Dict[str, str]) -> None:
    # fastpsrun's SrunTransport runs its agents as srun steps (SLURM_PROCID=0, SLURM_NTASKS=1
    # in every process), and a user's MASTER_ADDR may leak in: the scheduler's address wins.
    e = env(MASTER, launcher, {"FASTPS_SCHEDULER_ADDR": "node1:9000", "FASTPS_RANK": "0"})
    assert not torch_launched(e)


def test_a_pair_counts_only_whole() -> None:
    assert not torch_launched(env(MASTER, {"SLURM_PROCID": "0"}))
    assert not torch_launched(env(MASTER, {"OMPI_COMM_WORLD_SIZE": "4"}))
    assert not torch_launched(env(MASTER, {"RANK": "0"}))
    # A rank from one launcher is never matched with another's size.
    mixed = env(MASTER, {"RANK": "1", "OMPI_COMM_WORLD_RANK": "0"}, {"SLURM_NTASKS": "8"})
    assert not torch_launched(mixed)
    assert torch_launched(env(mixed, {"SLURM_PROCID": "5"}))
    assert torch_launch_settings(env(mixed, {"SLURM_PROCID": "5"}))[2:] == (5, 8)


def test_order_torchrun_then_open_mpi_then_slurm() -> None:
    # torchrun inside an mpirun rank inside an allocation: torchrun's numbering.
    assert torch_launch_settings(env(MASTER, SRUN, MPIRUN, TORCHRUN))[2:] == (3, 4)
    # mpirun inside a batch script: every rank inherits the batch step's SLURM_PROCID=0, so
    # Open MPI's variables must win over SLURM's.
    batch = {"SLURM_PROCID": "0", "SLURM_NTASKS": "4"}
    assert torch_launch_settings(env(MASTER, batch, MPIRUN))[2:] == (2, 4)


def test_no_pair_falls_back_to_torch_defaults() -> None:
    assert torch_launch_settings(MASTER) == ("node1", 29500, 0, 1)


@pytest.mark.parametrize(
    "bad, culprit",
    [
        ({"SLURM_PROCID": "2", "SLURM_NTASKS": "2"}, "SLURM_PROCID"),
        ({"OMPI_COMM_WORLD_RANK": "x", "OMPI_COMM_WORLD_SIZE": "2"}, "OMPI_COMM_WORLD_RANK"),
        ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "0"}, "OMPI_COMM_WORLD_SIZE"),
        ({"RANK": "-1", "WORLD_SIZE": "2"}, "RANK"),
    ],
)
def test_errors_name_the_variable(bad: Dict[str, str], culprit: str) -> None:
    with pytest.raises(FastPSError, match=f"invalid {culprit}="):
        torch_launch_settings(env(MASTER, bad))


def test_master_port_checked() -> None:
    with pytest.raises(FastPSError, match="MASTER_PORT"):
        torch_launch_settings(env({"MASTER_ADDR": "a", "MASTER_PORT": "70000"}, SRUN))
