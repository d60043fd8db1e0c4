"""The launcher's diagnostics with real jobs: ``--check-build``, ``--log-level``/``--verbose``,
``--output-filename``, ``--config-file``, and ``fastps.run()`` (functions run on the workers of
a new job). The config file's parsing alone is in ``unit/test_config_file.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import pytest

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "tests" / "workers" / "run_function_driver.py"
FASTPSRUN = [sys.executable, "-m", "fastps.launcher"]
# A worker that prints the settings it was given, on stdout and on stderr.
SHOW_SETTINGS = (
    "import os, sys; keys = ('FASTPS_LOG_LEVEL', 'FASTPS_PARTITION_BYTES', "
    "'FASTPS_FUSION_THRESHOLD', 'FASTPS_STALL_WARNING_S', 'FASTPS_COMPRESSION'); "
    "print('settings', ' '.join(f'{k}={os.environ.get(k)}' for k in keys)); "
    "print('to stderr', os.environ['FASTPS_RANK'], file=sys.stderr)"
)


def fastpsrun(
    args: List[str], env: Dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*FASTPSRUN, *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def settings_of(out: str) -> Dict[str, str]:
    line = next(x for x in out.splitlines() if "settings " in x)
    return dict(item.split("=", 1) for item in line.split("settings ", 1)[1].split())


@pytest.fixture
def env(subprocess_env: Dict[str, str]) -> Dict[str, str]:
    e = dict(subprocess_env)
    for var in ("FASTPS_LOG_LEVEL", "FASTPS_PARTITION_BYTES", "FASTPS_FUSION_THRESHOLD"):
        e.pop(var, None)
    return e


# ------------------------------------------------------------------------ --check-build
@pytest.mark.parametrize("how", ["fastpsrun", "python -m fastps"])
def test_check_build_reports_core_frameworks_and_plugins(
    how: str, env: Dict[str, str], tmp_path: Path
) -> None:
    """The report names the core's build as the core itself states it, torch with its
    version and the registered backend, and a framework whose import is broken (a fake
    ``mxnet`` that raises) with that error — and still exits 0."""
    from importlib.metadata import version

    from fastps import _core

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "mxnet.py").write_text("raise ImportError('libmxnet.so: cannot open (planted)')\n")
    env["PYTHONPATH"] = f"{broken}{os.pathsep}{env.get('PYTHONPATH', '')}"
    argv = (
        [*FASTPSRUN, "--check-build"]
        if how == "fastpsrun"
        else [sys.executable, "-m", "fastps", "--check-build"]
    )
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    info = _core.build_info()
    assert f"SIMD sum kernels: {info['simd_active']} in use" in out
    assert "compression codecs: " + " ".join(info["codecs"]) in out
    assert {"fp16", "onebit", "topk"} <= set(info["codecs"])
    assert info["simd_active"] in info["simd_supported"]
    assert f"{info['build_type']} build" in out
    torch_version = version("torch")
    assert f"[X] PyTorch {torch_version}" in out or f"[X] PyTorch {torch_version}+" in out
    assert "torch.distributed backend 'fastps' registered" in out
    assert "[ ] MXNet: ImportError: libmxnet.so: cannot open (planted)" in out


# ---------------------------------------------------- --log-level, --verbose, --output-filename
def test_output_filename_log_level_and_verbose(env: Dict[str, str], tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    proc = fastpsrun(
        [
            "-np",
            "2",
            "--log-level",
            "debug",
            "--verbose",
            "--output-filename",
            str(logs),
            sys.executable,
            "-c",
            SHOW_SETTINGS,
        ],
        env,
    )
    assert proc.returncode == 0, proc.stderr
    # The console keeps the prefixed stream; each rank's file holds its own lines, unprefixed.
    assert "[worker 1] to stderr 1" in proc.stderr
    for rank in (0, 1):
        stdout = (logs / f"rank.{rank}" / "stdout").read_text()
        assert stdout.startswith("settings FASTPS_LOG_LEVEL=DEBUG"), stdout
        assert (logs / f"rank.{rank}" / "stderr").read_text() == f"to stderr {rank}\n"
    assert (logs / "server.0" / "stderr").exists()
    assert settings_of(proc.stdout)["FASTPS_LOG_LEVEL"] == "DEBUG"
    # --verbose names every process as it starts; DEBUG reaches fastpsrun's own scheduler.
    for who in ("server 0", "worker 0", "worker 1"):
        assert f"fastpsrun: started {who} (pid " in proc.stderr
    assert "[scheduler] DEBUG" in proc.stderr or "[scheduler] INFO" in proc.stderr


def test_verbose_alone_logs_at_info(env: Dict[str, str]) -> None:
    proc = fastpsrun(["-np", "1", "--verbose", sys.executable, "-c", SHOW_SETTINGS], env)
    assert proc.returncode == 0, proc.stderr
    assert settings_of(proc.stdout)["FASTPS_LOG_LEVEL"] == "INFO"


def test_workers_that_never_join_end_the_job_at_once(env: Dict[str, str]) -> None:
    """``fastpsrun -np 2 hostname`` (a sanity check people run first): the server, still
    waiting for the membership, is told the job is over and leaves; exit 0 in seconds."""
    start = time.monotonic()
    proc = fastpsrun(["-np", "2", "hostname"], env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - start < 20
    assert "servers still running" not in proc.stderr


# --------------------------------------------------------------------------- --config-file
CONFIG = """\
params:
  fusion_threshold_mb: 2
  cache_capacity: 1024
stall_check:
  warning_time_seconds: 90
logging:
  level: info
fastps:
  partition_bytes: 1M
  compression: fp16
"""


def test_config_file_sets_every_process_flags_win(env: Dict[str, str], tmp_path: Path) -> None:
    cfg = tmp_path / "job.yaml"
    cfg.write_text(CONFIG)
    env["FASTPS_PARTITION_BYTES"] = "2M"  # the file wins over the environment
    proc = fastpsrun(
        ["-np", "2", "--config-file", str(cfg), sys.executable, "-c", SHOW_SETTINGS], env
    )
    assert proc.returncode == 0, proc.stderr
    got = settings_of(proc.stdout)
    assert got == {
        "FASTPS_LOG_LEVEL": "INFO",
        "FASTPS_PARTITION_BYTES": "1M",
        "FASTPS_FUSION_THRESHOLD": str(2 * 1024 * 1024),
        "FASTPS_STALL_WARNING_S": "90",
        "FASTPS_COMPRESSION": "fp16",
    }
    assert "params.cache_capacity ignored: " in proc.stderr
    # ... and the flags win over the file.
    proc = fastpsrun(
        [
            "-np",
            "1",
            "--config-file",
            str(cfg),
            "--partition-bytes",
            "512K",
            "--log-level",
            "error",
            sys.executable,
            "-c",
            SHOW_SETTINGS,
        ],
        env,
    )
    assert proc.returncode == 0, proc.stderr
    got = settings_of(proc.stdout)
    assert got["FASTPS_PARTITION_BYTES"] == str(512 * 1024)
    assert got["FASTPS_LOG_LEVEL"] == "ERROR"


@pytest.mark.parametrize(
    "text, message",
    [
        ("params:\n  fusion_treshold_mb: 2\n", "params.fusion_treshold_mb: unknown key"),
        ("fastps:\n  rank: 3\n", "fastps.rank (FASTPS_RANK): set by the launcher"),
        ("fastps:\n  partition_bytes: lots\n", "FASTPS_PARTITION_BYTES='lots'"),
        ("logging: [1, 2]\n", "section 'logging' must be a mapping"),
    ],
)
def test_config_file_errors_name_the_key(
    text: str, message: str, env: Dict[str, str], tmp_path: Path
) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    proc = fastpsrun(["-np", "1", "--config-file", str(cfg), "true"], env)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert message in proc.stderr, proc.stderr


# ------------------------------------------------------------------------------ fastps.run
def drive(scenario: str, env: Dict[str, str], timeout: float = 120) -> Dict[str, object]:
    proc = subprocess.run(
        [sys.executable, str(DRIVER), scenario],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert lines, (proc.stdout, proc.stderr)
    result: Dict[str, object] = json.loads(lines[-1][len("RESULT ") :])
    result["stderr"] = proc.stderr
    return result


@pytest.mark.parametrize("shm", ["0", "1"], ids=["tcp", "local"])
def test_run_returns_every_rank_result_in_rank_order(shm: str, env: Dict[str, str]) -> None:
    env["FASTPS_SHM"] = shm
    out = drive("happy", env)
    assert "error" not in out, out
    results = out["results"]
    assert isinstance(results, list) and len(results) == 3
    # rank 0: the job's size and the sum over ranks of [rank, a + b + c].
    assert results[0] == [3, [0.0 + 1.0 + 2.0, 3 * 321.0]]
    assert [r["rank"] for r in results[1:]] == [1, 2]
    assert results[1]["pid"] != results[2]["pid"]


def test_run_names_the_rank_that_raised(env: Dict[str, str]) -> None:
    out = drive("raises", env)
    error = str(out["error"])
    assert error.startswith("RuntimeError: fastps.run: rank 1 raised KeyError"), out
    assert "no such key on rank 1" in error and "raises_on_rank_1" in error  # its traceback
    assert out["cause"].startswith("KeyError("), out
    assert float(out["seconds"]) < 60  # rank 0's 120 s sleep was cut short


def test_run_names_a_rank_that_died(env: Dict[str, str]) -> None:
    out = drive("dies", env)
    error = str(out["error"])
    assert error.startswith("RuntimeError: fastps.run: the job failed (exit code 7)"), out
    assert "no result from rank 0, rank 1" in error
    assert "worker 1 (pid" in str(out["stderr"])  # fastpsrun's own line names it
    assert float(out["seconds"]) < 60


def test_run_refuses_mpi(env: Dict[str, str]) -> None:
    out = drive("refused", env)
    assert out["error"] == (
        "ValueError: fastps.run: use_mpi=True: fastps does not run over MPI (its own "
        "transport is used)"
    ), out


def test_elastic_job_whose_workers_never_join_succeeds(env: Dict[str, str], tmp_path: Path) -> None:
    """As without --min-np: a command that exits 0 without calling init (``python -V``) is a
    finished job, not a failed one (Horovod's interactive-run test runs exactly this)."""
    script = tmp_path / "hosts.sh"
    script.write_text("#!/bin/sh\necho localhost:2\n")
    script.chmod(0o755)
    argv = ["-np", "2", "--min-np", "2", "--host-discovery-script", str(script)]
    proc = fastpsrun([*argv, sys.executable, "-V"], env)
    assert proc.returncode == 0, proc.stderr
    assert "every worker finished without joining the job (2 exited 0)" in proc.stderr
    proc = fastpsrun([*argv, sys.executable, "-c", "import sys; sys.exit(3)"], env)
    assert proc.returncode != 0
