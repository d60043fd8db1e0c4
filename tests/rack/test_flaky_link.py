"""A link that goes down and up again and again while a job runs (emulated machines,
benchmarks/rack): 3 worker hosts and a CPU host, w2's switch port down 2 s, up 3 s, 8
times (40 s). Outages shorter than the heartbeat timeout are not failures: no process may
be declared lost, every round's sum must be exact (float64 ledger: integers, so any lost,
doubled or stale part shows), and after each heal the job must move on as soon as TCP
retransmits. Needs root; rack prefix ``fpsf``.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import List, Tuple

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import rack_common as rc  # noqa: E402
from benchmarks.rack import Rack, find_stale, is_supported  # noqa: E402

_OK, _WHY = is_supported()
pytestmark = [pytest.mark.root, pytest.mark.skipif(not _OK, reason=_WHY), pytest.mark.timeout(240)]

PREFIX = "fpsf"
DOWN_S, UP_S, CYCLES = 2.0, 3.0, 8
HEARTBEAT_TIMEOUT = 10.0

# Each round: every rank pushes integers that depend on the round and the rank, and checks
# the sum element by element; it records when each round ended. Runs until the test writes
# the stop file (bounded by MAX_ROUNDS and MAX_SECONDS).
WORKER = textwrap.dedent("""
    import json, os, sys, time
    import numpy as np
    import fastps

    MAX_ROUNDS, MAX_SECONDS = 100000, 150.0
    out_dir = os.environ["RACK_RESULT_DIR"]
    fastps.init()
    rank, n = fastps.rank(), fastps.size()
    count = 262144 + 17                      # 1 MiB of float64 and a bit: several parts
    base = np.arange(count, dtype=np.float64)
    ends, bad, rounds = [], 0, 0
    start = time.monotonic()
    while rounds < MAX_ROUNDS and time.monotonic() - start < MAX_SECONDS:
        x = base * (rank + 1) + rounds * 1000 + rank
        fastps.push_pull(x, average=False, name="ledger", out=x)
        want = base * (n * (n + 1) / 2) + n * rounds * 1000 + n * (n - 1) / 2
        bad += int(np.count_nonzero(x != want))
        rounds += 1
        ends.append(time.time())
        stop = os.path.exists(os.path.join(out_dir, "stop"))
        # every rank must agree on the last round: rank 0 decides, the others follow
        flag = np.array([1.0 if (rank == 0 and stop) else 0.0])
        fastps.push_pull(flag, average=False, name="stop", out=flag)
        if flag[0] > 0:
            break
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
        json.dump({"bad": bad, "rounds": rounds, "ends": ends}, fh)
    fastps.barrier()
    fastps.shutdown()
    sys.exit(1 if bad else 0)
""")


def _port(rack: Rack, host: str, up: bool) -> None:
    subprocess.run(
        ["ip", "netns", "exec", rack.switch_ns, "ip", "link", "set", host, "up" if up else "down"],
        check=True,
        timeout=10,
    )


def _flap(rack: Rack, host: str, heals: List[float], stop: threading.Event) -> None:
    """Down DOWN_S, up UP_S, CYCLES times; records when each heal happened (wall clock)."""
    try:
        for _ in range(CYCLES):
            if stop.is_set():
                return
            _port(rack, host, up=False)
            time.sleep(DOWN_S)
            _port(rack, host, up=True)
            heals.append(time.time())
            time.sleep(UP_S)
    finally:
        _port(rack, host, up=True)


def _recoveries(ends: List[float], heals: List[float]) -> List[Tuple[float, float]]:
    """For each heal: (seconds to the next finished round, the longest round gap around it)."""
    out = []
    for h in heals:
        after = [t for t in ends if t > h]
        if not after:
            continue
        before = [t for t in ends if t <= h]
        gap = after[0] - (before[-1] if before else h)
        out.append((after[0] - h, gap))
    return out


def test_flapping_link_no_wrong_sum_no_stuck_job() -> None:
    if find_stale(PREFIX):
        pytest.fail(
            f"stale rack objects {find_stale(PREFIX)}; run python -m "
            f"benchmarks.rack.cli down --prefix {PREFIX}"
        )
    heals: List[float] = []
    stop = threading.Event()
    with (
        tempfile.TemporaryDirectory(prefix="rack-flaky-") as tmp,
        Rack(n_workers=3, n_cpu_hosts=1, rate_mbit=1000, prefix=PREFIX) as rack,
    ):
        launch = rc.start_fastps(
            rack,
            n=3,
            k=1,
            worker_argv=[sys.executable, "-c", WORKER],
            port=29395,
            extra_env={
                "RACK_RESULT_DIR": tmp,
                "FASTPS_PARTITION_BYTES": "256K",
                "FASTPS_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT),
            },
            timeout_s=60,
            label="flaky",
        )
        result: List[Tuple[bool, str]] = []
        runner = threading.Thread(
            target=lambda: result.append(rc.wait_all(rack, launch, timeout_s=200)), daemon=True
        )
        runner.start()
        time.sleep(4.0)  # the job forms and runs a few rounds on healthy links
        flapper = threading.Thread(target=_flap, args=(rack, "w2", heals, stop), daemon=True)
        flapper.start()
        flapper.join(timeout=CYCLES * (DOWN_S + UP_S) + 30)
        stop.set()
        time.sleep(2.0)  # a few rounds after the last heal
        (Path(tmp) / "stop").write_text("")
        runner.join(timeout=210)
        assert result, "the job did not end within 210 s after the link flapped"
        ok, err = result[0]
        res = rc.read_results(Path(tmp))
    assert ok, err
    assert sorted(res) == [0, 1, 2], res
    assert len(heals) == CYCLES
    for rank, r in res.items():
        assert r["bad"] == 0, f"rank {rank}: {r['bad']} wrong elements"
    assert len({r["rounds"] for r in res.values()}) == 1, {k: r["rounds"] for k, r in res.items()}
    rec = _recoveries(res[0]["ends"], heals)
    to_next = [r[0] for r in rec]
    print(
        f"rounds {res[0]['rounds']}; after each heal, next round in "
        f"median {statistics.median(to_next):.2f} s, max {max(to_next):.2f} s; "
        f"longest gap {max(r[1] for r in rec):.2f} s (outage {DOWN_S:g} s)"
    )
    # TCP's retransmission backoff after a 2 s outage resumes within about as long again
    # (capped at 1 s, transport/socket.cc: without the cap a retransmission lost in the next
    # outage once left the job waiting 15.7 s after a heal).
    assert max(to_next) < DOWN_S + 3.0, rec
    assert find_stale(PREFIX) == []
