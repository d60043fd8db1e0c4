"""Servers that die and join a running job (FASTPS_ELASTIC_SERVERS=1) with real processes:
fastpsrun, SIGKILLed servers, a server started by hand with the settings fastpsrun wrote.
No worker rolls back: every run must end with the parameters of the same training in one
process (float tolerance: a server adds the workers' parts in arrival order), within a
bounded time."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
TRAIN = HERE / "train_servers.py"
sys.path.insert(0, str(HERE))
import train_servers  # noqa: E402

RUN_TIMEOUT = 240


def run_job(tmp_path, env, np_, servers, extra, timeout=RUN_TIMEOUT):
    """fastpsrun with elastic servers; TMPDIR is where it writes the new servers' settings."""
    result = tmp_path / "result.json"
    full = {**env, **extra, "RESULT": str(result), "FASTPS_ELASTIC_SERVERS": "1"}
    full["TMPDIR"] = str(tmp_path)
    cmd = [sys.executable, "-m", "fastps.launcher", "-np", str(np_), "--num-servers"]
    cmd += [str(servers), sys.executable, str(TRAIN)]
    proc = subprocess.run(cmd, env=full, capture_output=True, text=True, timeout=timeout)
    out = json.loads(result.read_text()) if result.exists() else None
    return proc.returncode, proc.stdout + proc.stderr, out


def assert_params(out, want, tol):
    assert out is not None
    for got, ref in zip(out["params"], want):
        np.testing.assert_allclose(np.asarray(got, dtype=np.float32), ref, rtol=0, atol=tol)


@pytest.mark.parametrize("mode", ["numpy", "torch"])
def test_killed_servers_move_their_keys_without_rollback(tmp_path, subprocess_env, mode):
    if mode == "torch":
        pytest.importorskip("torch")
    steps = 40
    extra = {"MODE": mode, "STEPS": str(steps), "KILL": "8:1,20:2"}
    rc, output, out = run_job(tmp_path, subprocess_env, 3, 3, extra)
    assert rc == 0, output[-4000:]
    assert [c["server"] for c in out["changes"]] == [[1], [2]]
    assert out["epoch"] == 2 and out["core_servers"] == 1
    ref = (train_servers.torch_reference if mode == "torch" else train_servers.numpy_reference)(
        steps, 3
    )
    assert_params(out, ref, 1e-5)
    for c in out["changes"]:
        assert c["seconds"] < 5.0, out["changes"]


def test_two_servers_killed_at_once(tmp_path, subprocess_env):
    """The second death may come while the workers move to the servers of the first."""
    steps = 30
    extra = {"STEPS": str(steps), "KILL": "8:1+2"}
    rc, output, out = run_job(tmp_path, subprocess_env, 3, 3, extra)
    assert rc == 0, output[-4000:]
    assert out["epoch"] == 2 and out["core_servers"] == 1
    assert_params(out, train_servers.numpy_reference(steps, 3), 1e-5)


def test_added_server_gets_its_share_from_the_next_round(tmp_path, subprocess_env):
    steps = 40
    extra = {"STEPS": str(steps), "KILL": "6:1", "ADD": "18:9"}
    rc, output, out = run_job(tmp_path, subprocess_env, 2, 2, extra)
    assert rc == 0, output[-4000:]
    assert "server 9" in output and "joined" in output
    assert out["epoch"] == 2 and out["core_servers"] == 2  # server 0 and the new server 9
    assert_params(out, train_servers.numpy_reference(steps, 2), 1e-6)


def test_losing_the_last_server_ends_the_job_clearly(tmp_path, subprocess_env):
    extra = {"STEPS": "30", "KILL": "5:0"}
    rc, output, out = run_job(tmp_path, subprocess_env, 2, 1, extra, timeout=120)
    assert rc != 0
    assert "server 0" in output and "died" in output, output[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT + 180)
def test_elastic_servers_with_elastic_workers(tmp_path, subprocess_env):
    """Both kinds of membership change in one torch run: a server SIGKILLed (its keys move,
    no rollback), a worker SIGKILLed mid-backward (rollback, the next generation forms with
    2 workers and the 2 servers left), a server added by hand to that generation, and a
    worker added through the discovery script (the next generation: 3 workers, 3
    servers). The final parameters must equal one process running the same steps."""
    pytest.importorskip("torch")
    import test_elastic

    hosts, script = test_elastic._discovery(tmp_path, "localhost:3")
    steps = 50
    env = {**subprocess_env, "FASTPS_ELASTIC_SERVERS": "1", "TMPDIR": str(tmp_path)}
    args = ["-np", "3", "--min-np", "2", "--max-np", "3", "--num-servers", "3"]
    args += ["--host-discovery-script", str(script), "--elastic-timeout", "60"]
    proc, out = test_elastic.run_elastic(
        tmp_path,
        env,
        args,
        {
            "STEPS": str(steps),
            "KILL_SERVER_AT": "4",
            "FAIL_AT": "localhost:2@8@backward",
            "GROW_AT": f"16@{hosts}@localhost:4",
            "ADD_SERVER_AT": "12@7@1",
            "HOLD_FOR_SIZE": "3@17@240",
        },
        timeout=RUN_TIMEOUT + 60,
    )
    show = test_elastic._show(proc)
    assert proc.returncode == 0, show
    assert "KILL server" in proc.stdout and "ADD server id=7" in proc.stdout, show
    # The server's death moved its keys within generation 0 (no new generation for it).
    assert "server 0" in proc.stderr and "server epoch 1" in proc.stderr, show
    assert "generation 1: 2 workers (localhost:0, localhost:1)" in proc.stderr, show
    assert "SERVER_EPOCH 1" in proc.stdout, show  # server 7 joined generation 1
    servers = dict(re.findall(r"generation (\d+): servers (.*)", proc.stderr))
    assert servers["0"].count("pid") == 3, servers
    assert servers["1"].count("pid") == 2, servers  # the killed server is not replaced
    assert servers["2"].count("pid") == 3, servers  # the added one counts
    sizes = test_elastic.sizes_by_step(proc.stdout)
    assert sizes[1] == 3 and sizes[steps] == 3 and 2 in sizes.values(), sizes
    test_elastic.assert_reference(out, steps)


def test_hand_started_roles_with_elastic_servers(tmp_path, subprocess_env):
    """The roles started by hand as docs/reference/configuration.md describes (no fastpsrun):
    with FASTPS_ELASTIC_SERVERS=1 the standalone scheduler (`python -m fastps`) lets a
    SIGKILLed server's keys move to the others instead of aborting the job (it once built
    its Scheduler without the setting), the workers end with the reference parameters, and
    every role exits 0."""
    import secrets
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    steps, nw, ns = 30, 2, 3
    base = {k: v for k, v in subprocess_env.items() if not k.startswith("FASTPS_")}
    base.update(
        PYTHONPATH=subprocess_env.get("PYTHONPATH", ""),
        PYTHONUNBUFFERED="1",
        FASTPS_SCHEDULER_ADDR=f"127.0.0.1:{port}",
        FASTPS_JOB_ID="byhand" + secrets.token_hex(3),
        FASTPS_TOKEN=secrets.token_hex(16),
        FASTPS_NUM_WORKERS=str(nw),
        FASTPS_NUM_SERVERS=str(ns),
        FASTPS_ELASTIC_SERVERS="1",
        FASTPS_HOST="127.0.0.1",
    )
    result = tmp_path / "result.json"
    procs = {}

    def start(name, argv, **env):
        log = open(tmp_path / f"{name}.log", "w")
        procs[name] = subprocess.Popen(
            [sys.executable, *argv], env={**base, **env}, stdout=log, stderr=subprocess.STDOUT
        )

    try:
        start("scheduler", ["-m", "fastps"], FASTPS_ROLE="scheduler")
        for sid in range(ns):
            start(
                f"server{sid}",
                ["-m", "fastps.server"],
                FASTPS_ROLE="server",
                FASTPS_SERVER_ID=str(sid),
            )
        for rank in range(nw):
            start(
                f"worker{rank}",
                [str(TRAIN)],
                FASTPS_ROLE="worker",
                FASTPS_RANK=str(rank),
                MODE="numpy",
                STEPS=str(steps),
                KILL="8:1",
                RESULT=str(result),
            )
        codes = {
            name: p.wait(timeout=RUN_TIMEOUT)
            for name, p in procs.items()
            if name.startswith("worker")
        }
        codes.update(
            {name: p.wait(timeout=60) for name, p in procs.items() if not name.startswith("worker")}
        )
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    logs = "\n".join(f"--- {f.name}\n{f.read_text()[-1500:]}" for f in tmp_path.glob("*.log"))
    assert codes.pop("server1") == -9, logs  # the one rank 0 killed
    assert all(rc == 0 for rc in codes.values()), (codes, logs)
    out = json.loads(result.read_text())
    assert [c["server"] for c in out["changes"]] == [[1]]
    assert out["epoch"] == 1 and out["core_servers"] == 2
    assert_params(out, train_servers.numpy_reference(steps, nw), 1e-5)
    assert "aborting job" not in logs
