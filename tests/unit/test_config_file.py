"""``fastpsrun --config-file``: how a file's sections become variables (the jobs that use
them are in ``integration/test_launcher_diagnostics.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastps.errors import ConfigError
from fastps.launch.config_file import load_config_file, parse_config, settable_variables


def test_horovod_keys_map_to_fastps_variables() -> None:
    env, warnings = parse_config(
        {
            "params": {"fusion_threshold_mb": 0.5, "hierarchical_allreduce": True},
            "stall_check": {"enabled": False, "shutdown_time_seconds": 300},
            "library_options": {"gloo_timeout_seconds": 45},
            "logging": {"level": "trace", "hide_timestamp": True},
            "autotune": {"enabled": True},
        },
        "job.yaml",
    )
    assert env == {
        "FASTPS_FUSION_THRESHOLD": str(512 * 1024),
        "FASTPS_STALL_WARNING_S": "0",
        "FASTPS_STALL_SHUTDOWN_S": "300",
        "FASTPS_TIMEOUT": "45",
        "FASTPS_LOG_LEVEL": "DEBUG",
    }
    assert [w.split(" ignored")[0] for w in warnings] == [
        "params.hierarchical_allreduce",
        "logging.hide_timestamp",
        "autotune.enabled",
    ]


def test_fastps_section_takes_any_setting_fastps_reads() -> None:
    env, warnings = parse_config(
        {"fastps": {"partition_bytes": "4M", "shm": False, "round_quorum": 3}}, "f.yaml"
    )
    assert env == {
        "FASTPS_PARTITION_BYTES": "4M",
        "FASTPS_SHM": "0",
        "FASTPS_ROUND_QUORUM": "3",
    }
    assert warnings == []
    names = settable_variables()
    assert {"FASTPS_PARTITION_BYTES", "FASTPS_COMPRESSION", "FASTPS_TIMEOUT"} <= names
    assert not {"FASTPS_RANK", "FASTPS_TOKEN", "FASTPS_SCHEDULER_ADDR"} & names


@pytest.mark.parametrize(
    "data, message",
    [
        ({"parms": {}}, "unknown section 'parms'"),
        ({"params": {"fusion_threshold": 1}}, "params.fusion_threshold: unknown key"),
        ({"params": {"fusion_threshold_mb": "big"}}, "expected a number, got 'big'"),
        ({"params": {"fusion_threshold_mb": -1}}, "must be >= 0"),
        ({"stall_check": {"enabled": "no"}}, "expected true or false"),
        ({"logging": {"level": "loud"}}, "logging.level: expected one of"),
        ({"fastps": {"no_such_thing": 1}}, "FASTPS_NO_SUCH_THING): not a fastps setting"),
        ({"fastps": {"token": "x"}}, "set by the launcher for each process"),
        ({"fastps": {"compression": ["fp16"]}}, "fastps.compression: expected a single value"),
        (["params"], "expected a mapping of sections"),
    ],
)
def test_mistakes_name_the_file_and_key(data: object, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(data, "job.yaml")
    assert "job.yaml" in str(info.value) and message in str(info.value)


def test_unreadable_or_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="No such file"):
        load_config_file(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("params: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config_file(str(bad))
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_config_file(str(empty)) == ({}, [])
