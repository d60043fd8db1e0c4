"""Horovod's own elastic integration scenarios and its elastic PyTorch example, run against
fastps from a Horovod checkout (nothing of Horovod is copied here).

- ``tests/horovod_compat/elastic_torch_scenarios.py`` runs Horovod's
  ``test/integration/elastic_common.py`` with ``data/elastic_torch_main.py`` (hosts added,
  removed and failing through a discovery script), ``horovod`` mapped to fastps and
  ``horovodrun`` to fastpsrun by ``tests/horovod_compat/horovod``.
- ``examples/elastic/pytorch/pytorch_synthetic_benchmark_elastic.py`` runs under
  fastpsrun's elastic mode with ``import horovod.torch`` resolving to ``fastps.torch``,
  while the test adds a host through the discovery script, removes it, and SIGKILLs a
  worker. It imports torchvision, which does not load beside the main environment's torch
  (2.13.0, CPU build): it runs with ``$FASTPS_VISION_PYTHON``, an interpreter where it does
  (``tests/envs/vision.sh`` builds one), and skips, saying so, without one.

The checkout is ``$HOROVOD_CHECKOUT`` (default /tmp/horovod); without one these tests are
skipped. Get one with ``git clone https://github.com/horovod/horovod``.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[3]
COMPAT = ROOT / "tests" / "horovod_compat"
CHECKOUT = Path(os.environ.get("HOROVOD_CHECKOUT", "/tmp/horovod"))
sys.path.insert(0, str(ROOT / "tests" / "integration" / "elastic"))
from live_job import LiveJob, discovery_script  # noqa: E402

SCENARIOS = ("test/integration/elastic_common.py", "test/integration/data/elastic_torch_main.py")
EXAMPLE = "examples/elastic/pytorch/pytorch_synthetic_benchmark_elastic.py"


def _need(paths, modules) -> None:
    missing = [p for p in paths if not (CHECKOUT / p).is_file()]
    if missing:
        pytest.skip(
            f"no Horovod checkout with {', '.join(missing)} at {CHECKOUT} "
            "(set HOROVOD_CHECKOUT to a clone of github.com/horovod/horovod)"
        )
    absent = [m for m in modules if importlib.util.find_spec(m) is None]
    if absent:
        pytest.skip(f"Horovod's scripts import {', '.join(absent)}: pip install {' '.join(absent)}")


def _env(subprocess_env) -> dict:
    env = dict(subprocess_env)
    env["HOROVOD_CHECKOUT"] = str(CHECKOUT)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(COMPAT), env.get("PYTHONPATH")) if p)
    return env


@pytest.mark.slow
@pytest.mark.timeout(1800)  # 7 scenarios, 11 elastic jobs of torch workers
def test_horovod_elastic_torch_scenarios(subprocess_env):
    _need(SCENARIOS, ("torch", "mock", "psutil", "cloudpickle"))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
         str(COMPAT / "elastic_torch_scenarios.py")],
        env=_env(subprocess_env), capture_output=True, text=True, timeout=1700, cwd=str(COMPAT),
    )  # fmt: skip
    tail = proc.stdout[-8000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, tail
    summary = re.search(r"(\d+) passed(?:, (\d+) skipped)?", proc.stdout)
    assert summary and int(summary.group(1)) == 7, tail


def _torchvision_problem(python: str, env: Dict[str, str]) -> str:
    """Why ``from torchvision import models`` fails in ``python`` ('' when it works).
    Tried in a subprocess: a torchvision built for another torch fails while registering
    its operators, which must not happen in the test process."""
    try:
        proc = subprocess.run(
            [python, "-c", "from torchvision import models; import fastps.torch"],
            env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{python}: {e}"
    if proc.returncode == 0:
        return ""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    return f"{python}: {lines[-1] if lines else f'exit {proc.returncode}'}"


def _without_bare_core(pythonpath: str) -> str:
    """PYTHONPATH without the entries tests/conftest.py adds to map ``fastps`` to this
    checkout's core folder: another environment has fastps installed, plugins included."""
    core = (ROOT / "core").resolve()
    keep = [
        e
        for e in pythonpath.split(os.pathsep)
        if e and not ((Path(e) / "fastps").is_symlink() and (Path(e) / "fastps").resolve() == core)
    ]
    return os.pathsep.join(keep)


def _vision_python(subprocess_env: Dict[str, str]) -> Tuple[str, Dict[str, str]]:
    """An interpreter where torchvision and fastps.torch import, and its environment:
    $FASTPS_VISION_PYTHON if set, else this one if torchvision loads here."""
    chosen = os.environ.get("FASTPS_VISION_PYTHON")
    env = _env(subprocess_env)
    if chosen:
        env["PYTHONPATH"] = _without_bare_core(env["PYTHONPATH"])
        problem = _torchvision_problem(chosen, env)
        if problem:
            pytest.fail(f"FASTPS_VISION_PYTHON does not load torchvision and fastps ({problem})")
        return chosen, env
    problem = _torchvision_problem(sys.executable, env)
    if problem:
        pytest.skip(
            f"Horovod's example imports torchvision, which does not load here ({problem}); "
            "build an environment where it does and point FASTPS_VISION_PYTHON at it: "
            "export FASTPS_VISION_PYTHON=$(bash tests/envs/vision.sh | tail -n 1)"
        )
    return sys.executable, env


def _iter_after(job: LiveJob, start: int, timeout: float) -> float:
    """When rank 0 logged the example's next ``Iter #`` line from line ``start`` on."""
    i, _ = job.wait_for_line(r"Iter #\d+:", timeout, start)
    return job.times[i]


def _generation(job: LiveJob, pattern: str, start: int, timeout: float) -> Tuple[int, float]:
    i, _ = job.wait_for_line(pattern, timeout, start)
    return i, job.times[i]


ITERS = 60  # enough for the three changes below at any speed (each waits for its own lines)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_horovod_elastic_synthetic_benchmark(tmp_path, subprocess_env):
    """Horovod's elastic example, unchanged but for the import, while its world changes
    three ways: a host added to the discovery output (2 -> 3 workers), that host removed
    (-> 2), a worker SIGKILLed (-> 1). The job ends normally on the one worker left; the
    time from each change to the next generation and to rank 0's next iteration is printed
    (``pytest -s``), and the kill's recovery is bounded (the elastic recovery goal: < 10 s)."""
    _need((EXAMPLE,), ())
    python, env = _vision_python(subprocess_env)
    hosts, script = discovery_script(tmp_path, "localhost:2")
    args = ["-np", "2", "--min-np", "1", "--max-np", "3", "--host-discovery-script", str(script),
            "--elastic-timeout", "180",
            python, str(CHECKOUT / EXAMPLE), "--no-cuda", "--model", "squeezenet1_1",
            "--batch-size", "2", "--num-warmup-batches", "1", "--num-batches-per-iter", "1",
            "--num-iters", str(ITERS)]  # fmt: skip
    job = LiveJob(args, env, cwd=tmp_path, python=python)
    timings: List[Tuple[str, float, float]] = []
    try:
        victim = job.worker_pid("localhost:1")
        job.wait_for(r"Iter #1:", 300)

        # A host appears: its worker starts and joins at a commit (Horovod's timing).
        at, t0 = job.mark(), time.time()
        hosts.write_text("localhost:2\n127.0.0.1:1\n")
        g1 = r"generation 1: 3 workers \(localhost:0, localhost:1, 127\.0\.0\.1:0\)"
        i, t_gen = _generation(job, g1, at, 240)
        timings.append(("host added", t_gen - t0, _iter_after(job, i, 120) - t0))

        # It disappears again: its worker is stopped, the others go on from the last commit.
        at, t0 = job.mark(), time.time()
        hosts.write_text("localhost:2\n")
        g2 = r"generation 2: 2 workers \(localhost:0, localhost:1\)"
        i, t_gen = _generation(job, g2, at, 120)
        timings.append(("host removed", t_gen - t0, _iter_after(job, i, 120) - t0))

        # A worker is SIGKILLed mid-training.
        job.wait_for(r"Iter #\d+:", 120, job.mark())
        at, t0 = job.mark(), time.time()
        os.kill(victim, signal.SIGKILL)
        g3 = r"generation 3: 1 workers \(localhost:0\), ([\d.]+) s after the failure"
        i, t_gen = _generation(job, g3, at, 120)
        formed = job.wait_for(g3, 1, at)
        assert float(formed.group(1)) < 10.0, formed.group(0)
        timings.append(("worker SIGKILLed", t_gen - t0, _iter_after(job, i, 120) - t0))
        rc = job.finish(600)
    finally:
        job.stop()
    out = job.output
    assert rc == 0, out[-6000:]
    assert "Number of CPUs: 2" in out, out[-6000:]
    assert f"Iter #{ITERS - 1}:" in out, out[-6000:]
    assert "Total img/sec on 1 CPU(s)" in out, out[-6000:]
    assert "generation 4" not in out, out[-6000:]
    for what, gen, step in timings:
        print(f"{what}: next generation {gen:.1f} s, rank 0's next iteration {step:.1f} s")
    print(_iteration_times(job))


def _iteration_times(job: LiveJob) -> str:
    """The median time between rank 0's consecutive iterations in each generation (one
    iteration is one batch here): what a recovery's "next iteration" compares with."""
    parts = []
    bounds = [
        i for i, line in enumerate(job.lines) if re.search(r"generation \d+: \d+ workers", line)
    ]
    for g, (lo, hi) in enumerate(zip(bounds, bounds[1:] + [len(job.lines)])):
        t = [job.times[i] for i in range(lo, hi) if re.search(r"Iter #\d+:", job.lines[i])]
        gaps = sorted(b - a for a, b in zip(t, t[1:]))
        if gaps:
            parts.append(f"generation {g}: {gaps[len(gaps) // 2]:.2f} s ({len(gaps)} gaps)")
    return "median time per iteration: " + ", ".join(parts)
