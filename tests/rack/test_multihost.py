"""``fastpsrun -H`` across emulated machines that run real OpenSSH servers.

The rack (benchmarks/rack) gives every host its own network namespace; benchmarks/rack/
machines.py adds a host name, /etc/hosts, root's ~/.ssh (keys made for this run) and sshd on
each. fastpsrun runs on w0 as a user would run it on a login node: ``-H w0:1,w1:1,...`` with
w0 started locally and the others over ssh. Host c2 has no fastps (its package folder is
hidden under an empty tmpfs); w9 is in /etc/hosts but no machine answers at its address.

Needs root (namespaces) and OpenSSH; OpenSSH is installed by the project's setup script
(benchmarks/rack/setup_deps.sh --ssh) when missing. Rack prefix ``fpsm``.
"""

from __future__ import annotations

import re
import signal
import sys
import textwrap
import time
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import fastps  # noqa: E402

from benchmarks.rack import Rack, cleanup, find_stale, is_supported  # noqa: E402
from benchmarks.rack.machines import Machines, ensure_ssh  # noqa: E402

_OK, _WHY = is_supported()
pytestmark = [pytest.mark.root, pytest.mark.skipif(not _OK, reason=_WHY)]

PREFIX = "fpsm"
PACKAGE_DIR = str(Path(fastps.__file__).resolve().parent)
DIGITS = str(REPO / "examples" / "torch" / "train_digits.py")
ENV = {"OMP_WAIT_POLICY": "PASSIVE", "FASTPS_HEARTBEAT_TIMEOUT": "30"}


@pytest.fixture(scope="module")
def machines() -> Iterator[Tuple[Rack, Machines]]:
    ok, why = ensure_ssh()  # installs Debian's OpenSSH packages when missing
    if not ok:
        pytest.skip(why)
    if find_stale(PREFIX):
        pytest.fail(
            f"stale rack objects {find_stale(PREFIX)}; run python -m "
            f"benchmarks.rack.cli down --prefix {PREFIX}"
        )
    try:
        with (
            Rack(4, 3, None, prefix=PREFIX) as rack,
            Machines(rack, hide={"c2": [PACKAGE_DIR]}, extra_hosts={"w9": "198.18.1.250"}) as m,
        ):
            yield rack, m
    finally:
        cleanup(PREFIX)


def _fastpsrun(m: Machines, args: List[str], label: str):
    return m.spawn(
        "w0", [sys.executable, "-m", "fastps.launcher", *args], env=ENV, cwd=str(REPO), label=label
    )


def _output(rack: Rack, label: str) -> str:
    tag = f"[w0/{label}] "
    return "\n".join(
        line[len(tag) :] for line in rack.logs()["w0"].splitlines() if line.startswith(tag)
    )


def _assert_nothing_left(rack: Rack, m: Machines) -> None:
    deadline = time.monotonic() + 5.0  # sshd's session processes end right after the client
    left = {}
    while time.monotonic() < deadline:
        left = {h.name: m.describe(m.processes(h)) for h in rack.hosts}
        left = {k: v for k, v in left.items() if v}
        if not left:
            return
        time.sleep(0.1)
    pytest.fail(f"processes left on the machines: {left}")


def _accuracy(text: str) -> Tuple[int, int]:
    found = re.search(r"test accuracy: [0-9.]+ \((\d+)/(\d+)\)", text)
    assert found, text[-3000:]
    return int(found.group(1)), int(found.group(2))


@pytest.mark.timeout(600)
def test_train_digits_across_six_machines(machines) -> None:
    rack, m = machines
    t0 = time.monotonic()
    multi = _fastpsrun(
        m,
        [
            "-np",
            "4",
            "-H",
            "w0:1,w1:1,w2:1,w3:1",
            "--server-hosts",
            "c0,c1",
            sys.executable,
            DIGITS,
        ],
        "multi",
    )
    assert rack.run_all([multi], timeout=400, check=False) == [0], _output(rack, "multi")
    took = time.monotonic() - t0
    out = _output(rack, "multi")
    assert (
        "w0: worker 0, server 0; w1: worker 1, server 1; w2: worker 2, server 2; "
        "w3: worker 3, server 3; c0: server 4; c1: server 5" in out
    ), out
    # Every worker ran on its own machine and printed with its host in the prefix.
    assert "[worker 0@w0] test accuracy" in out, out
    _assert_nothing_left(rack, m)
    # The same job on one machine (4 workers, 6 servers on w0) reaches the same accuracy.
    single = _fastpsrun(m, ["-np", "4", "--num-servers", "6", sys.executable, DIGITS], "single")
    assert rack.run_all([single], timeout=400, check=False) == [0], _output(rack, "single")
    right_multi, total = _accuracy(out)
    right_single, _ = _accuracy(_output(rack, "single"))
    print(
        f"multi-machine: {right_multi}/{total} in {took:.1f} s; one machine: {right_single}/{total}"
    )
    assert right_multi / total >= 0.95
    # Same data, seed and shards; only the order of float sums may differ.
    assert abs(right_multi - right_single) <= 2, (right_multi, right_single)


_WORKER = textwrap.dedent("""
    import os, subprocess, sys, time
    import fastps
    fastps.init()
    rank = fastps.rank()
    # A stray that leaves the process group: only the sweep by job id can find it.
    subprocess.Popen(["sleep", "300"], start_new_session=True)
    from fastps.config import Config
    print(f"ready {rank} on {os.uname().nodename} at {Config.from_env().host}", flush=True)
    if rank == int(sys.argv[1]):
        time.sleep(1.0)
        sys.exit(3)
    time.sleep(300)
""")


@pytest.mark.timeout(180)
def test_failing_worker_ends_job_and_leaves_nothing(machines) -> None:
    rack, m = machines
    t0 = time.monotonic()
    # With the interface named: every process advertises its own eth0 address.
    proc = _fastpsrun(
        m,
        [
            "-np",
            "4",
            "-H",
            "w0:2,w1:1,w2:1",
            "--server-hosts",
            "c0",
            "--network-interface",
            "eth0",
            sys.executable,
            "-c",
            _WORKER,
            "3",
        ],
        "fail",
    )
    codes = rack.run_all([proc], timeout=120, check=False)
    out = _output(rack, "fail")
    assert codes == [3], out
    assert "worker 3@w2" in out and "exited with code 3" in out, out
    assert "scheduler at 198.18.1.1;" in out, out
    for rank, host, addr in (
        (0, "w0", "198.18.1.1"),
        (1, "w0", "198.18.1.1"),
        (2, "w1", "198.18.1.2"),
        (3, "w2", "198.18.1.3"),
    ):
        assert f"[worker {rank}@{host}] ready {rank} on {host} at {addr}" in out, out
    assert time.monotonic() - t0 < 90
    _assert_nothing_left(rack, m)


@pytest.mark.timeout(180)
def test_ctrl_c_stops_every_machine(machines) -> None:
    rack, m = machines
    # fastpsrun's machine runs no process of this job; ssh port and key given explicitly.
    proc = _fastpsrun(
        m,
        [
            "-np",
            "3",
            "-H",
            "w1:1,w2:1,w3:1",
            "--server-hosts",
            "c1",
            "--ssh-port",
            "2222",
            "--ssh-identity-file",
            str(m.ssh_dir / "id_ed25519"),
            sys.executable,
            "-c",
            _WORKER,
            "-1",
        ],
        "intr",
    )
    deadline = time.monotonic() + 120
    while _output(rack, "intr").count("] ready ") < 3:
        assert proc.poll() is None, _output(rack, "intr")
        assert time.monotonic() < deadline, _output(rack, "intr")
        time.sleep(0.1)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)  # what Ctrl-C does (fastpsrun's own process)
    codes = rack.run_all([proc], timeout=60, check=False)
    out = _output(rack, "intr")
    assert codes == [128 + signal.SIGINT], out
    assert "received SIGINT: stopping the job" in out, out
    assert time.monotonic() - t0 < 30
    _assert_nothing_left(rack, m)


_SLEEPER = textwrap.dedent("""
    import time
    import fastps
    fastps.init()
    print(f"ready {fastps.rank()}", flush=True)
    time.sleep(300)
""")


@pytest.mark.timeout(120)
def test_killed_fastpsrun_leaves_nothing_remote(machines) -> None:
    """fastpsrun gets SIGKILL (no teardown code runs): the remote agents see their stdin
    close and stop their processes, well before the heartbeat timeout (30 s here) would."""
    rack, m = machines
    proc = _fastpsrun(m, ["-np", "2", "-H", "w1:1,w2:1", sys.executable, "-c", _SLEEPER], "kill")
    deadline = time.monotonic() + 90
    while _output(rack, "kill").count("] ready ") < 2:
        assert proc.poll() is None, _output(rack, "kill")
        assert time.monotonic() < deadline, _output(rack, "kill")
        time.sleep(0.1)
    proc.kill()
    proc.wait(timeout=10)
    t0 = time.monotonic()
    remote = [h for h in rack.hosts if h.name != "w0"]
    while any(m.processes(h) for h in remote) and time.monotonic() - t0 < 15:
        time.sleep(0.1)
    took = time.monotonic() - t0
    left = {h.name: m.describe(m.processes(h)) for h in remote if m.processes(h)}
    assert not left, left
    assert took < 12, took


@pytest.mark.timeout(60)
def test_unreachable_host_is_named_quickly(machines) -> None:
    rack, m = machines
    t0 = time.monotonic()
    proc = _fastpsrun(m, ["-np", "2", "-H", "w0:1,w9:1", sys.executable, "-c", "pass"], "unr")
    codes = rack.run_all([proc], timeout=30, check=False)
    took = time.monotonic() - t0
    out = _output(rack, "unr")
    assert codes == [1], out
    assert "hosts not ready, nothing started" in out and "host w9: ssh failed" in out, out
    assert took < 10.0, (took, out)
    _assert_nothing_left(rack, m)


@pytest.mark.timeout(60)
def test_host_without_fastps_is_named(machines) -> None:
    rack, m = machines
    proc = _fastpsrun(m, ["-np", "2", "-H", "w0:1,c2:1", sys.executable, "-c", "pass"], "nofp")
    codes = rack.run_all([proc], timeout=50, check=False)
    out = _output(rack, "nofp")
    assert codes == [1], out
    assert "host c2: fastps is not usable" in out, out
    assert "host w0" not in out.split("nothing started")[-1], out
    _assert_nothing_left(rack, m)
