"""Configuration from FASTPS_* variables (core/config.py): defaults, the rank fallbacks of other
launchers, bad values refused by variable name, cross-checks, sizes and addresses."""

from __future__ import annotations

import socket
from typing import Dict, Optional

import pytest
from fastps.config import Config, default_engine_threads, parse_addr, parse_size
from fastps.errors import FastPSError


def test_config_defaults() -> None:
    cfg = Config.from_env({"FASTPS_SCHEDULER_ADDR": "127.0.0.1:1234"})
    assert cfg.role == "worker"
    assert cfg.scheduler_addr == ("127.0.0.1", 1234)
    assert (cfg.num_workers, cfg.num_servers, cfg.rank) == (1, 1, 0)
    assert cfg.partition_bytes is None and cfg.credit_bytes is None
    assert cfg.part_sizes(["a", "a"]) == (1 << 20, 1 << 20)
    assert cfg.part_sizes(["a", "b"]) == (128 << 10, 512 << 10)  # credit: 4 parts
    # The rack hierarchy's parts cross twice as many store-and-forward hops: smaller.
    assert cfg.part_sizes(["a", "b"], racks=True) == (64 << 10, 64 << 10)
    assert cfg.part_sizes(["a"], racks=True) == (1 << 20, 1 << 20)
    assert (cfg.window_bytes, cfg.notsent_lowat) == (1 << 20, 128 << 10)
    assert cfg.fusion_threshold == 256 << 10
    set_ = Config.from_env(
        {
            "FASTPS_SCHEDULER_ADDR": "127.0.0.1:1234",
            "FASTPS_PARTITION_BYTES": "1M",
            "FASTPS_WINDOW_BYTES": "0",
            "FASTPS_FUSION_THRESHOLD": "0",
        }
    )
    assert set_.part_sizes(["a", "b"]) == (1 << 20, 1 << 20)
    assert set_.part_sizes(["a", "b"], racks=True) == (1 << 20, 1 << 20)
    assert set_.window_bytes == 0 and set_.fusion_threshold == 0
    assert cfg.link_mbit is None  # unstated: each process detects its link (auto)
    assert Config.from_env({"FASTPS_LINK_MBIT": "2500"}).link_mbit == 2500.0
    assert Config.from_env({}).nudge and not Config.from_env({"FASTPS_NUDGE": "Off"}).nudge
    assert Config.from_env({}).nudge_min_wait == 0.0
    assert Config.from_env({"FASTPS_NUDGE_MIN_WAIT": "0.01"}).nudge_min_wait == 0.01
    assert Config.from_env({}).nudge_overdue == 0.05
    assert Config.from_env({"FASTPS_NUDGE_OVERDUE": "0.01"}).nudge_overdue == 0.01
    with pytest.raises(FastPSError, match=r"FASTPS_NUDGE_OVERDUE='-1'.*>= 0 \(0: at once\)"):
        Config.from_env({"FASTPS_NUDGE_OVERDUE": "-1"})
    assert not Config.from_env({}).elastic_servers and not Config.from_env({"FASTPS_SHM": "no"}).shm
    assert (cfg.conns_per_server, cfg.engine_threads) == (1, default_engine_threads())
    assert [default_engine_threads(n) for n in (1, 2, 3, 64)] == [0, 0, 2, 2]
    assert Config.from_env({"FASTPS_ENGINE_THREADS": "0"}).engine_threads == 0
    with pytest.raises(FastPSError, match="FASTPS_ENGINE_THREADS.*must be >= 0"):
        Config.from_env({"FASTPS_ENGINE_THREADS": "-1"})
    assert (cfg.io_threads, cfg.handshake_timeout) == (1, 5.0)
    tuned = Config.from_env({"FASTPS_IO_THREADS": "3", "FASTPS_HANDSHAKE_TIMEOUT": "0.5"})
    assert (tuned.io_threads, tuned.handshake_timeout) == (3, 0.5)
    assert (cfg.timeout, cfg.op_timeout) == (120.0, 300.0)
    assert (cfg.heartbeat_interval, cfg.heartbeat_timeout) == (1.0, 10.0)
    assert cfg.host == "127.0.0.1"
    assert cfg.hostname == socket.gethostname()
    assert cfg.job_id == "job1234"
    assert cfg.log_level == "WARNING"


@pytest.mark.parametrize(
    ("env", "rank", "size", "source"),
    [
        ({"RANK": "2", "WORLD_SIZE": "4"}, 2, 4, "RANK"),
        ({"SLURM_PROCID": "1", "SLURM_NTASKS": "3"}, 1, 3, "SLURM_PROCID"),
        ({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8"}, 5, 8, "OMPI_COMM_WORLD_RANK"),
        # mpirun inside an sbatch script: its ranks inherit the script's SLURM_PROCID=0.
        (
            {
                "OMPI_COMM_WORLD_RANK": "3",
                "OMPI_COMM_WORLD_SIZE": "4",
                "SLURM_PROCID": "0",
                "SLURM_NTASKS": "1",
            },
            3,
            4,
            "OMPI_COMM_WORLD_RANK",
        ),
        (
            {"FASTPS_RANK": "0", "FASTPS_NUM_WORKERS": "2", "RANK": "7", "WORLD_SIZE": "9"},
            0,
            2,
            None,
        ),
    ],
)
def test_config_rank_fallbacks(
    env: Dict[str, str], rank: int, size: int, source: Optional[str]
) -> None:
    cfg = Config.from_env(env)
    assert (cfg.rank, cfg.num_workers) == (rank, size)
    if source:
        assert cfg.rank_source == source


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("FASTPS_NUM_WORKERS", "two"),
        ("FASTPS_NUM_WORKERS", "0"),
        ("FASTPS_PARTITION_BYTES", "4 parsecs"),
        ("FASTPS_TIMEOUT", "-1"),
        ("FASTPS_HEARTBEAT_INTERVAL", "nan"),
        ("FASTPS_ROLE", "boss"),
        ("FASTPS_SCHEDULER_ADDR", "nohost"),
        ("FASTPS_SCHEDULER_ADDR", "h:99999"),
        ("FASTPS_JOB_ID", "a/b"),
        ("FASTPS_LOG_LEVEL", "LOUD"),
        ("FASTPS_CONNS_PER_SERVER", "0"),
        ("FASTPS_IO_THREADS", "0"),
        ("FASTPS_HANDSHAKE_TIMEOUT", "0"),
        ("FASTPS_LINK_MBIT", "1Gbit"),
        ("FASTPS_LINK_MBIT", "-5"),
        ("FASTPS_LINK_MBIT", "inf"),
        ("FASTPS_NUDGE", "sometimes"),
        ("FASTPS_NUDGE_MIN_WAIT", "-1"),
        ("FASTPS_NUDGE_MIN_WAIT", "10ms"),
        ("FASTPS_SHM", "2"),
        ("FASTPS_ELASTIC_SERVERS", "maybe"),
    ],
)
def test_config_bad_values_name_the_variable(var: str, value: str) -> None:
    with pytest.raises(FastPSError) as err:
        Config.from_env({var: value})
    assert var in str(err.value) and value in str(err.value)


def test_config_cross_checks() -> None:
    with pytest.raises(FastPSError, match="FASTPS_RANK=3"):
        Config.from_env({"FASTPS_RANK": "3", "FASTPS_NUM_WORKERS": "2"})
    with pytest.raises(FastPSError, match="FASTPS_HEARTBEAT_TIMEOUT"):
        Config.from_env({"FASTPS_HEARTBEAT_INTERVAL": "5", "FASTPS_HEARTBEAT_TIMEOUT": "2"})
    with pytest.raises(FastPSError, match="FASTPS_SERVER_ID=2"):
        Config.from_env(
            {"FASTPS_ROLE": "server", "FASTPS_SERVER_ID": "2", "FASTPS_NUM_SERVERS": "2"}
        )
    with pytest.raises(FastPSError, match="FASTPS_SCHEDULER_ADDR is not set"):
        Config.from_env({}).require_scheduler_addr()


def test_parse_helpers() -> None:
    assert parse_size("4M") == parse_size("4MiB") == 4 << 20
    assert parse_size("512k") == 512 << 10
    assert parse_size("1000") == 1000
    assert parse_addr("[::1]:80") == ("::1", 80)
    assert parse_addr("node-3.cluster:29400") == ("node-3.cluster", 29400)
