"""A host that leaves the discovery output is drained, as Horovod does it: every worker
learns it at its next commit, which raises ``HostsUpdatedInterrupt`` after saving (nothing
is rolled back), the next generation forms without the removed host's worker, and that
worker exits 0 saying after which commit it stopped. One machine, three "hosts" (names of
this machine: localhost, 127.0.0.1 and its hostname), real processes (train_drain.py).

Without the drain (``FASTPS_ELASTIC_DRAIN_TIMEOUT=0``: the removed worker is stopped at
once) the survivors roll back and ``test_removed_host_is_drained_without_rollback`` fails:
``_no_rollback`` sees RESTORE lines and repeated steps."""

from __future__ import annotations

import json
import re
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

pytest.importorskip("torch")

HERE = Path(__file__).resolve().parent
TRAIN = HERE / "train_drain.py"
sys.path.insert(0, str(HERE))
import train_elastic  # noqa: E402

RUN_TIMEOUT = 300
HOSTNAME = socket.gethostname()
HOSTS = ["localhost", "127.0.0.1", HOSTNAME]  # ranks 0, 1, 2 (start order)


def _discovery(tmp_path: Path, hosts: List[str]) -> Tuple[Path, Path]:
    source = tmp_path / "hosts"
    source.write_text("".join(f"{h}:1\n" for h in hosts))
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {source}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return source, script


def _run(
    tmp_path: Path, env: Dict[str, str], extra: Dict[str, str]
) -> Tuple[subprocess.CompletedProcess, Dict[str, dict], float]:
    source, script = _discovery(tmp_path, HOSTS)
    results = tmp_path / "results"
    results.mkdir()
    full = {
        **env,
        "RESULT_DIR": str(results),
        "FASTPS_ELASTIC_DISCOVERY_INTERVAL": "0.2",
        **{k: v.replace("{hosts}", str(source)) for k, v in extra.items()},
    }
    cmd = [sys.executable, "-m", "fastps.launcher", "-np", "3", "--min-np", "2", "--max-np", "3",
           "--host-discovery-script", str(script), "--elastic-timeout", "120",
           sys.executable, str(TRAIN)]  # fmt: skip
    started = time.monotonic()
    proc = subprocess.run(cmd, env=full, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    took = time.monotonic() - started
    out = {p.stem: json.loads(p.read_text()) for p in results.glob("*.json")}
    return proc, out, took


def _show(proc: subprocess.CompletedProcess) -> str:
    return f"rc={proc.returncode}\nSTDOUT:\n{proc.stdout[-8000:]}\nSTDERR:\n{proc.stderr[-8000:]}"


def _applied(stdout: str) -> Dict[str, List[Tuple[int, int, int, float]]]:
    """slot -> [(step, generation, size, time)] in the order its steps were applied."""
    got: Dict[str, List[Tuple[int, int, int, float]]] = {}
    pattern = r"APPLIED slot=(\S+) step=(\d+) gen=(-?\d+) size=(\d+) t=([\d.]+)"
    for m in re.finditer(pattern, stdout):
        step, gen, size = int(m.group(2)), int(m.group(3)), int(m.group(4))
        got.setdefault(m.group(1), []).append((step, gen, size, float(m.group(5))))
    return got


def _assert_exact(out: Dict[str, dict], slots: List[str], steps: int) -> None:
    """Every finishing worker holds the same parameters, those of one process that ran the
    same steps (so each step was applied exactly once to the committed state)."""
    assert sorted(out) == sorted(slots), out.keys()
    first = out[slots[0]]["params"]
    for slot in slots:
        assert out[slot]["params"] == first, f"{slot} differs from {slots[0]}"
        assert out[slot]["step"] == steps
    for got, want in zip(first, train_elastic.reference(steps)):
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12)


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT + 60)
@pytest.mark.parametrize("victim", [1, 0], ids=["rank1-host", "rank0-host"])
def test_removed_host_is_drained_without_rollback(tmp_path, subprocess_env, victim):
    """Host ``HOSTS[victim]`` leaves the discovery output after step 6 (commits every 3
    steps): its worker leaves at the next commit and exits 0; the two others never apply a
    step twice (no rollback), finish on 2 workers, and end with exactly the parameters of a
    single-process run."""
    steps = 18
    gone = HOSTS[victim]
    left = [h for h in HOSTS if h != gone]
    proc, out, took = _run(
        tmp_path,
        subprocess_env,
        {"STEPS": str(steps), "SHRINK_AT": "6@{hosts}@" + ";".join(f"{h}:1" for h in left)},
    )
    assert proc.returncode == 0, _show(proc)
    both = proc.stdout + proc.stderr
    assert "RESTORE" not in proc.stdout, _show(proc)
    assert "restoring the last commit" not in proc.stderr, _show(proc)
    # the driver drained it, the worker said so itself, and it exited 0
    assert f"host {gone} left the discovery output: its worker on slot {gone}:0" in proc.stderr
    m = re.search(rf"host {re.escape(gone)} left the discovery output: this worker stops "
                  r"after commit (\d+)", both)  # fmt: skip
    assert m, _show(proc)
    assert int(m.group(1)) >= 3  # commits at steps 3, 6, then the one it left at
    assert f"drained worker on slot {gone}:0" in proc.stderr, _show(proc)
    assert re.search(rf"drained worker on slot {re.escape(gone)}:0 \(pid \d+\) exited with code 0",
                     proc.stderr), _show(proc)  # fmt: skip
    assert re.search(r"generation 1: 2 workers", proc.stderr), _show(proc)
    applied = _applied(proc.stdout)
    survivors = [f"{h}:0" for h in left]
    for slot in survivors:
        seq = [s for s, *_ in applied[slot]]
        assert seq == list(range(1, steps + 1)), f"{slot} applied {seq}: a rollback"
        gens = [g for _, g, *_ in applied[slot]]
        assert gens == sorted(gens) and gens[-1] == 1, gens
    # the removed worker applied steps only in generation 0, up to the commit it left at
    mine = applied[f"{gone}:0"]
    assert {g for _, g, *_ in mine} == {0}
    assert [s for s, *_ in mine] == list(range(1, len(mine) + 1))
    assert len(mine) % 3 == 0 and len(mine) >= 6, mine  # it left at a commit
    _assert_exact(out, survivors, steps)
    # what the drain cost the survivors: their step across the change against a usual one
    times = [float(t) for _, _, _, t in applied[survivors[0]]]
    gaps = sorted(b - a for a, b in zip(times, times[1:]))
    across = times[len(mine)] - times[len(mine) - 1]
    median = gaps[len(gaps) // 2]
    print(
        f"drain run: {took:.1f} s; the removed worker left after step {len(mine)}; "
        f"survivors' step across the change {across:.2f} s (median step {median:.2f} s)"
    )


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT + 60)
def test_drain_timeout_stops_a_worker_that_never_commits(tmp_path, subprocess_env):
    """The removed host's worker hangs before its next commit: after
    FASTPS_ELASTIC_DRAIN_TIMEOUT (4 s) it is stopped as before drains existed, the
    survivors roll back to their last commit, and the job goes on and finishes exactly."""
    steps = 15
    gone = HOSTS[2]
    left = HOSTS[:2]
    proc, out, took = _run(
        tmp_path,
        subprocess_env,
        {
            "STEPS": str(steps),
            "SHRINK_AT": "6@{hosts}@" + ";".join(f"{h}:1" for h in left),
            "HANG_AT": f"{gone}:0@6",
            "FASTPS_ELASTIC_DRAIN_TIMEOUT": "4",
        },
    )
    assert proc.returncode == 0, _show(proc)
    assert f"host {gone} left the discovery output: its worker on slot {gone}:0" in proc.stderr
    assert "reached no commit within the drain timeout of 4 s (FASTPS_ELASTIC_DRAIN_TIMEOUT)" in (
        proc.stderr
    ), _show(proc)
    assert "this worker stops after commit" not in proc.stdout + proc.stderr
    survivors = [f"{h}:0" for h in left]
    # the survivors waited in step 7 for the hung worker, then rolled back to commit 6
    assert len(re.findall(r"RESTORE slot=", proc.stdout)) == 2, _show(proc)
    hang = float(re.search(r"HANG slot=\S+ step=6 t=([\d.]+)", proc.stdout).group(1))
    applied = _applied(proc.stdout)
    for slot in survivors:
        seq = [s for s, *_ in applied[slot]]
        assert seq[-1] == steps and sorted(set(seq)) == list(range(1, steps + 1)), seq
    restarts = [
        float(m.group(1))
        for m in re.finditer(r"APPLIED slot=\S+ step=\d+ gen=1 size=2 t=([\d.]+)", proc.stdout)
    ]
    stall = min(restarts) - hang
    assert 4.0 <= stall < 4.0 + 30.0, stall  # the drain timeout, then a new generation
    _assert_exact(out, survivors, steps)
    print(f"drain-timeout run: {took:.1f} s; stall from the hang to the next step {stall:.1f} s")


class _FakeProc:
    """A worker process that never exits (the driver only polls it here)."""

    pid = 0

    def poll(self) -> None:
        return None


def _driver(monkeypatch, drain_timeout: str, elastic_timeout: float = 600.0):
    """An elastic driver with three workers in generation 0 (no processes: signals are
    recorded, not sent)."""
    from typing import Any, cast

    from fastps.launch.elastic_driver import ElasticLauncher, _Slot
    from fastps.launch.job import Child

    monkeypatch.setenv("FASTPS_ELASTIC_DRAIN_TIMEOUT", drain_timeout)
    driver = ElasticLauncher(
        ["true"],
        discovery_script="true",
        min_np=1,
        max_np=3,
        elastic_timeout=elastic_timeout,
    )
    sent: List[Tuple[str, int]] = []
    monkeypatch.setattr(driver, "_signal_worker", lambda slot, sig: sent.append((slot.id, sig)))
    for seq, host in enumerate(HOSTS):
        child = Child("worker", seq, cast(Any, _FakeProc()))
        driver.slots[f"{host}:0"] = _Slot(f"{host}:0", host, seq, child, ready=True, joined={0})
    driver.generation = 0
    driver.members = [f"{h}:0" for h in HOSTS]
    return driver, sent


def test_a_removed_member_is_drained_then_told_to_leave(monkeypatch):
    """No processes: the driver's decisions. A member whose host left the discovery output
    drains (no signal), the commit answer says so, its rendezvous is answered "leave" while
    the others get the next generation without it; a drain past its timeout is stopped."""
    import signal

    A, B, C = HOSTS
    driver, sent = _driver(monkeypatch, "60")
    with driver.cond:
        driver._apply_discovery({A: 1, C: 1}, limit=3)
    assert driver.slots[f"{B}:0"].state == "draining" and sent == []
    updates = driver._answer({"type": "updates", "generation": 0})
    assert updates["updated"] and updates["removed_only"] and updates["draining"], updates
    answer = driver._rendezvous(f"{B}:0", 0, commits=4)
    assert answer == {
        "type": "leave",
        "reason": f"host {B} left the discovery output",
        "generation": 0,
    }
    assert not driver._answer({"type": "updates", "generation": 0})["draining"]
    formed: List[List[str]] = []
    monkeypatch.setattr(driver, "_form", lambda alive: formed.append([s.id for s in alive]))
    with driver.cond:
        driver.waiting[f"{A}:0"] = 0.0
        driver._maybe_form(0.0)
        assert formed == []  # the other survivor has not asked yet; the drained one is not awaited
        driver.waiting[f"{C}:0"] = 0.0
        driver._maybe_form(0.0)
    assert formed == [[f"{A}:0", f"{C}:0"]]

    # Never reaching a commit: stopped once the drain timeout passes, as before drains.
    driver, sent = _driver(monkeypatch, "5")
    with driver.cond:
        driver._apply_discovery({A: 1, B: 1}, limit=3)
        c = driver.slots[f"{C}:0"]
        driver._check_drains(c.drain_since + 4.0)
        assert c.state == "draining" and sent == []
        driver._check_drains(c.drain_since + 5.5)
    assert c.state == "stopping" and (f"{C}:0", signal.SIGTERM) in sent
    assert "reached no commit within the drain timeout of 5 s" in c.why

    # FASTPS_ELASTIC_DRAIN_TIMEOUT=0: stopped at once; a worker not in the generation
    # (starting, or a spare) is stopped at once whatever the timeout.
    driver, sent = _driver(monkeypatch, "0")
    with driver.cond:
        driver._apply_discovery({A: 1, B: 1}, limit=3)
    assert driver.slots[f"{C}:0"].state == "stopping" and sent == [(f"{C}:0", signal.SIGTERM)]
    driver, sent = _driver(monkeypatch, "60", elastic_timeout=2.0)
    assert driver.drain_timeout == 2.0  # bounded by --elastic-timeout
    driver.members = [f"{A}:0", f"{B}:0"]
    with driver.cond:
        driver._apply_discovery({A: 1, B: 1}, limit=3)
    assert driver.slots[f"{C}:0"].state == "stopping"
