"""Elastic fastpsrun inside a real SLURM allocation (the SLURM tier's one-node cluster,
tests/envs/slurm.sh): the allocation's node and task slots are the discovery, every worker
is an ``srun`` step of the job (SrunTransport), a worker that dies ends its own step only and
the job goes on without it, ``scancel`` leaves nothing running, and a discovery host outside
the allocation is refused by name. The workers run tests/integration/elastic/train_elastic.py,
whose final parameters match a one-process run of the same steps whatever the world sizes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Set

import pytest
from test_slurm_real import (
    ROOT,
    _fastps_job_ids,
    _fastpsrun,
    _job_env,
    _job_id,
    _job_processes,
    _name,
    _no_process_left,
    _sbatch,
    _scancel_leaves_nothing,
    _wait_for_output,
    _wait_job,
    pytestmark,  # noqa: F401  (root, a SLURM node that takes jobs, the time limit)
)

pytest.importorskip("torch")

ELASTIC = ROOT / "tests" / "integration" / "elastic"
TRAIN = ELASTIC / "train_elastic.py"
sys.path.insert(0, str(ELASTIC))
import train_elastic  # noqa: E402

JOB_WAIT_S = 120.0  # two workers importing torch on a busy 2-core machine, then a few steps


def _node() -> str:
    """The cluster's node (the allocation's only one): slot ids are ``<node>:<index>``."""
    out = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True, timeout=15
    )
    nodes = out.stdout.split()
    assert nodes, f"sinfo lists no node: {out.stderr}"
    return nodes[0]


def _exports(**env: str) -> str:
    return "".join(f"export {k}={v}\n" for k, v in env.items())


def test_elastic_job_survives_a_killed_worker(tmp_path: Path) -> None:
    """``fastpsrun --min-np 1 --max-np 2`` in a batch job of 2 tasks, no discovery named (the
    allocation is it): two srun steps train; the worker of slot 1 SIGKILLs itself at step 5,
    its step ends, the survivor forms the next generation alone and finishes with exit 0 and
    the one-process result."""
    node, steps = _node(), 12
    result = tmp_path / "result.json"
    body = _exports(
        STEPS=str(steps),
        STEP_SLEEP="0.2",
        FAIL_AT=f"{node}:1@5@backward",
        RESULT=str(result),
    )
    body += f"{_fastpsrun()} --min-np 1 --max-np 2 python {TRAIN}"
    name = _name()
    job_id, out = _sbatch(tmp_path, name, body)
    seen: Set[str] = set()
    fields = _wait_job(job_id, JOB_WAIT_S, seen)
    text = out.read_text() if out.exists() else ""
    assert fields.get("JobState") == "COMPLETED", f"job {job_id}: {fields}\n{text[-4000:]}"
    assert fields.get("ExitCode") == "0:0", f"job {job_id}: {fields}\n{text[-4000:]}"
    # Both workers were srun steps on the allocation's node, not local processes.
    for slot in (0, 1):
        assert re.search(rf"started on slot {node}:{slot} \(on {node}, srun pid \d+\)", text), text
    assert f"KILL {node}:1 step=5" in text, text[-4000:]
    assert f"generation 1: 1 workers ({node}:0)" in text, text[-4000:]
    assert "elastic job finished: 1 workers" in text, text[-4000:]
    assert len(seen) >= 2, f"srun steps seen while job {job_id} ran: {seen}\n{text[-4000:]}"
    got = json.loads(result.read_text())
    assert got["size"] == 1
    for got_p, want_p in zip(got["params"], train_elastic.reference(steps)):
        assert got_p == pytest.approx(want_p, rel=1e-9, abs=1e-12)
    _no_process_left(job_id)


def test_scancel_of_an_elastic_job_leaves_nothing_running(tmp_path: Path) -> None:
    """``fastpsrun --slurm --min-np 1`` trains until it is cancelled: slurmd signals the
    batch step (fastpsrun, its schedulers and servers) and every worker step; no process
    of the SLURM job or of the fastps job is left."""
    body = _exports(STEPS="100000", STEP_SLEEP="0.2")
    body += f"{_fastpsrun()} --slurm --min-np 1 --max-np 2 python {TRAIN}"
    name = _name()
    job_id, out = _sbatch(tmp_path, name, body)
    # Both workers train (rank 0 printed a step of a generation of 2): every process is up.
    two = re.compile(r"STEP \d+ size=2")
    _wait_for_output(job_id, out, lambda text: bool(two.search(text)), "train with 2 workers")
    running = _job_processes(job_id)
    kinds = " ".join(running.values())
    assert kinds.count(str(TRAIN)) >= 2 and "fastps.server" in kinds, f"{job_id}: {running}"
    fastps_jobs = _fastps_job_ids(set(running))
    assert fastps_jobs, f"no FASTPS_JOB_ID in job {job_id}'s processes: {running}"
    _scancel_leaves_nothing(job_id, fastps_jobs)


def test_hosts_outside_the_allocation_are_refused(tmp_path: Path) -> None:
    """Under ``--slurm`` a discovery script's hosts and ``-H``'s must be the allocation's
    nodes: one that is not is named, and nothing starts."""
    node = _node()
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\necho {node}:1\necho not-a-node-7:2\n")
    script.chmod(0o755)
    run = f"{_fastpsrun()} --slurm --min-np 1"
    body = (
        f"{run} --host-discovery-script {script} python -c pass; echo DISCOVERY_RC=$?\n"
        f"{run} -H {node}:1,elsewhere-3:1 python -c pass; echo HOSTS_RC=$?\n"
    )
    name = _name()
    cmd = ["salloc", "-n", "1", "-J", name, "-t", "2", "bash", "-c", body]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=_job_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        job_id = _job_id(name, time.monotonic() + 60)
        _wait_job(job_id, 60.0)
        text, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, f"salloc exited {proc.returncode}:\n{text}"
    assert "DISCOVERY_RC=1" in text and "HOSTS_RC=2" in text, text
    assert (
        f"host 'not-a-node-7' from the host discovery script is not in the SLURM allocation "
        f"(job {job_id}: nodes {node})"
    ) in text, text
    assert f"host 'elsewhere-3' from -H is not in the SLURM allocation (job {job_id}" in text
    assert "started on slot" not in text, text
    _no_process_left(job_id)
