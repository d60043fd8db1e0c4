"""Elastic training with real processes: fastpsrun --host-discovery-script, workers killed
(SIGKILL) and added while a torch model trains. Each run must end with the parameters of
a single-process run of the same steps (the global batch is split evenly over any world,
see train_elastic.py), and within a bounded time."""

from __future__ import annotations

import json
import re
import stat
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

pytest.importorskip("torch")

HERE = Path(__file__).resolve().parent
TRAIN = HERE / "train_elastic.py"
TRAIN_SAMPLER = HERE / "train_sampler.py"
sys.path.insert(0, str(HERE))
import train_elastic  # noqa: E402

RUN_TIMEOUT = 240


def _discovery(tmp_path: Path, text: str) -> tuple[Path, Path]:
    hosts = tmp_path / "hosts"
    hosts.write_text(text.replace(";", "\n") + "\n")
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {hosts}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return hosts, script


def run_elastic(tmp_path, env, args, extra_env, timeout=RUN_TIMEOUT):
    result = tmp_path / "result.json"
    full_env = {**env, **extra_env, "RESULT": str(result)}
    cmd = [sys.executable, "-m", "fastps.launcher", *args, sys.executable, str(TRAIN)]
    proc = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout)
    out = json.loads(result.read_text()) if result.exists() else None
    return proc, out


def assert_reference(out, steps):
    want = train_elastic.reference(steps)
    for got_p, want_p in zip(out["params"], want):
        assert got_p == pytest.approx(want_p, rel=1e-9, abs=1e-12)


def sizes_by_step(stdout: str) -> dict:
    return {int(m.group(1)): int(m.group(2)) for m in re.finditer(r"STEP (\d+) size=(\d+)", stdout)}


def recovery_seconds(stdout: str) -> list:
    """From each KILL to rank 0's next finished step."""
    kills = [
        float(m.group(1)) for m in re.finditer(r"KILL \S+ step=\d+ where=\w+ t=([\d.]+)", stdout)
    ]
    steps = [float(m.group(1)) for m in re.finditer(r"STEP \d+ size=\d+ t=([\d.]+)", stdout)]
    return [min(t for t in steps if t > k) - k for k in kills if any(t > k for t in steps)]


def _show(proc):
    return f"rc={proc.returncode}\nSTDOUT:\n{proc.stdout[-6000:]}\nSTDERR:\n{proc.stderr[-6000:]}"


@pytest.mark.slow
def test_killed_worker_training_finishes_smaller(tmp_path, subprocess_env):
    _, script = _discovery(tmp_path, "localhost:3")
    steps = 24
    proc, out = run_elastic(
        tmp_path,
        subprocess_env,
        [
            "--min-np",
            "2",
            "--max-np",
            "3",
            "--host-discovery-script",
            str(script),
            "--elastic-timeout",
            "60",
            "--num-servers",
            "1",
        ],
        {"STEPS": str(steps), "FAIL_AT": "localhost:0@8@backward"},
    )
    assert proc.returncode == 0, _show(proc)
    sizes = sizes_by_step(proc.stdout)
    assert sizes[1] == 3 and sizes[steps] == 2, sizes
    assert out["size"] == 2
    assert_reference(out, steps)
    assert "generation 1: 2 workers" in proc.stderr, _show(proc)
    rec = recovery_seconds(proc.stdout)
    assert len(rec) == 1 and rec[0] < 30, rec
    print("recovery after SIGKILL:", rec)


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["localhost:1", "localhost:0"], ids=["rank1", "rank0"])
def test_hung_worker_is_left_behind_on_the_schedulers_verdict(tmp_path, subprocess_env, victim):
    """A worker that hangs (SIGSTOP inside its backward pass) never exits on its own: once
    the scheduler declares it lost (heartbeat timeout), the next generation forms from the
    two live workers at once, without waiting for its process or for the rendezvous timeout
    (--elastic-timeout 60 would fail the test's time bound), and the run ends with the
    parameters of the reference; the hung process is stopped, not left behind."""
    _, script = _discovery(tmp_path, "localhost:3")
    steps = 16
    heartbeat = 3.0
    proc, out = run_elastic(
        tmp_path,
        subprocess_env,
        [
            "--min-np",
            "2",
            "--max-np",
            "3",
            "--host-discovery-script",
            str(script),
            "--elastic-timeout",
            "60",
            "--num-servers",
            "1",
        ],
        {
            "STEPS": str(steps),
            "FAIL_AT": f"{victim}@6@hang",
            "FASTPS_HEARTBEAT_INTERVAL": "0.5",
            "FASTPS_HEARTBEAT_TIMEOUT": str(heartbeat),
        },
        timeout=120,
    )
    assert proc.returncode == 0, _show(proc)
    assert re.search(
        rf"worker on slot {victim} \(rank \d, pid \d+\) lost: .*heartbeat", proc.stderr
    ), _show(proc)
    assert "generation 1: 2 workers" in proc.stderr and "generation 2" not in proc.stderr
    sizes = sizes_by_step(proc.stdout)
    assert sizes[1] == 3 and sizes[steps] == 2, sizes
    assert_reference(out, steps)
    rec = recovery_seconds(proc.stdout)
    print("recovery after SIGSTOP:", rec)
    # heartbeat timeout + 2 s to form the generation, + one rolled-back step (0.1 s sleep)
    assert len(rec) == 1 and rec[0] < heartbeat + 2 + 1.5, rec


@pytest.mark.slow
def test_async_training_survives_a_killed_worker(tmp_path, subprocess_env):
    """Async mode (docs/guide/async.md): the servers keep the parameters, and a membership change
    brings a generation with new servers, which hold none. The optimizer starts them again
    from rank 0's restored parameters at its first step in the new generation; before, every
    update of the new generation failed ("before rank 0 set its initial parameters") and the
    job reset until it gave up. The sums are not compared with a reference: async workers
    apply each other's deltas, not an average."""
    _, script = _discovery(tmp_path, "localhost:3")
    steps = 16
    proc, out = run_elastic(
        tmp_path,
        subprocess_env,
        [
            "--min-np",
            "2",
            "--max-np",
            "3",
            "--host-discovery-script",
            str(script),
            "--elastic-timeout",
            "60",
            "--num-servers",
            "1",
            "--reset-limit",
            "3",
        ],
        {
            "STEPS": str(steps),
            "FAIL_AT": "localhost:0@6@backward",
            "FASTPS_MODE": "async",
            "FASTPS_STALENESS": "0",
        },
    )
    assert proc.returncode == 0, _show(proc)
    sizes = sizes_by_step(proc.stdout)
    assert sizes[1] == 3 and sizes[steps] == 2, sizes
    assert "generation 1: 2 workers" in proc.stderr and "generation 2" not in proc.stderr
    assert out["size"] == 2
    assert all(abs(x) < 1e6 for p in out["params"] for x in p), out


@pytest.mark.slow
def test_two_failures_in_a_row_and_failure_during_commit(tmp_path, subprocess_env):
    _, script = _discovery(tmp_path, "localhost:4")
    steps = 24
    proc, out = run_elastic(
        tmp_path,
        subprocess_env,
        [
            "-np",
            "4",
            "--min-np",
            "1",
            "--host-discovery-script",
            str(script),
            "--elastic-timeout",
            "60",
        ],
        {"STEPS": str(steps), "FAIL_AT": "localhost:3@6@commit,localhost:1@7@backward"},
    )
    assert proc.returncode == 0, _show(proc)
    sizes = sizes_by_step(proc.stdout)
    assert sizes[1] == 4 and sizes[steps] == 2, sizes
    assert_reference(out, steps)
    assert "generation 2: 2 workers" in proc.stderr, _show(proc)


@pytest.mark.slow
def test_failure_during_recovery(tmp_path, subprocess_env):
    """One worker dies in a commit, another while the next generation syncs (the recovery),
    a third two steps later: the last worker finishes alone."""
    _, script = _discovery(tmp_path, "localhost:4")
    steps = 16
    proc, out = run_elastic(
        tmp_path,
        subprocess_env,
        ["-np", "4", "--min-np", "1", "--host-discovery-script", str(script),
         "--elastic-timeout", "60"],
        {
            "STEPS": str(steps),
            "FAIL_AT": "localhost:3@6@commit,localhost:1@-1@reset,localhost:2@8@backward",
        },
    )  # fmt: skip
    assert proc.returncode == 0, _show(proc)
    sizes = sizes_by_step(proc.stdout)
    assert sizes[1] == 4 and sizes[steps] == 1, sizes
    assert_reference(out, steps)
    assert "where=reset" in proc.stdout, _show(proc)
    assert "generation 3: 1 workers (localhost:0)" in proc.stderr, _show(proc)


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT + 120)
def test_worker_added_by_discovery_joins_at_commit(tmp_path, subprocess_env):
    hosts, script = _discovery(tmp_path, "localhost:2")
    steps = 30
    proc, out = run_elastic(
        tmp_path,
        subprocess_env,
        [
            "--min-np",
            "2",
            "--max-np",
            "4",
            "--host-discovery-script",
            str(script),
            "--elastic-timeout",
            "60",
        ],
        {
            "STEPS": str(steps),
            "STEP_SLEEP": "0.2",
            "GROW_AT": f"4@{hosts}@localhost:3",
            # the joiner's start-up (torch's import) takes minutes on a loaded machine
            "HOLD_FOR_SIZE": "3@6@240",
        },
        timeout=RUN_TIMEOUT + 60,
    )
    assert proc.returncode == 0, _show(proc)
    sizes = sizes_by_step(proc.stdout)
    assert sizes[1] == 2 and sizes[steps] == 3, sizes
    assert out["size"] == 3 and out["resets"] and out["resets"][-1][0] == 3
    assert_reference(out, steps)


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT + 120)
def test_spare_workers_take_the_failed_ranks(tmp_path, subprocess_env):
    """--spare-hosts 1: a spare worker started with the others waits outside the job (its
    start-up is no host update); when the worker of rank 1 dies, the spare takes rank 1 and
    the world keeps its 3 workers. fastpsrun starts a new spare on the next free slot;
    when rank 0 dies, that spare comes last (rank 0 must be a survivor: it holds the
    committed state that sync() broadcasts)."""
    _, script = _discovery(tmp_path, "localhost:5")
    steps = 30
    args = ["-np", "3", "--min-np", "3", "--max-np", "3", "--spare-hosts", "1"]
    args += ["--host-discovery-script", str(script), "--elastic-timeout", "120"]
    proc, out = run_elastic(
        tmp_path,
        subprocess_env,
        args,
        {"STEPS": str(steps), "FAIL_AT": "localhost:1@6@backward,localhost:0@16@backward"},
        timeout=RUN_TIMEOUT + 60,
    )
    assert proc.returncode == 0, _show(proc)
    err = proc.stderr
    assert "spare worker 3 started on slot localhost:3" in err, _show(proc)
    assert "spare worker on slot localhost:3 replaces the worker on slot localhost:1" in err
    assert "generation 1: 3 workers (localhost:0, localhost:3, localhost:2)" in err, _show(proc)
    assert "spare worker 4 started on slot localhost:4" in err, _show(proc)
    assert "generation 2: 3 workers (localhost:3, localhost:2, localhost:4)" in err, _show(proc)
    assert "generation 3" not in err, _show(proc)  # a spare's start-up is no host update
    sizes = sizes_by_step(proc.stdout)
    assert set(sizes.values()) == {3}, sizes
    assert_reference(out, steps)
    print("recovery after SIGKILL with a spare:", recovery_seconds(proc.stdout))


def test_spare_hosts_need_discovery_script(subprocess_env):
    proc = subprocess.run(
        [sys.executable, "-m", "fastps.launcher", "-np", "2", "--spare-hosts", "1", "true"],
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "--spare-hosts need --host-discovery-script" in proc.stderr


@pytest.mark.slow
def test_killed_server_is_replaced_by_the_next_generation(tmp_path, subprocess_env):
    """A server killed mid-training aborts its generation; the workers roll back to their
    last commit and the next generation starts fresh servers (FASTPS_SHM=0: every part
    crosses TCP to the server, so its death is felt at once)."""
    _, script = _discovery(tmp_path, "localhost:2")
    steps = 16
    proc, out = run_elastic(
        tmp_path,
        {**subprocess_env, "FASTPS_SHM": "0"},
        ["--min-np", "2", "--host-discovery-script", str(script), "--elastic-timeout", "60"],
        {"STEPS": str(steps), "KILL_SERVER_AT": "6"},
    )
    assert proc.returncode == 0, _show(proc)
    assert "KILL server" in proc.stdout, _show(proc)
    assert "generation 1: 2 workers" in proc.stderr, _show(proc)
    assert_reference(out, steps)


def test_below_min_np_fails_clearly(tmp_path, subprocess_env):
    _, script = _discovery(tmp_path, "localhost:1")
    proc, _ = run_elastic(
        tmp_path,
        subprocess_env,
        ["--min-np", "2", "--host-discovery-script", str(script), "--elastic-timeout", "3"],
        {"STEPS": "3"},
        timeout=60,
    )
    assert proc.returncode != 0
    assert "below --min-np 2" in proc.stderr, _show(proc)


def test_elastic_flags_need_discovery_script(subprocess_env):
    proc = subprocess.run(
        [sys.executable, "-m", "fastps.launcher", "-np", "2", "--min-np", "1", "true"],
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "--min-np need --host-discovery-script" in proc.stderr


def test_bad_discovery_output_is_named(tmp_path, subprocess_env):
    _, script = _discovery(tmp_path, "localhost:x")
    proc, _ = run_elastic(
        tmp_path,
        subprocess_env,
        ["--min-np", "1", "--host-discovery-script", str(script)],
        {},
        timeout=60,
    )
    assert proc.returncode != 0
    assert "'localhost:x' is not 'host:slots'" in proc.stderr, _show(proc)


@pytest.mark.slow
def test_host_blacklisting_stops_the_failed_hosts_other_workers(tmp_path, subprocess_env):
    """--blacklist host (Horovod's rule): localhost:0 dies, so localhost:1 is stopped too
    and the worker on the other host (127.0.0.1) finishes alone, from the last commit."""
    _, script = _discovery(tmp_path, "localhost:2;127.0.0.1:1")
    steps = 12
    proc, out = run_elastic(
        tmp_path,
        subprocess_env,
        ["--min-np", "1", "--host-discovery-script", str(script), "--elastic-timeout", "60",
         "--blacklist", "host"],
        {"STEPS": str(steps), "FAIL_AT": "localhost:0@4@backward"},
    )  # fmt: skip
    assert proc.returncode == 0, _show(proc)
    assert "host localhost blacklisted for the rest of the job" in proc.stderr, _show(proc)
    assert "stopping the worker on slot localhost:1" in proc.stderr, _show(proc)
    assert "generation 1: 1 workers (127.0.0.1:0)" in proc.stderr, _show(proc)
    sizes = sizes_by_step(proc.stdout)
    assert sizes[1] == 3 and sizes[steps] == 1, sizes
    assert_reference(out, steps)


def test_reset_limit_stops_the_job(tmp_path, subprocess_env):
    _, script = _discovery(tmp_path, "localhost:2")
    proc, _ = run_elastic(
        tmp_path,
        subprocess_env,
        ["--min-np", "1", "--host-discovery-script", str(script), "--elastic-timeout", "60",
         "--reset-limit", "0"],
        {"STEPS": "8", "STEP_SLEEP": "0", "FAIL_AT": "localhost:1@2@backward"},
    )  # fmt: skip
    assert proc.returncode != 0, _show(proc)
    assert "resets exceeded --reset-limit 0" in proc.stderr, _show(proc)


def _restored_slots(stdout: str) -> set:
    return set(re.findall(r"(?:RESTORE|RESET) slot=(\S+)", stdout))


def _in_place_job(tmp_path: Path) -> List[str]:
    """fastpsrun's arguments for the in-place tests: 3 workers and 1 spare on 4 slots."""
    _, script = _discovery(tmp_path, "localhost:4")
    args = ["-np", "3", "--min-np", "3", "--max-np", "3", "--spare-hosts", "1"]
    return args + ["--host-discovery-script", str(script), "--elastic-timeout", "120"]


@pytest.mark.timeout(RUN_TIMEOUT + 120)
def test_spare_replaces_in_place_without_rollback(tmp_path, subprocess_env):
    """FASTPS_ELASTIC_INPLACE=1, --spare-hosts 1: the worker of rank 1 dies inside the
    first step after a commit (a gradient of its step pushed, the other not). The
    survivors stay inside that step's optimizer.step(): no restore, no reset callback;
    the spare takes rank 1, gets the commit and computes that step's gradient, and the
    training ends with the parameters of an undisturbed run."""
    steps = 14
    args = _in_place_job(tmp_path)
    proc, out = run_elastic(
        tmp_path,
        subprocess_env,
        args,
        {"STEPS": str(steps), "FAIL_AT": "localhost:1@6@backward", "FASTPS_ELASTIC_INPLACE": "1"},
        timeout=RUN_TIMEOUT + 60,
    )
    assert proc.returncode == 0, _show(proc)
    err = proc.stderr
    assert "spare worker on slot localhost:3 replaces the worker on slot localhost:1" in err
    assert "in-place replacement: granted" in err, _show(proc)
    assert "generation 1: 3 workers (localhost:0, localhost:3, localhost:2)" in err, _show(proc)
    # Nobody rolled back: the survivors' restore and reset callbacks never ran.
    assert not _restored_slots(proc.stdout), _show(proc)
    assert out["resets"] == [], out["resets"]
    # rank 0's step counter went on: every step finished once, in order.
    done = [int(m) for m in re.findall(r"STEP (\d+) size=3", proc.stdout)]
    assert done == list(range(1, steps + 1)), done
    assert_reference(out, steps)
    print("in place: SIGKILL -> next step:", recovery_seconds(proc.stdout))


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT + 120)
def test_in_place_falls_back_to_rollback_after_an_update(tmp_path, subprocess_env):
    """Commits every 2 steps; the worker of rank 1 dies in the second step after a
    commit, when the survivors have applied an update the commit does not hold: in place
    would be wrong, so they roll back (a log line says why) and the run is still exact."""
    steps = 12
    args = _in_place_job(tmp_path)
    proc, out = run_elastic(
        tmp_path,
        subprocess_env,
        args,
        {
            "STEPS": str(steps),
            "FAIL_AT": "localhost:1@7@backward",
            "COMMIT_EVERY": "2",
            "FASTPS_ELASTIC_INPLACE": "1",
        },
        timeout=RUN_TIMEOUT + 60,
    )
    assert proc.returncode == 0, _show(proc)
    assert "in-place replacement: granted" not in proc.stderr, _show(proc)
    assert "an update was applied since the last commit" in proc.stderr, _show(proc)
    assert {"localhost:0", "localhost:2"} <= _restored_slots(proc.stdout), _show(proc)
    assert_reference(out, steps)


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT + 120)
def test_in_place_refused_when_rank_0_is_lost(tmp_path, subprocess_env):
    """Rank 0 dies inside the first step after a commit: the survivors ask to stay in
    place and join the next generation, but every rank moves (rank 0 must be a survivor),
    so fastpsrun refuses; already in the new generation, they roll back there (restore,
    reset callbacks, sync from the new rank 0) and the run is exact."""
    steps = 12
    args = _in_place_job(tmp_path)
    proc, out = run_elastic(
        tmp_path,
        subprocess_env,
        args,
        {"STEPS": str(steps), "FAIL_AT": "localhost:0@6@backward", "FASTPS_ELASTIC_INPLACE": "1"},
        timeout=RUN_TIMEOUT + 60,
    )
    assert proc.returncode == 0, _show(proc)
    err = proc.stderr
    assert "in-place replacement: refused (rank 0 was lost" in err, _show(proc)
    assert "generation 1: 3 workers (localhost:1, localhost:2, localhost:3)" in err, _show(proc)
    assert "refused by fastpsrun (rank 0 was lost" in err, _show(proc)
    assert _restored_slots(proc.stdout) == {"localhost:1", "localhost:2"}, _show(proc)
    assert_reference(out, steps)


@pytest.mark.timeout(RUN_TIMEOUT + 120)
def test_in_place_spare_reads_the_lost_ranks_samples(tmp_path, subprocess_env):
    """The same with the data read through an ElasticSampler: the survivors keep their
    shards, the spare takes the lost rank's shard where it was (mid-epoch), and the run
    ends with the parameters of an undisturbed 3-worker run over the same sample order."""
    import train_sampler

    result = tmp_path / "result.json"
    args = _in_place_job(tmp_path)
    env = {
        **subprocess_env,
        "FAIL_AT": "localhost:1@9",  # epoch 1, its fourth step
        "FASTPS_ELASTIC_INPLACE": "1",
        "RESULT": str(result),
    }
    cmd = [sys.executable, "-m", "fastps.launcher", *args, sys.executable, str(TRAIN_SAMPLER)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert proc.returncode == 0, _show(proc)
    assert "in-place replacement: granted" in proc.stderr, _show(proc)
    assert not _restored_slots(proc.stdout), _show(proc)
    got = json.loads(result.read_text())["params"]
    for got_p, want_p in zip(got, train_sampler.reference(3)):
        assert got_p == pytest.approx(want_p, rel=1e-9, abs=1e-12)


@pytest.mark.timeout(RUN_TIMEOUT + 120)
def test_in_place_at_any_step(tmp_path, subprocess_env):
    """FASTPS_ELASTIC_INPLACE=any, commits every 4 steps: the worker of rank 1 dies in the
    third step after a commit. The survivors stay in place anyway: the spare gets rank
    0's state as it is in that step (parameters and optimizer state before the step's
    update, the step counter), not the commit, so nobody does the two steps since the
    commit again, and the run is exact."""
    steps = 12
    args = _in_place_job(tmp_path)
    proc, out = run_elastic(
        tmp_path,
        subprocess_env,
        args,
        {
            "STEPS": str(steps),
            "FAIL_AT": "localhost:1@6@backward",
            "COMMIT_EVERY": "4",
            "FASTPS_ELASTIC_INPLACE": "any",
        },
        timeout=RUN_TIMEOUT + 60,
    )
    assert proc.returncode == 0, _show(proc)
    assert "in-place replacement: granted" in proc.stderr, _show(proc)
    assert not _restored_slots(proc.stdout), _show(proc)
    done = [int(m) for m in re.findall(r"STEP (\d+) size=3", proc.stdout)]
    assert done == list(range(1, steps + 1)), done
    assert_reference(out, steps)
