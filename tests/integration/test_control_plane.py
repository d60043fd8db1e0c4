"""Control plane: scheduler and client over real sockets and processes. Configuration and
framing alone: tests/unit/test_config.py, tests/unit/test_control_frames.py."""

from __future__ import annotations

import logging
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, Iterator, List, Tuple

import pytest
from fastps.control.protocol import (
    MAX_FRAME,
    ControlClient,
    FrameDecoder,
    Membership,
    compute_mac,
    encode_frame,
)
from fastps.control.scheduler import Scheduler
from fastps.errors import FastPSAbort, FastPSError, FastPSTimeoutError

JOB = "testjob"
TOKEN = "s3cret"

# ----------------------------------------------------------------- helpers


@pytest.fixture
def make_scheduler() -> Iterator[Callable[..., Scheduler]]:
    started: List[Scheduler] = []

    def make(num_workers: int, num_servers: int, **kw: float) -> Scheduler:
        kw.setdefault("timeout", 20.0)
        kw.setdefault("heartbeat_timeout", 5.0)
        sched = Scheduler(num_workers, num_servers, JOB, TOKEN, **kw)  # type: ignore[arg-type]
        sched.start()
        started.append(sched)
        return sched

    yield make
    for sched in started:
        sched.stop()
        assert sched.join(5.0)


def client(sched: Scheduler, token: str = TOKEN, timeout: float = 10.0) -> ControlClient:
    return ControlClient(
        sched.address, JOB, token, timeout=timeout, heartbeat_interval=0.2, heartbeat_timeout=5.0
    )


def register_all(
    sched: Scheduler, hostnames: Dict[int, str], num_servers: int = 0
) -> Tuple[Dict[Tuple[str, int], ControlClient], Dict[Tuple[str, int], Membership]]:
    """Registers workers (rank → hostname) and servers concurrently from threads."""
    clients: Dict[Tuple[str, int], ControlClient] = {}
    results: Dict[Tuple[str, int], Membership] = {}
    errors: List[BaseException] = []

    def run(role: str, nid: int, hostname: str) -> None:
        c = client(sched)
        clients[(role, nid)] = c
        try:
            addr = f"127.0.0.1:{9000 + nid}" if role == "server" else None
            results[(role, nid)] = c.register(role, nid, "127.0.0.1", hostname, data_addr=addr)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=("worker", r, h)) for r, h in hostnames.items()]
    threads += [threading.Thread(target=run, args=("server", s, "cpu")) for s in range(num_servers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not errors, errors
    return clients, results


def close_all(clients: Dict[Tuple[str, int], ControlClient]) -> None:
    for c in clients.values():
        c.close()


def raw_connect(sched: Scheduler) -> Tuple[socket.socket, bytes]:
    sock = socket.create_connection(sched.address, timeout=5)
    challenge = read_frames(sock, 1)[0]
    assert challenge["type"] == "challenge"
    return sock, bytes.fromhex(challenge["nonce"])


def read_frames(sock: socket.socket, count: int) -> List[dict]:
    decoder = FrameDecoder()
    out: List[dict] = []
    while len(out) < count:
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("closed")
        out += decoder.feed(data)
    return out


def closed_by_peer(sock: socket.socket, timeout: float = 5.0) -> bool:
    """True if the peer closes the connection within ``timeout`` (input is discarded)."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
    except socket.timeout:
        return False
    except OSError:
        return True
    return True


NODE_SCRIPT = r"""
import sys
from fastps.control import ControlClient
port, job, token, role, nid, hostname = sys.argv[1:7]
c = ControlClient(("127.0.0.1", int(port)), job, token, timeout=20,
                  heartbeat_interval=0.2, heartbeat_timeout=5)
c.register(role, int(nid), "127.0.0.1", hostname)
print("REGISTERED", flush=True)
reason = c.wait_shutdown(60)
print("ABORT " + reason if reason else "SHUTDOWN", flush=True)
c.close()
"""


def spawn_node(
    sched: Scheduler, role: str, nid: int, env: Dict[str, str], hostname: str = "h"
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", NODE_SCRIPT, str(sched.port), JOB, TOKEN, role, str(nid), hostname],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    """One stdout line of ``proc`` within ``timeout`` seconds ('' on timeout or EOF)."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            return ""
    return proc.stdout.readline().strip()


def kill_all(procs: List[subprocess.Popen[str]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.communicate(timeout=10)


# ------------------------------------------------------------ registration


def test_registration_membership_and_local_ranks(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    sched = make_scheduler(4, 2)
    hostnames = {0: "node-b", 1: "node-a", 2: "node-b", 3: "node-a"}
    clients, results = register_all(sched, hostnames, num_servers=2)
    try:
        first = results[("worker", 0)]
        assert all(m == first for m in results.values())
        assert [w.rank for w in first.workers] == [0, 1, 2, 3]
        assert [(w.hostname, w.local_rank, w.local_size) for w in first.workers] == [
            ("node-b", 0, 2),
            ("node-a", 0, 2),
            ("node-b", 1, 2),
            ("node-a", 1, 2),
        ]
        assert all(w.pid == os.getpid() for w in first.workers)
        assert [(s.id, s.addr, s.hostname) for s in first.servers] == [
            (0, "127.0.0.1:9000", "cpu"),
            (1, "127.0.0.1:9001", "cpu"),
        ]
    finally:
        close_all(clients)
    assert sched.join(5.0) and sched.exit_code == 0


def test_clean_leave_shuts_servers_down_and_scheduler_stops(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    sched = make_scheduler(2, 1)
    clients, _ = register_all(sched, {0: "h", 1: "h"}, num_servers=1)
    server = clients[("server", 0)]
    shutdowns: List[str] = []
    server.on_shutdown(shutdowns.append)
    clients[("worker", 0)].close()
    with pytest.raises(FastPSTimeoutError):
        server.wait_shutdown(0.3)  # one worker still in the job
    clients[("worker", 1)].close()
    assert server.wait_shutdown(5.0) is None
    assert shutdowns == ["shutdown"]
    server.close()
    assert sched.join(5.0) and sched.exit_code == 0 and sched.abort_reason is None


def test_registration_timeout_names_missing_nodes(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    sched = make_scheduler(3, 2, timeout=1.0)
    errors: Dict[str, str] = {}

    def run(role: str, nid: int) -> None:
        c = client(sched)
        try:
            c.register(role, nid, "127.0.0.1", "h")
        except FastPSAbort as exc:
            errors[f"{role} {nid}"] = str(exc)
        finally:
            c.close()

    t0 = time.monotonic()
    threads = [threading.Thread(target=run, args=a) for a in (("worker", 0), ("server", 0))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    assert time.monotonic() - t0 < 10
    assert set(errors) == {"worker 0", "server 0"}
    for reason in errors.values():
        assert "registration timed out" in reason
        assert "missing worker 1, worker 2, server 1" in reason
    assert sched.join(5.0) and sched.exit_code == 1


def test_duplicate_and_out_of_range_registrations_are_refused(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    sched = make_scheduler(2, 0)
    first = client(sched)
    t = threading.Thread(target=first.register, args=("worker", 0, "127.0.0.1", "h"), daemon=True)
    t.start()
    deadline = time.monotonic() + 5
    while first.abort_reason is None and time.monotonic() < deadline:
        if 0 in sched._workers:  # noqa: SLF001 - wait until rank 0 is known
            break
        time.sleep(0.01)
    with pytest.raises(FastPSError, match="duplicate worker 0"):
        client(sched).register("worker", 0, "127.0.0.1", "h2")
    with pytest.raises(FastPSError, match="worker rank 5 .* out of range"):
        client(sched).register("worker", 5, "127.0.0.1", "h")
    with pytest.raises(FastPSError, match="FASTPS_NUM_WORKERS=3 but the scheduler expects 2"):
        client(sched).register("worker", 1, "127.0.0.1", "h", num_workers=3)
    # The job goes on: rank 1 can still join and complete the membership.
    second = client(sched)
    membership = second.register("worker", 1, "127.0.0.1", "h")
    t.join(5)
    assert [w.rank for w in membership.workers] == [0, 1]
    assert sched.abort_reason is None
    first.close()
    second.close()


def test_client_retries_until_scheduler_starts() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    sched = Scheduler(1, 0, JOB, TOKEN, port=port, timeout=10)
    timer = threading.Timer(0.7, sched.start)
    timer.start()
    c = ControlClient(("127.0.0.1", port), JOB, TOKEN, timeout=10)
    try:
        assert [w.rank for w in c.register("worker", 0, "127.0.0.1", "h").workers] == [0]
    finally:
        c.close()
        timer.join()
        sched.stop()
        assert sched.join(5)


def test_connect_timeout_when_no_scheduler() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    c = ControlClient(("127.0.0.1", port), JOB, TOKEN, timeout=0.5)
    t0 = time.monotonic()
    with pytest.raises(FastPSTimeoutError, match="could not connect to the scheduler"):
        c.register("worker", 0, "127.0.0.1", "h")
    assert time.monotonic() - t0 < 3


# --------------------------------------------------------------- barriers


def test_barrier_waits_for_every_worker(make_scheduler: Callable[..., Scheduler]) -> None:
    sched = make_scheduler(3, 0)
    clients, _ = register_all(sched, {0: "h", 1: "h", 2: "h"})
    try:
        for round_ in range(2):  # the same name can be reused
            passed: List[int] = []

            def enter(rank: int, passed: List[int] = passed) -> None:
                clients[("worker", rank)].barrier("sync", timeout=10)
                passed.append(rank)

            threads = [threading.Thread(target=enter, args=(r,)) for r in (0, 1)]
            for t in threads:
                t.start()
            time.sleep(0.3)
            assert passed == [], f"round {round_}: barrier released before rank 2 arrived"
            enter(2)
            for t in threads:
                t.join(5)
            assert sorted(passed) == [0, 1, 2]
        with pytest.raises(FastPSTimeoutError, match="barrier 'lonely' timed out"):
            clients[("worker", 0)].barrier("lonely", timeout=0.3)
    finally:
        close_all(clients)


# ----------------------------------------------------- untrusted connections


def test_wrong_token_is_refused_and_job_goes_on(
    make_scheduler: Callable[..., Scheduler], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="fastps.scheduler")
    sched = make_scheduler(2, 0)
    with pytest.raises(FastPSError, match="closed the connection during authentication"):
        client(sched, token="wrong").register("worker", 0, "127.0.0.1", "h")
    sock, nonce = raw_connect(sched)
    sock.sendall(encode_frame({"type": "auth", "mac": compute_mac("guess", nonce, JOB)}))
    assert closed_by_peer(sock)
    sock.close()
    silent = socket.create_connection(sched.address)  # never authenticates
    refusals = [r.getMessage() for r in caplog.records if "bad token" in r.getMessage()]
    assert len(refusals) == 2 and all(
        m.startswith("refused connection from 127.0.0.1:") for m in refusals
    )
    clients, results = register_all(sched, {0: "h", 1: "h"})
    try:
        assert len(results) == 2 and sched.abort_reason is None
    finally:
        close_all(clients)
        silent.close()


def test_auth_timeout_closes_silent_connections(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    sched = make_scheduler(1, 0, auth_timeout=0.5)
    sock, _ = raw_connect(sched)
    t0 = time.monotonic()
    assert closed_by_peer(sock, timeout=5)
    assert 0.3 < time.monotonic() - t0 < 3
    sock.close()


@pytest.mark.parametrize(
    "payload",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        struct.pack(">I", MAX_FRAME + 1) + b"x" * 1000,
        struct.pack(">I", 5) + b"\x00\xff{]!",
        struct.pack(">I", 2) + b"[]",
    ],
    ids=["http", "oversized", "not-json", "not-object"],
)
@pytest.mark.parametrize("authenticated", [False, True], ids=["preauth", "authed"])
def test_bad_frames_close_only_that_connection(
    make_scheduler: Callable[..., Scheduler], payload: bytes, authenticated: bool
) -> None:
    sched = make_scheduler(2, 0)
    clients, _ = register_all(sched, {0: "h", 1: "h"})
    try:
        sock, nonce = raw_connect(sched)
        if authenticated:
            sock.sendall(encode_frame({"type": "auth", "mac": compute_mac(TOKEN, nonce, JOB)}))
            assert read_frames(sock, 1)[0]["type"] == "auth_ok"
        sock.sendall(payload)
        assert closed_by_peer(sock)
        sock.close()
        # The registered workers were not disturbed.
        t = threading.Thread(target=clients[("worker", 1)].barrier, args=("after",))
        t.start()
        clients[("worker", 0)].barrier("after", timeout=5)
        t.join(5)
        assert sched.abort_reason is None
    finally:
        close_all(clients)


# ------------------------------------------------------------------ aborts


def test_declare_mismatch_aborts_every_client(make_scheduler: Callable[..., Scheduler]) -> None:
    sched = make_scheduler(3, 1)
    clients, _ = register_all(sched, {0: "h", 1: "h", 2: "h"}, num_servers=1)
    reasons: Dict[Tuple[str, int], str] = {}
    got_all = threading.Event()

    def recorder(key: Tuple[str, int]) -> Callable[[str], None]:
        def cb(reason: str) -> None:
            reasons[key] = reason
            if len(reasons) == len(clients):
                got_all.set()

        return cb

    for key, c in clients.items():
        c.on_abort(recorder(key))
    try:
        clients[("worker", 0)].declare("fc.weight", [10, 3], "float32", 0, 0)
        clients[("worker", 2)].declare("fc.weight", [10, 3], "float32", 2, 0)
        clients[("worker", 0)].declare("fc.bias", [10], "float32", 0, 0)
        time.sleep(0.2)
        assert not reasons  # same shapes: nothing happens
        clients[("worker", 1)].declare("fc.weight", [10, 4], "float32", 1, 0)
        assert got_all.wait(10)
        expected = (
            "tensor 'fc.weight' mismatch: rank 0 has float32[10, 3], rank 1 has float32[10, 4]"
        )
        assert set(reasons.values()) == {expected}
        with pytest.raises(FastPSAbort, match="fc.weight"):
            clients[("worker", 0)].barrier("x")
        late: List[str] = []
        clients[("worker", 2)].on_abort(late.append)  # registered after the fact: called now
        assert late == [expected]
    finally:
        close_all(clients)
    assert sched.join(5.0) and sched.exit_code == 1


def test_declared_priorities_must_agree_version_by_version(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    sched = make_scheduler(3, 1)
    clients, _ = register_all(sched, {0: "h", 1: "h", 2: "h"}, num_servers=1)
    reasons: List[str] = []
    clients[("worker", 0)].on_abort(reasons.append)
    w0, w1, w2 = (clients[("worker", r)] for r in range(3))
    try:
        # Every worker changes the priority of fc.weight the same way: that is fine.
        w0.declare("fc.weight", [10, 3], "float32", 0, 5, 0)
        w0.declare("fc.weight", [10, 3], "float32", 0, 7, 1)
        w1.declare("fc.weight", [10, 3], "float32", 1, 5, 0)
        w1.declare("fc.weight", [10, 3], "float32", 1, 7, 1)
        w2.declare("fc.weight", [10, 3], "float32", 2, 5, 0)
        # A tensor whose shape changes every step is declared every step; each version is
        # forgotten once every worker agreed on it.
        for v in range(20):
            for r, w in enumerate((w0, w1, w2)):
                w.declare("rows", [v + 1], "int64", r, 0, v)

        def declared() -> set:  # read on the scheduler's thread, which owns the table
            got: List[set] = []
            done = threading.Event()
            sched._call_soon(lambda: (got.append(set(sched._tensors)), done.set()))
            assert done.wait(5)
            return got[0]

        deadline = time.monotonic() + 10
        while declared() != {("fc.weight", 1)} and time.monotonic() < deadline:
            time.sleep(0.02)
        assert declared() == {("fc.weight", 1)}  # only the one w2 has yet to declare
        assert not reasons and sched.abort_reason is None
        # Worker 2's second declaration disagrees on the priority only.
        w2.declare("fc.weight", [10, 3], "float32", 2, 6, 1)
        deadline = time.monotonic() + 10
        while not reasons and time.monotonic() < deadline:
            time.sleep(0.02)
        assert reasons == [
            "tensor 'fc.weight' priority mismatch (declaration 2 of it): rank 0 gives it "
            "priority 7, rank 2 gives it priority 6; every worker must give a tensor the same "
            "priority (the push order across workers depends on it)"
        ]
    finally:
        close_all(clients)
    assert sched.join(5.0) and sched.exit_code == 1


def test_node_requested_abort_is_broadcast(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    sched = make_scheduler(2, 0)
    clients, _ = register_all(sched, {0: "h", 1: "h"})
    try:
        clients[("worker", 1)].send_abort("worker 1: server 0 at 10.0.0.2:7000 went away")
        for c in clients.values():
            assert c.wait_shutdown(10) == "worker 1: server 0 at 10.0.0.2:7000 went away"
    finally:
        close_all(clients)


def test_killed_process_aborts_the_others(
    make_scheduler: Callable[..., Scheduler], subprocess_env: Dict[str, str]
) -> None:
    sched = make_scheduler(3, 1)
    procs = [spawn_node(sched, "worker", r, subprocess_env) for r in range(3)]
    procs.append(spawn_node(sched, "server", 0, subprocess_env))
    try:
        for p in procs:
            assert read_line(p, 20) == "REGISTERED"
        victim = procs[1]
        t0 = time.monotonic()
        victim.send_signal(signal.SIGKILL)
        for p in (procs[0], procs[2], procs[3]):
            line = read_line(p, 30)
            assert line.startswith("ABORT worker 1 (pid "), line
            assert f"pid {victim.pid} on host h) died: connection closed" in line
            assert p.wait(10) == 0
        assert time.monotonic() - t0 < 30
    finally:
        kill_all(procs)


def test_hung_process_is_found_by_heartbeat(
    make_scheduler: Callable[..., Scheduler], subprocess_env: Dict[str, str]
) -> None:
    sched = make_scheduler(2, 0, heartbeat_timeout=1.5)
    procs = [spawn_node(sched, "worker", r, subprocess_env) for r in range(2)]
    try:
        for p in procs:
            assert read_line(p, 20) == "REGISTERED"
        procs[0].send_signal(signal.SIGSTOP)
        line = read_line(procs[1], 10)
        assert line.startswith("ABORT worker 0 (pid ") and "heartbeat timeout after 1.5 s" in line
    finally:
        procs[0].send_signal(signal.SIGCONT)
        kill_all(procs)


def test_lost_scheduler_is_an_abort(make_scheduler: Callable[..., Scheduler]) -> None:
    sched = make_scheduler(1, 0)
    clients, _ = register_all(sched, {0: "h"})
    try:
        sched.stop()
        reason = clients[("worker", 0)].wait_shutdown(10)
        assert reason is not None and reason.startswith(
            f"lost connection to scheduler at 127.0.0.1:{sched.port}"
        )
    finally:
        close_all(clients)


def test_standalone_scheduler_process(subprocess_env: Dict[str, str]) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = dict(
        subprocess_env,
        FASTPS_ROLE="scheduler",
        FASTPS_SCHEDULER_ADDR=f"127.0.0.1:{port}",
        FASTPS_JOB_ID=JOB,
        FASTPS_TOKEN=TOKEN,
        FASTPS_NUM_WORKERS="2",
        FASTPS_NUM_SERVERS="0",
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "fastps.scheduler"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        clients = [ControlClient(("127.0.0.1", port), JOB, TOKEN, timeout=10) for _ in range(2)]
        threads = [
            threading.Thread(target=c.register, args=("worker", r, "127.0.0.1", "h"))
            for r, c in enumerate(clients)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        for c in clients:
            c.close()
        out, err = proc.communicate(timeout=10)
        assert proc.returncode == 0, err
        assert f"on 127.0.0.1:{port}" in out
        assert "membership complete: 2 workers" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_standalone_scheduler_exits_1_on_abort(subprocess_env: Dict[str, str]) -> None:
    env = dict(
        subprocess_env,
        FASTPS_SCHEDULER_ADDR="127.0.0.1:0",
        FASTPS_NUM_WORKERS="1",
        FASTPS_TIMEOUT="0.5",
    )
    proc = subprocess.run(
        [sys.executable, "-m", "fastps.scheduler"],
        env=env,
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert proc.returncode == 1
    assert "registration timed out after 0.5 s: missing worker 0, server 0" in proc.stderr
