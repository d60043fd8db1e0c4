"""Lightning's ``Trainer(strategy="fastps")`` launched by a real ``srun`` (the SLURM tier's
cluster, tests/envs/slurm.sh): ``sbatch`` of ``srun -n 2 python worker.py``; Lightning's
SLURMEnvironment reads the variables srun gives each task. The Lightning tier
(tests/ecosystem/lightning) emulates those variables; this runs them for real. Lightning
comes from tests/envs/lightning.sh, which tests/run.sh runs before this tier."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from test_slurm_real import (
    JOB_WAIT_S,
    ROOT,
    _free_port,
    _job_env,
    _name,
    _no_process_left,
    _wait_job,
    pytestmark,  # noqa: F401  (root, a SLURM node that takes jobs, the time limit)
)

pytest.importorskip("lightning")  # installed into this interpreter by the Lightning tier

WORKER = (
    Path(__file__).resolve().parents[1] / "lightning" / "workers" / "lightning_digits_worker.py"
)


def test_lightning_strategy_under_real_srun(tmp_path: Path) -> None:
    """The batch script asks for ``--ntasks-per-node=2`` (Lightning refuses ``--ntasks``:
    it wants the tasks of each node to match ``devices``)."""
    name = _name()
    out = tmp_path / "ranks"
    out.mkdir()
    log = tmp_path / f"{name}.out"
    script = tmp_path / f"{name}.sh"
    script.write_text(
        "#!/bin/bash\n"
        f"#SBATCH --job-name={name}\n#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=2\n"
        f"#SBATCH --time=5\n#SBATCH --output={log}\ncd {ROOT}\n"
        f"MASTER_PORT={_free_port()} srun --kill-on-bad-exit=1 "
        f"python {WORKER} --out {out} --strategy fastps\n"
    )
    res = subprocess.run(
        ["sbatch", "--parsable", str(script)],
        capture_output=True,
        text=True,
        env=_job_env(),
        timeout=30,
    )
    assert res.returncode == 0, f"sbatch failed: {res.stderr}"
    job_id = res.stdout.strip().split(";")[0]
    fields = _wait_job(job_id, JOB_WAIT_S)
    text = log.read_text() if log.exists() else ""
    assert fields.get("JobState") == "COMPLETED", f"job {job_id}: {fields}\n{text[-4000:]}"
    ranks = {int(f.stem[4:]): json.loads(f.read_text()) for f in out.glob("rank*.json")}
    assert sorted(ranks) == [0, 1], text[-4000:]
    for r in ranks.values():
        assert r["environment"] == "SLURMEnvironment", r
        assert r["strategy"] == "FastPSStrategy" and r["backend"] == "fastps", r
        assert r["world_size"] == 2 and r["hvd_size"] == 2, r
        assert r["validate"]["val_rank_mean"] == pytest.approx(0.5), r  # sync_dist reduced
    assert ranks[0]["weights"] == ranks[1]["weights"]
    # the emulated-SLURM and gloo runs of the Lightning tier reach 0.919 with this seed
    assert ranks[0]["validate"]["val_acc"] > 0.9, ranks[0]["validate"]
    _no_process_left(job_id)
