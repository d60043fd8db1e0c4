"""Elastic summation servers through a network cut, with every role started by hand.

Emulated machines (benchmarks/rack: one network namespace per host behind a switch): the
standalone scheduler (``python -m fastps``) on w0, servers 0 and 1 on CPU hosts c0 and c1
(``python -m fastps.server``), workers on w0, w1 and w2 (elastic_servers_cut_worker.py),
all with ``FASTPS_ELASTIC_SERVERS=1`` as docs/reference/configuration.md describes. Once
the workers sum, c1's switch port goes down for 15 s (three heartbeat timeouts), then up
again. Checked:

- the workers go on without server 1 within the heartbeat timeout + a few seconds of the
  cut (the stall is printed), and keep summing while c1 is still cut off;
- every round's sum is exact on every rank (float64 ledger of integers);
- no rollback: no push_pull failed or was done again by the user, every rank did the same
  rounds, exactly one server change;
- server 1 is fenced: it exits on its own with a message saying it left the job, and the
  scheduler never takes it back (one server epoch, no join);
- every process exits on its own and nothing is left in the namespaces.

Two runs: every process with the same heartbeat timeout (server 1 gives up on the scheduler
during the cut, as the scheduler gives up on it), and server 1 with a heartbeat timeout
longer than the cut, so that it still runs when its link heals and must not slip back in.

Needs root; rack prefix ``fpsv``.
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.rack import Rack, cleanup, find_stale, is_supported  # noqa: E402

_OK, _WHY = is_supported()
pytestmark = [
    pytest.mark.root,
    pytest.mark.slow,
    pytest.mark.skipif(not _OK, reason=_WHY),
    pytest.mark.timeout(150),
]

PREFIX = "fpsv"
PORT = 29417
HEARTBEAT = 5.0
CUT_S = 15.0  # > HEARTBEAT + the stall (~6 s) with room for 100+ rounds while still cut
WORKER = str(Path(__file__).with_name("elastic_servers_cut_worker.py"))


def _port(rack: Rack, host: str, up: bool) -> None:
    """The host's switch port up or down: its link is cut, its own interface stays up."""
    subprocess.run(
        ["ip", "netns", "exec", rack.switch_ns, "ip", "link", "set", host, "up" if up else "down"],
        check=True,
        timeout=10,
    )


def _output(rack: Rack, host: str, label: str) -> str:
    tag = f"[{host}/{label}] "
    return "\n".join(
        line[len(tag) :] for line in rack.logs()[host].splitlines() if line.startswith(tag)
    )


def _all_output(rack: Rack) -> str:
    return "\n".join(text for text in rack.logs().values() if text)[-12000:]


def _left_in_namespaces(rack: Rack) -> Dict[str, List[str]]:
    """Processes still running in the rack's host namespaces, with their command lines."""
    left: Dict[str, List[str]] = {}
    for h in rack.hosts:
        res = subprocess.run(
            ["ip", "netns", "pids", h.ns], capture_output=True, text=True, timeout=10
        )
        for pid in res.stdout.split():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue  # exited meanwhile
            left.setdefault(h.name, []).append(f"{pid}: {cmd.decode(errors='replace')[:120]}")
    return left


# Server 1's own heartbeat timeout: the job's, or one that outlasts the cut.
OUTLIVES = HEARTBEAT + CUT_S + 5.0


@pytest.mark.parametrize(
    "server_heartbeat", [HEARTBEAT, OUTLIVES], ids=["same-timeouts", "server-outlives-cut"]
)
def test_server_host_cut_keys_move_and_the_healed_server_is_fenced(
    server_heartbeat: float,
) -> None:
    if find_stale(PREFIX):
        pytest.fail(
            f"stale rack objects {find_stale(PREFIX)}; run python -m "
            f"benchmarks.rack.cli down --prefix {PREFIX}"
        )
    try:
        _run(server_heartbeat)
    finally:
        cleanup(PREFIX)


def _run(server_heartbeat: float) -> None:
    with (
        tempfile.TemporaryDirectory(prefix="fpsv-") as tmp,
        Rack(n_workers=3, n_cpu_hosts=2, rate_mbit=1000, prefix=PREFIX) as rack,
    ):
        folder = Path(tmp)
        sched_host = rack.host("w0")
        job = {
            "FASTPS_SCHEDULER_ADDR": f"{sched_host.addr}:{PORT}",
            "FASTPS_JOB_ID": f"cut-{PORT}",
            "FASTPS_TOKEN": secrets.token_hex(16),
            "FASTPS_NUM_WORKERS": "3",
            "FASTPS_NUM_SERVERS": "2",
            "FASTPS_ELASTIC_SERVERS": "1",
            "FASTPS_HEARTBEAT_INTERVAL": "0.5",
            "FASTPS_HEARTBEAT_TIMEOUT": f"{HEARTBEAT:g}",
            # registration and each operation may wait out the cut's stall, not much more
            "FASTPS_TIMEOUT": "60",
            "FASTPS_OP_TIMEOUT": "60",
            "FASTPS_PARTITION_BYTES": "64K",
            "OMP_NUM_THREADS": "1",
            "RESULT_DIR": tmp,
        }
        py = sys.executable
        procs: Dict[str, subprocess.Popen] = {}
        procs["sched"] = rack.spawn(
            "w0",
            [py, "-m", "fastps"],
            env={**job, "FASTPS_ROLE": "scheduler", "FASTPS_SCHEDULER_ADDR": f"0.0.0.0:{PORT}"},
            cwd=str(REPO),
            label="sched",
        )
        for sid, host in enumerate(("c0", "c1")):
            beat = f"{server_heartbeat if sid == 1 else HEARTBEAT:g}"
            procs[f"s{sid}"] = rack.spawn(
                host,
                [py, "-m", "fastps.server"],
                env={
                    **job,
                    "FASTPS_ROLE": "server",
                    "FASTPS_SERVER_ID": str(sid),
                    "FASTPS_HEARTBEAT_TIMEOUT": beat,
                },
                cwd=str(REPO),
                label=f"s{sid}",
            )
        for rank in range(3):
            procs[f"w{rank}"] = rack.spawn(
                f"w{rank}",
                [py, WORKER],
                env={**job, "FASTPS_ROLE": "worker", "FASTPS_RANK": str(rank)},
                cwd=str(REPO),
                label=f"w{rank}",
            )
        cut_server = procs["s1"]
        cut_server_exit: Optional[float] = None

        def watch(seconds: float) -> None:
            """Sleeps, noting when the cut-off server exits; fails if another process does."""
            nonlocal cut_server_exit
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                if cut_server_exit is None and cut_server.poll() is not None:
                    cut_server_exit = time.time()
                gone = [k for k, p in procs.items() if k != "s1" and p.poll() is not None]
                assert not gone, f"{gone} exited during the run:\n{_all_output(rack)}"
                time.sleep(0.05)

        # The job forms and sums a while on healthy links.
        deadline = time.monotonic() + 60
        while "ROUND 50 " not in _output(rack, "w0", "w0"):
            assert time.monotonic() < deadline, f"no 50 rounds in 60 s:\n{_all_output(rack)}"
            watch(0.2)
        cut_at = time.time()
        try:
            _port(rack, "c1", up=False)
            watch(CUT_S)
        finally:
            _port(rack, "c1", up=True)
        healed_at = time.time()
        # The workers keep summing after the heal, without server 1, until it is gone.
        watch(4.0)
        end = time.monotonic() + max(0.0, cut_at + server_heartbeat + 5.0 - time.time())
        while cut_server_exit is None and time.monotonic() < end:
            watch(0.2)
        (folder / "stop").write_text("")
        codes: Dict[str, Optional[int]] = {}
        deadline = time.monotonic() + 60  # the last rounds, the barrier and every goodbye
        for name in ("w0", "w1", "w2", "sched", "s0", "s1"):
            try:
                codes[name] = procs[name].wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                codes[name] = None
        if cut_server_exit is None and codes["s1"] is not None:
            cut_server_exit = time.time()
        time.sleep(0.5)  # the log readers catch up
        logs = _all_output(rack)
        left = _left_in_namespaces(rack)
        files = [folder / f"rank{r}.json" for r in range(3)]
        results = {r: json.loads(f.read_text()) for r, f in enumerate(files) if f.exists()}
        sched_out = _output(rack, "w0", "sched")
        server_out = _output(rack, "c1", "s1")

    assert sorted(results) == [0, 1, 2], f"ranks without a result: {codes}\n{logs}"
    # (e) every process ended on its own, nothing left behind
    assert all(c is not None for c in codes.values()), (codes, logs)
    assert left == {}, f"processes left on the machines: {left}"
    assert find_stale(PREFIX) == []
    for name in ("w0", "w1", "w2", "sched", "s0"):
        assert codes[name] == 0, (name, codes, logs)

    # (b) exact sums, (c) no rollback: no error, the same rounds everywhere, one change
    for r, res in results.items():
        assert res["error"] == "", f"rank {r}: {res['error']}"
        assert res["bad"] == 0, f"rank {r}: {res['bad']} wrong elements"
    rounds = {r: res["rounds"] for r, res in results.items()}
    assert len(set(rounds.values())) == 1, rounds
    for r, res in results.items():
        assert res["epochs"][0] == 0 and res["epochs"][-1] == 1, (r, sorted(set(res["epochs"])))
        assert res["epochs"] == sorted(res["epochs"]), r
        assert len(res["changes"]) == 1, (r, res["changes"])
        assert res["layouts"]["0"] == [0, 1] and res["layouts"]["1"] == [0], (r, res["layouts"])

    # (a) the stall: from the cut to the first round summed without server 1
    ends, epochs = results[0]["ends"], results[0]["epochs"]
    first_after = next(t for t, e in zip(ends, epochs) if e == 1)
    went_on = first_after - cut_at
    before = [t for t in ends if t <= cut_at]
    gap = first_after - (before[-1] if before else cut_at)
    during_cut = sum(1 for t in ends if first_after <= t <= healed_at)
    print(
        f"\nserver 1's heartbeat timeout {server_heartbeat:g} s: "
        f"cut at 0; workers summed without server 1 at {went_on:.2f} s (longest pause "
        f"{gap:.2f} s; heartbeat timeout {HEARTBEAT:g} s); {during_cut} rounds while c1 was "
        f"still cut; {rounds[0]} rounds in all"
    )
    assert went_on < HEARTBEAT + 3.0, (went_on, logs)
    assert during_cut >= 10, (during_cut, logs)

    # (d) fenced: server 1 was removed once, never readmitted, and said why it left
    assert re.search(r"server epoch 1 \(server 1 .*\): servers \[0\]", sched_out), sched_out
    assert "server epoch 2" not in sched_out and "joined" not in sched_out, sched_out
    assert cut_server_exit is not None
    print(
        f"server 1 exited {cut_server_exit - cut_at:.2f} s after the cut, the heal at "
        f"{healed_at - cut_at:.2f} s (code {codes['s1']}): "
        + (server_out.strip().splitlines() or ["(no output)"])[-1]
    )
    assert codes["s1"] == 1, server_out
    said = r"server 1 \(pid \d+ on host c1\) left the job: (lost connection to |scheduler at )"
    assert re.search(said, server_out), server_out
    if server_heartbeat < CUT_S:
        assert cut_server_exit < healed_at, (cut_server_exit - cut_at, server_out)
    else:
        # it ran on after the heal, and still never came back
        assert cut_server_exit > healed_at, (cut_server_exit - cut_at, server_out)
