"""Helpers for the TensorFlow plugin tests: run a worker script as a fastps job."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
WORKERS = HERE / "workers"
ROOT = HERE.parent.parent


def job_env(op_timeout: float = 90) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPS_")}
    env.update(
        {
            "PYTHONUNBUFFERED": "1",
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "TF_ENABLE_ONEDNN_OPTS": "0",
            # A wedged job must fail the test, not hang it: operations give up after this.
            "FASTPS_OP_TIMEOUT": str(op_timeout),
        }
    )
    return env


def fastpsrun(
    n: int,
    argv: List[str],
    timeout: float = 240,
    num_servers: int = 1,
    op_timeout: Optional[float] = None,
    env: Optional[Dict[str, str]] = None,
) -> subprocess.CompletedProcess:
    """Runs ``python argv...`` as ``n`` workers under fastpsrun and returns the finished run.

    The job gets its own process group, killed as a whole if it outlives ``timeout``.
    """
    cmd = [
        sys.executable,
        "-m",
        "fastps.launcher",
        "-np",
        str(n),
        "--num-servers",
        str(num_servers),
        sys.executable,
        *argv,
    ]
    extra = env or {}
    env = job_env() if op_timeout is None else job_env(op_timeout)
    env.update(extra)
    p = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=str(ROOT),
        start_new_session=True,
    )
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        err += f"\n(killed after {timeout} s)"
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def tail(p: subprocess.CompletedProcess, chars: int = 6000) -> str:
    return (
        f"rc={p.returncode}\n--- stdout ---\n{p.stdout[-chars:]}\n"
        f"--- stderr ---\n{p.stderr[-chars:]}"
    )


# Groups of checks that share one 2-worker job (workers/shared_checks.py runs them in turn in
# one process), so that TensorFlow starts once per worker for the group rather than once per
# check. Each group's checks run with the same settings (fastpsrun's defaults; one Keras: Keras
# 2 is chosen before TensorFlow is imported). A test takes its check's output through the
# ``shared_check`` fixture (conftest.py) and keeps its own assertions on it. The order matters:
# tf_train_worker.py counts the fusion buckets of the core session, so it comes first;
# tf_cross_barrier_worker.py makes float64 Keras's default type, and the Keras 2 syncbn's
# "graph" mode turns eager execution off, so these come last.
SHARED_GROUPS: Dict[str, List[Tuple[str, List[str]]]] = {
    "keras3": [
        ("train", ["tf_train_worker.py", "tape,tape-eager,tape-grouped,fit,fit-grouped"]),
        ("api", ["tf_api_worker.py"]),
        ("compression", ["tf_compression_worker.py"]),
        ("alias", ["keras_alias_worker.py"]),
        ("sfb", ["tf_sfb_worker.py"]),
        ("elastic-state", ["tf_elastic_state_worker.py", "keras3"]),
        ("aggregation", ["tf_keras_aggregation_worker.py", "keras3"]),
        ("compute-gradients", ["tf_keras_compute_gradients_worker.py", "keras3"]),
        ("layers", ["tf_layers_worker.py", "syncbn,partial"]),
        ("local-sgd", [str(HERE / "test_tf_local_sgd.py"), "worker"]),
        ("keras-digits", [str(ROOT / "examples" / "tensorflow" / "keras_digits.py")]),
        ("tape-digits", [str(ROOT / "examples" / "tensorflow" / "tape_digits.py")]),
        ("cross-barrier", ["tf_cross_barrier_worker.py", "6"]),
    ],
    "keras2": [
        ("fit", ["tf_keras2_worker.py"]),
        ("elastic-state", ["tf_elastic_state_worker.py", "keras2"]),
        ("aggregation", ["tf_keras_aggregation_worker.py", "keras2"]),
        ("compute-gradients", ["tf_keras_compute_gradients_worker.py", "keras2"]),
        ("syncbn-eager", ["tf_keras2_syncbn_worker.py", "eager"]),
        ("syncbn-graph", ["tf_keras2_syncbn_worker.py", "graph"]),
    ],
}
SHARED_WORKERS = 2
SHARED_TIMEOUT = 840.0  # the whole group's job (each check alone had 240 s)

_MARK = re.compile(r"^\[worker (\d+)\] @@check (begin|end) (\S+)(?: rc=(-?\d+))?$")
_WORKER_LINE = re.compile(r"^\[worker (\d+)\] ")


def shared_job(
    checks: Sequence[Tuple[str, List[str]]],
    n: int = SHARED_WORKERS,
    timeout: float = SHARED_TIMEOUT,
) -> Dict[str, subprocess.CompletedProcess]:
    """Runs ``checks`` ((name, [script, arg...]) each) in turn in one ``n``-worker job and
    returns each check's share of it: the lines every worker printed between the check's
    markers (stdout and stderr apart), with return code 0 when the check ended without an
    error on every worker. A check that did not end on every worker gets the job's return
    code (1 if that was 0) and, in its stderr, the job's last lines before its own and a
    line saying where the job stopped."""
    spec = json.dumps([[name, *argv] for name, argv in checks])
    job = fastpsrun(n, [str(WORKERS / "shared_checks.py"), spec], timeout=timeout)
    names = [name for name, _ in checks]
    seg: Dict[str, Dict[str, List[str]]] = {c: {"stdout": [], "stderr": []} for c in names}
    ended: Dict[str, Dict[int, int]] = {c: {} for c in names}
    for stream in ("stdout", "stderr"):
        current: Dict[int, Optional[str]] = {}
        for line in getattr(job, stream).splitlines():
            m = _MARK.match(line)
            if m and m.group(3) in seg:
                rank, name = int(m.group(1)), m.group(3)
                if m.group(2) == "begin":
                    current[rank] = name
                else:
                    current[rank] = None
                    ended[name][rank] = int(m.group(4))
                continue
            w = _WORKER_LINE.match(line)
            name = current.get(int(w.group(1))) if w else None
            if name is not None:
                seg[name][stream].append(line)
    out: Dict[str, subprocess.CompletedProcess] = {}
    for name in names:
        stdout = "\n".join(seg[name]["stdout"]) + "\n"
        stderr = "\n".join(seg[name]["stderr"]) + "\n"
        rcs = ended[name]
        if len(rcs) == n and not any(rcs.values()):
            rc = 0
        else:
            rc = job.returncode or 1
            if len(rcs) == n:  # ended, with an error: the check's own lines say which
                where = f"check {name!r} failed on workers {sorted(r for r in rcs if rcs[r])}"
            else:
                where = f"check {name!r} did not end on workers {sorted(set(range(n)) - set(rcs))}"
            # The job's last lines first, this check's own after them and the summary last:
            # what tail() shows is the end.
            stderr = (
                f"--- the shared job's last stdout lines ---\n{job.stdout[-1500:]}\n"
                f"--- the shared job's last stderr lines ---\n{job.stderr[-1500:]}\n"
                f"--- check {name!r}'s own stderr lines ---\n{stderr}"
                f"{where} in the shared job of checks {names} (workers/shared_checks.py), "
                f"which exited {job.returncode}\n"
            )
        out[name] = subprocess.CompletedProcess(job.args, rc, stdout, stderr)
    return out
