"""The A/B guard's parts (benchmarks/ab_rack.py) and the machine CPU accounting it reports
(benchmarks/cpu_account.py): a revision's build is what the runs import, cells are read
and paired as documented, and CPU inside wall-clock spans is interpolated from samples."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from benchmarks import ab_rack
from benchmarks.cpu_account import (
    _TICK,
    JobAndMachineSampler,
    JobCpuSampler,
    MachineCpuSampler,
    _stat_seconds,
    machine_busy_seconds,
)


def test_cells_are_read_and_failed_rows_left_out(tmp_path: Path) -> None:
    out = tmp_path / "comm.csv"
    out.write_text(
        "# commit: abc\n"
        "model,system,n,k,time_s,frac_bound,job_mb_per_cpu_s,status\n"
        "resnet50,fastps,4,0,1.30,0.98,81.5,ok\n"
        "resnet50,fastps,4,4,,,,failed: results from [0] of 4 workers\n"
        "resnet50,fastps,4,2,1.05,0.97,,ok\n"
    )
    keys = ("model", "system", "n", "k")
    cells = ab_rack.read_cells(out, keys, "time_s", "frac_bound", "job_mb_per_cpu_s")
    assert sorted(cells) == [("resnet50", "fastps", "4", "0"), ("resnet50", "fastps", "4", "2")]
    assert cells[("resnet50", "fastps", "4", "0")] == (1.30, 0.98, 81.5)
    time_s, frac, cpu = cells[("resnet50", "fastps", "4", "2")]
    assert (time_s, frac) == (1.05, 0.97) and math.isnan(cpu)  # an empty CPU cell is unknown
    # Without a CPU column asked for, every cell's CPU is unknown (older CSVs have none).
    for _, _, cpu in ab_rack.read_cells(out, keys, "time_s", "frac_bound").values():
        assert math.isnan(cpu)


def test_bad_settings_are_named(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        ab_rack.main(["--a", "HEAD", "--b", "HEAD", "--b-env", "FASTPS_PARTITION_BYTES"])
    assert "FASTPS_PARTITION_BYTES" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ab_rack.main(["--a", "HEAD", "--b", "HEAD", "--repeats", "0"])
    assert "--repeats must be >= 1, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="not-a-revision"):
        ab_rack.resolve("not-a-revision")


def test_worktree_is_a_commit_and_leaves_the_tree_alone() -> None:
    before = subprocess.run(
        ["git", "-C", str(ab_rack.REPO), "status", "--porcelain"], capture_output=True, text=True
    ).stdout
    sha, label = ab_rack.resolve("WORKTREE")
    assert label == "worktree" and len(sha) == 40
    after = subprocess.run(
        ["git", "-C", str(ab_rack.REPO), "status", "--porcelain"], capture_output=True, text=True
    ).stdout
    assert after == before


def test_the_bare_interpreter_imports_the_revision_on_pythonpath(tmp_path: Path) -> None:
    # A stand-in for a revision's built package: the runs must import it, not this tree's
    # (editable) fastps, while still seeing this interpreter's other packages.
    site = tmp_path / "site" / "fastps"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text("REVISION = 'under test'\n")
    py = ab_rack.bare_python(tmp_path / "cache")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "PYTHONNOUSERSITE": "1"}
    env.pop("VIRTUAL_ENV", None)
    code = "import fastps, numpy; print(fastps.REVISION, numpy.__name__)"
    out = subprocess.run(
        [str(py), "-c", code], env=env, capture_output=True, text=True, cwd=str(tmp_path)
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["under", "test", "numpy"]


def test_machine_cpu_inside_spans_is_interpolated() -> None:
    s = MachineCpuSampler()
    s.samples = [(10.0, 100.0), (11.0, 101.5), (12.0, 102.0), (13.0, 104.0)]
    # 10.5 -> 100.75, 11.5 -> 101.75: one second of wall time, one CPU-second busy.
    assert s.busy_in([(10.5, 11.5)]) == pytest.approx(1.0)
    assert s.busy_in([(10.0, 11.0), (12.0, 13.0)]) == pytest.approx(3.5)
    assert s.busy_in([(9.0, 11.0)]) is None  # outside the samples: no figure, not a guess


def test_machine_busy_seconds_grow_with_work() -> None:
    with MachineCpuSampler(interval=0.01) as s:
        a = machine_busy_seconds()
        x = 0
        for i in range(2_000_000):  # about 0.1 s of one core
            x += i
        b = machine_busy_seconds()
    assert b > a and len(s.samples) >= 2


def test_job_and_machine_sampler_reads_both_counters_on_one_thread() -> None:
    if not JobCpuSampler.available():
        pytest.skip("needs root and cgroup v1 cpuacct")
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass",
        ]
    )
    try:
        with JobAndMachineSampler(f"fastps-test-{os.getpid()}") as s:
            s.add(child.pid)
            names = [t.name for t in threading.enumerate()]
            assert names.count("job-cpu") == 1 and "machine-cpu" not in names, names
            child.wait(timeout=30)
            time.sleep(0.05)
        t0, t1 = s.samples[0][0], s.samples[-1][0]
        job = s.busy_in([(t0, t1)])
        machine = s.machine.busy_in([(t0, t1)])
        assert job is not None and machine is not None
        # The child's 0.3 CPU-seconds fall into both; the job's figure is the child's own
        # (plus the machine's softirq), so it cannot exceed the machine's by much.
        assert job >= 0.25 and machine >= 0.25
        assert job <= machine + 0.05
        assert not s.group.exists()  # removed on exit, its files closed first
    finally:
        child.kill()
        child.wait()


def test_stat_line_is_read_as_the_machine_samplers_read_it() -> None:
    # Runs anywhere (no cgroup needed): the one parser both samplers use.
    line = b"cpu  100 7 50 900 3 2 8 4 0 0"
    busy, irq = _stat_seconds(line)
    assert busy == pytest.approx((100 + 50 + 2 + 8 + 4) * _TICK)  # nice, idle, iowait left out
    assert irq == pytest.approx((2 + 8) * _TICK)
    assert _stat_seconds(b"cpu 5") == (pytest.approx(5 * _TICK), 0.0)  # short lines: zeros
