"""``fastpsrun --config-file FILE``: a job's settings in one YAML file.

Horovod's sections and keys are read where they mean something here, so a Horovod user's
file works unchanged; the keys of Horovod features fastps does not have (the response cache,
autotuning, cycle times, MPI and NCCL options) are named in a warning and ignored. fastps's
own settings go in a ``fastps:`` section, one key per ``FASTPS_*`` variable, named without
the prefix in lower case::

    params:
      fusion_threshold_mb: 32
    stall_check:
      warning_time_seconds: 120
    logging:
      level: info
    fastps:
      partition_bytes: 4M
      compression: fp16

Every setting becomes the variable of the same meaning in every process of the job. The file
wins over the environment fastpsrun was started in, and fastpsrun's own flags win over the
file (``--timeline-filename`` over ``timeline: filename``, ``--log-level`` over ``logging:
level``). Unknown sections and keys are errors that name the file and the key.
"""

from __future__ import annotations

import os
import re
from typing import Any, Callable, Dict, FrozenSet, List, Mapping, Tuple

from fastps.config import MiB
from fastps.errors import ConfigError

__all__ = ["load_config_file", "settable_variables"]

# Set by the launcher for each process, or secrets: never taken from a file.
PER_PROCESS = frozenset(
    {
        "FASTPS_ROLE",
        "FASTPS_RANK",
        "FASTPS_SERVER_ID",
        "FASTPS_SERVER_PORT",
        "FASTPS_SCHEDULER_ADDR",
        "FASTPS_TOKEN",
        "FASTPS_NUM_WORKERS",
        "FASTPS_NUM_SERVERS",
        "FASTPS_LAUNCHER",
        "FASTPS_PARENT_PID",
        "FASTPS_ELASTIC_ADDR",
        "FASTPS_ELASTIC_ID",
        "FASTPS_ELASTIC_JOB_ID",
    }
)

_HOROVOD_LEVELS = {
    "trace": "DEBUG",
    "debug": "DEBUG",
    "info": "INFO",
    "warning": "WARNING",
    "error": "ERROR",
    "fatal": "CRITICAL",
    "critical": "CRITICAL",
}


def settable_variables() -> FrozenSet[str]:
    """The ``FASTPS_*`` variables a file may set: those fastps reads (all in fastps/config.py,
    the one module that reads them), less the ones the launcher sets for each process."""
    import fastps.config

    with open(fastps.config.__file__, encoding="utf-8") as f:
        names = set(re.findall(r'"(FASTPS_[A-Z0-9_]+)"', f.read()))
    return frozenset(names - PER_PROCESS)


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _number(where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if value < 0:
        raise ConfigError(f"{where}: must be >= 0, got {value!r}")
    return float(value)


def _flag(where: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    return value


# Horovod's keys: section -> key -> what it sets (a function of (where, value) returning the
# variables), or a string: why it is ignored here.
_Setter = Callable[[str, Any], Dict[str, str]]


def _fusion(where: str, v: Any) -> Dict[str, str]:
    return {"FASTPS_FUSION_THRESHOLD": str(int(_number(where, v) * MiB))}


def _stall_enabled(where: str, v: Any) -> Dict[str, str]:
    return {} if _flag(where, v) else {"FASTPS_STALL_WARNING_S": "0"}


def _seconds(var: str) -> _Setter:
    return lambda where, v: {var: f"{_number(where, v):g}"}


def _level(where: str, v: Any) -> Dict[str, str]:
    level = _HOROVOD_LEVELS.get(str(v).lower())
    if level is None:
        raise ConfigError(f"{where}: expected one of {sorted(_HOROVOD_LEVELS)}, got {v!r}")
    return {"FASTPS_LOG_LEVEL": level}


def _timeline(where: str, v: Any) -> Dict[str, str]:
    if not isinstance(v, str) or not v:
        raise ConfigError(f"{where}: expected a file name, got {v!r}")
    return {"FASTPS_TIMELINE": os.path.abspath(v)}


_NO_CACHE = "fastps resolves a tensor's name once and keeps it: there is no response cache"
_NO_AUTOTUNE = "fastps sizes parts from the topology and the link rates: there is no autotuner"
_NO_CYCLE = "fastps pushes each gradient as it arrives: there is no coordination cycle"
_HIERARCHY = "fastps always reduces within a host first (local reduce, shared memory)"
_NO_MPI = "fastps does not use MPI, NCCL or oneCCL"

HOROVOD_KEYS: Dict[str, Dict[str, Any]] = {
    "params": {
        "fusion_threshold_mb": _fusion,
        "cycle_time_ms": _NO_CYCLE,
        "cache_capacity": _NO_CACHE,
        "hierarchical_allreduce": _HIERARCHY,
        "hierarchical_allgather": _HIERARCHY,
    },
    "autotune": {
        key: _NO_AUTOTUNE
        for key in (
            "enabled",
            "log_file",
            "warmup_samples",
            "steps_per_sample",
            "bayes_opt_max_samples",
            "gaussian_process_noise",
        )
    },
    "timeline": {"filename": _timeline, "mark_cycles": _NO_CYCLE},
    "stall_check": {
        "enabled": _stall_enabled,
        "warning_time_seconds": _seconds("FASTPS_STALL_WARNING_S"),
        "shutdown_time_seconds": _seconds("FASTPS_STALL_SHUTDOWN_S"),
    },
    "library_options": {
        "gloo_timeout_seconds": _seconds("FASTPS_TIMEOUT"),
        "mpi_threads_disable": _NO_MPI,
        "num_nccl_streams": _NO_MPI,
        "ccl_bgt_affinity": _NO_MPI,
        "thread_affinity": "fastps's threads are placed by the operating system",
    },
    "logging": {"level": _level, "hide_timestamp": "fastps's log lines carry no timestamp"},
}


def parse_config(data: Any, path: str) -> Tuple[Dict[str, str], List[str]]:
    """The variables a parsed file sets, and one warning per ignored key."""
    if data is None:
        return {}, []
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: expected a mapping of sections, got {type(data).__name__}")
    env: Dict[str, str] = {}
    warnings: List[str] = []
    settable = settable_variables()
    for section, body in data.items():
        if body is None:
            continue
        if not isinstance(body, Mapping):
            raise ConfigError(f"{path}: section {section!r} must be a mapping of keys")
        if section == "fastps":
            for key, value in body.items():
                var = "FASTPS_" + str(key).upper()
                if var not in settable:
                    why = (
                        "set by the launcher for each process"
                        if var in PER_PROCESS
                        else "not a fastps setting (docs/reference/configuration.md)"
                    )
                    raise ConfigError(f"{path}: fastps.{key} ({var}): {why}")
                if isinstance(value, (Mapping, list)):
                    raise ConfigError(f"{path}: fastps.{key}: expected a single value")
                env[var] = _text(value)
            continue
        keys = HOROVOD_KEYS.get(str(section))
        if keys is None:
            known = ", ".join([*HOROVOD_KEYS, "fastps"])
            raise ConfigError(f"{path}: unknown section {section!r} (known: {known})")
        for key, value in body.items():
            where = f"{path}: {section}.{key}"
            rule = keys.get(str(key))
            if rule is None:
                raise ConfigError(f"{where}: unknown key (known in {section}: {', '.join(keys)})")
            if isinstance(rule, str):
                warnings.append(f"{section}.{key} ignored: {rule}")
                continue
            env.update(rule(where, value))
    return env, warnings


def load_config_file(path: str) -> Tuple[Dict[str, str], List[str]]:
    """Reads ``path``: the variables it sets and the warnings about ignored keys."""
    import yaml  # a dependency of fastps (docs/design/dependencies.md)

    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as exc:
        raise ConfigError(f"--config-file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"--config-file {path}: not valid YAML: {exc}") from None
    return parse_config(data, path)
