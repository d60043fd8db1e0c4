"""Lightning on fastps, against the real ``lightning`` package: ``Trainer(strategy="fastps")``
launched by each route a user takes — Lightning itself (devices=2), torchrun, SLURM (the
variables ``srun`` gives each task, emulated: no SLURM here) and fastpsrun — and
``DDPStrategy(process_group_backend="fastps")`` with fastps's DDP communication hook.

Every job trains the digits model of ``workers/lightning_digits_worker.py`` on 2 processes
and must end within 1 point of validation accuracy of the same run on DDP/gloo; the
checkpoint the first fastps job writes (once, by rank 0) is loaded by a fresh Trainer in the
torchrun job; a rank killed mid-training ends the run with an error naming it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
WORKER = HERE / "workers" / "lightning_digits_worker.py"
sys.path.insert(0, str(REPO / "tests" / "torch" / "backend"))
from torchrun import free_port, kill_tree  # noqa: E402  (the torch tier's launcher helpers)

JOB_TIMEOUT = 150.0  # one job: 2 processes importing Lightning, 3 short epochs
ACCURACY_POINTS = 1.0


def _env(**extra: str) -> Dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("FASTPS_", "SLURM_", "TORCHELASTIC_"))
        and k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
    }
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    env.update(extra)
    return env


def _wait(procs: List[subprocess.Popen], what: str) -> List[str]:
    """Every process's output, once all have ended (killed with their children after
    JOB_TIMEOUT: the test then fails naming the job)."""
    deadline = time.monotonic() + JOB_TIMEOUT
    outs = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for p in procs:
                kill_tree(p)
            pytest.fail(f"{what}: still running after {JOB_TIMEOUT:g} s")
        outs.append(out)
    return outs


def _start(cmd: List[str], env: Dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        cmd, env=env, cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _worker(out: Path, *args: str) -> List[str]:
    return [str(WORKER), "--out", str(out), *args]


def run_lightning(out: Path, *args: str) -> str:
    """Lightning starts the second process itself (devices=2)."""
    (proc_out,) = _wait([_start([sys.executable, *_worker(out, *args)], _env())], "lightning")
    return proc_out


def run_torchrun(out: Path, *args: str) -> str:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
        "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
        *_worker(out, *args),
    ]  # fmt: skip
    (proc_out,) = _wait([_start(cmd, _env())], "torchrun")
    return proc_out


def run_slurm(out: Path, *args: str) -> str:
    """What ``srun --ntasks 2 python worker.py`` gives its two tasks on one node: the
    SLURM_* variables Lightning's SLURMEnvironment reads (job id, task and node ids, the
    node list). No real SLURM: the test starts both tasks itself."""
    port = str(free_port())
    procs = []
    for rank in range(2):
        env = _env(
            SLURM_JOB_ID="4242",
            SLURM_JOB_NAME="digits",
            SLURM_NTASKS="2",
            SLURM_NTASKS_PER_NODE="2",
            SLURM_NNODES="1",
            SLURM_NODELIST="127.0.0.1",
            SLURM_PROCID=str(rank),
            SLURM_LOCALID=str(rank),
            SLURM_NODEID="0",
            MASTER_PORT=port,  # SLURMEnvironment's port otherwise derives from the job id
        )
        procs.append(_start([sys.executable, *_worker(out, *args)], env))
    return "\n".join(_wait(procs, "slurm"))


def run_fastpsrun(out: Path, *args: str) -> str:
    cmd = [sys.executable, "-m", "fastps.launch.cli", "-np", "2", sys.executable]
    (proc_out,) = _wait([_start([*cmd, *_worker(out, *args)], _env())], "fastpsrun")
    return proc_out


def _ranks(out: Path, log: str) -> Dict[int, dict]:
    found = {int(f.stem[4:]): json.loads(f.read_text()) for f in out.glob("rank*.json")}
    assert sorted(found) == [0, 1], f"ranks reported {sorted(found)}:\n{log[-6000:]}"
    return found


def _check_job(out: Path, log: str, baseline: float, environment: str, strategy: str) -> dict:
    """Both ranks trained one model on fastps, reduced their logs and match gloo's accuracy."""
    ranks = _ranks(out, log)
    r0, r1 = ranks[0], ranks[1]
    for r in (r0, r1):
        assert r["backend"] == "fastps", r
        assert r["world_size"] == 2 and r["hvd_size"] == 2, r
        assert r["environment"] == environment, r
        assert r["strategy"] == strategy, r
        # sync_dist=True: each rank logged its own rank, the reduction is their mean
        assert r["validate"]["val_rank_mean"] == pytest.approx(0.5), r
        assert r["test"]["test_rank_mean"] == pytest.approx(0.5), r
    assert r0["weights"] == r1["weights"], "the ranks' parameters differ"
    acc = r0["validate"]["val_acc"]
    assert r1["validate"]["val_acc"] == acc
    assert abs(acc - baseline) * 100 <= ACCURACY_POINTS, (acc, baseline)
    assert r0["test"]["test_acc"] == pytest.approx(acc)
    assert r0["predicted"] + r1["predicted"] == 360  # each rank predicts its half
    return r0


@pytest.fixture(scope="module")
def gloo_accuracy(tmp_path_factory: pytest.TempPathFactory) -> float:
    """The reference: the same model, data and seed on DDPStrategy with gloo."""
    out = tmp_path_factory.mktemp("gloo")
    log = run_lightning(out, "--strategy", "ddp-gloo")
    ranks = _ranks(out, log)
    assert ranks[0]["backend"] == "gloo"
    acc = float(ranks[0]["validate"]["val_acc"])
    assert acc > 0.85, f"the reference run did not learn: {acc}"
    return acc


@pytest.fixture(scope="module")
def first_fastps_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("lightning_launch")
    (out / "log.txt").write_text(run_lightning(out, "--strategy", "fastps"))
    return out


def test_lightning_launched(first_fastps_job: Path, gloo_accuracy: float) -> None:
    """Trainer(strategy="fastps", devices=2): fit, validate, test and predict on fastps's
    DistributedOptimizer; the checkpoint is written once, by rank 0."""
    out = first_fastps_job
    log = (out / "log.txt").read_text()
    r0 = _check_job(out, log, gloo_accuracy, "LightningEnvironment", "FastPSStrategy")
    assert r0["optimizer"] == "fastps.torch.lightning.closure_first", r0["optimizer"]
    saves = (out / "saves.log").read_text().split()
    assert saves == ["0", str(out / "digits.ckpt")], saves


def test_torchrun_loads_checkpoint(
    first_fastps_job: Path, gloo_accuracy: float, tmp_path: Path
) -> None:
    """torchrun: trains, then a fresh model and Trainer load the Lightning-launched job's
    checkpoint and validate it to that job's accuracy."""
    ckpt = first_fastps_job / "digits.ckpt"
    log = run_torchrun(tmp_path, "--strategy", "fastps", "--load", str(ckpt))
    r0 = _check_job(tmp_path, log, gloo_accuracy, "TorchElasticEnvironment", "FastPSStrategy")
    first = json.loads((first_fastps_job / "rank0.json").read_text())
    assert r0["loaded"]["val_acc"] == pytest.approx(first["validate"]["val_acc"])


def test_slurm_launched(gloo_accuracy: float, tmp_path: Path) -> None:
    log = run_slurm(tmp_path, "--strategy", "fastps")
    _check_job(tmp_path, log, gloo_accuracy, "SLURMEnvironment", "FastPSStrategy")


def test_fastpsrun_launched(gloo_accuracy: float, tmp_path: Path) -> None:
    log = run_fastpsrun(tmp_path, "--strategy", "fastps")
    _check_job(tmp_path, log, gloo_accuracy, "FastPSEnvironment", "FastPSStrategy")


def test_ddp_strategy_on_fastps_with_comm_hook(gloo_accuracy: float, tmp_path: Path) -> None:
    """DDPStrategy(process_group_backend="fastps", ddp_comm_hook=fastps's hook), torchrun."""
    log = run_torchrun(tmp_path, "--strategy", "ddp-fastps-hook")
    _check_job(tmp_path, log, gloo_accuracy, "TorchElasticEnvironment", "DDPStrategy")


def test_killed_rank_ends_run(tmp_path: Path) -> None:
    """Rank 1 SIGKILLs itself at step 5: rank 0's fit fails with an error naming worker 1,
    well before any timeout, and the job exits non-zero."""
    t0 = time.monotonic()
    proc = _start(
        [sys.executable, *_worker(tmp_path, "--strategy", "fastps", "--die", "1:5")], _env()
    )
    (log,) = _wait([proc], "killed rank")
    took = time.monotonic() - t0
    assert proc.returncode != 0, log[-4000:]
    assert "rank 1: SIGKILL at step 5" in log, log[-4000:]
    m: Optional[re.Match] = re.search(r"SURVIVOR rank 0: (\w+) after ([\d.]+) s: (.*)", log)
    assert m, log[-6000:]
    assert "worker 1 " in m.group(3) or "worker 1:" in m.group(3), m.group(0)
    assert not list(tmp_path.glob("rank*.json")), "a rank finished although its peer died"
    assert took < 120, f"the run took {took:.0f} s to end"
