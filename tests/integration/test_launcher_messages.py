"""fastpsrun's own messages: the root cause of an abort once and first, and the workers
still running long after another finished named periodically (or stopped by
--finish-timeout)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict

import pytest
from fastps.launch.cli import Launcher

FASTPSRUN = [sys.executable, "-m", "fastps.launcher"]

MISMATCH = r"""
import fastps, numpy as np
fastps.init()
n = 3 if fastps.rank() == 0 else 4
fastps.push_pull(np.ones(n, np.float32), name="layer.w")
"""

LINGER = r"""
import sys, time
from fastps.config import Config
from fastps.control import ControlClient
cfg = Config.from_env()
with ControlClient(cfg.require_scheduler_addr(), cfg.job_id, cfg.token, cfg.timeout) as c:
    c.register("worker", cfg.rank, cfg.host, cfg.hostname)
    if cfg.rank == 1:
        time.sleep(float(sys.argv[1]))
"""


def test_tensor_mismatch_names_the_root_cause_once_and_first(
    subprocess_env: Dict[str, str],
) -> None:
    proc = subprocess.run(
        [*FASTPSRUN, "-np", "2", "--num-servers", "1", sys.executable, "-c", MISMATCH],
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    own = [line for line in proc.stderr.splitlines() if line.startswith("fastpsrun:")]
    assert own and own[0].startswith("fastpsrun: job aborted: tensor 'layer.w' mismatch"), out
    assert "float32[3]" in own[0] and "float32[4]" in own[0], out
    # Said once in all the job's output, and nobody else is blamed first.
    assert len(re.findall(r"tensor 'layer.w' mismatch", out)) == 1, out
    assert "Traceback" not in out, out
    for line in own[1:]:
        assert "after the abort" in line, out


def test_finish_timeout_names_who_is_still_running(subprocess_env: Dict[str, str]) -> None:
    t0 = time.monotonic()
    proc = subprocess.run(
        [
            *FASTPSRUN,
            "-np",
            "2",
            "--num-servers",
            "0",
            "--finish-timeout",
            "2",
            sys.executable,
            "-c",
            LINGER,
            "120",
        ],
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    assert time.monotonic() - t0 < 30
    assert re.search(
        r"fastpsrun: worker 1 \(pid \d+\) still running \d+ s after worker 0 "
        r"finished: stopping the job \(--finish-timeout 2 s\)",
        proc.stderr,
    ), proc.stderr


def test_still_running_is_reported_periodically(
    capfd: pytest.CaptureFixture[str], subprocess_env: Dict[str, str], tmp_path: Path
) -> None:
    launcher = Launcher(
        [sys.executable, "-c", LINGER, "3.5"],
        num_workers=2,
        num_servers=0,
        env=subprocess_env,
        report_every=1.0,
    )
    assert launcher.run() == 0
    err = capfd.readouterr().err
    reports = re.findall(
        r"fastpsrun: worker 1 \(pid \d+\) still running (\d+) s after worker 0 "
        r"finished",
        err,
    )
    assert len(reports) >= 2, err
    assert [int(r) for r in reports] == sorted(int(r) for r in reports), err
