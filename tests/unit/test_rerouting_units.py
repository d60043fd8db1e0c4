"""ReroutingWorker (core/worker/rerouting.py) against in-process fakes of the core,
the servers and the scheduler, to drive the case a real SIGKILL hits only by chance: a
server that answered a round to one worker and died before answering the other. The
worker that got its sum has already started the next round; both must end with every
round's complete sum, each worker's input counted once. Also the plan (redo_plan)."""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Tuple

import numpy as np
import pytest
from fastps.control.server_pool import redo_plan
from fastps.errors import FastPSAbort, FastPSError
from fastps.worker.rerouting import ReroutingWorker

WAIT = 20.0


class FakeServers:
    """Sums the pushes of each (core name, round) over the workers; ``mute(rank)`` makes
    it keep the answers for that rank (the server died before sending them)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.lock = threading.Lock()
        self.rounds: Dict[Tuple[str, int], Dict[int, Tuple[np.ndarray, Any]]] = {}
        self.counts: Dict[Tuple[int, str], int] = {}
        self.muted: set = set()
        self.contributions: List[Tuple[str, int, int]] = []  # (core name, round, rank)

    def push(self, rank: int, name: str, data: np.ndarray, deliver: Any) -> None:
        with self.lock:
            k = self.counts.get((rank, name), 0) + 1
            self.counts[(rank, name)] = k
            got = self.rounds.setdefault((name, k), {})
            assert rank not in got, f"rank {rank} pushed {name} round {k} twice"
            got[rank] = (data.copy(), deliver)
            self.contributions.append((name, k, rank))
            if len(got) < self.n:
                return
            total = sum(d for d, _ in got.values())
            targets = [(r, cb) for r, (_, cb) in got.items() if r not in self.muted]
        for _, cb in targets:
            cb(total)


class FakeCore:
    """The methods of fastps._core.Worker that ReroutingWorker uses, over FakeServers."""

    def __init__(self, rank: int, servers: FakeServers) -> None:
        self.rank = rank
        self.servers = servers
        self.cv = threading.Condition()
        self.handles: Dict[int, Dict[str, Any]] = {}
        self.next = 1
        self.err = ""

    def push_pull_group(self, rows):
        if self.err:
            raise FastPSAbort(self.err)
        ids = []
        for row in rows:
            in_ptr, out_ptr, nbytes, _dtype, name = row[:5]
            hid, self.next = self.next, self.next + 1
            h = {"done": False, "error": None, "out": out_ptr, "nbytes": nbytes}
            self.handles[hid] = h
            data = np.ctypeslib.as_array(
                (np.ctypeslib.ctypes.c_float * (nbytes // 4)).from_address(in_ptr)
            ).copy()

            def deliver(total, h=h):
                with self.cv:
                    if h["done"]:
                        return
                    dst = (np.ctypeslib.ctypes.c_float * (h["nbytes"] // 4)).from_address(h["out"])
                    np.ctypeslib.as_array(dst)[:] = total
                    h["done"] = True
                    self.cv.notify_all()

            self.servers.push(self.rank, name, data, deliver)
            ids.append(hid)
        return ids

    def wait(self, hid, timeout_s):
        with self.cv:
            h = self.handles[hid]
            if not self.cv.wait_for(lambda: h["done"], timeout_s):
                raise TimeoutError(f"fake handle {hid}")
            del self.handles[hid]
            if h["error"]:
                raise FastPSAbort(h["error"])

    def poll(self, hid):
        with self.cv:
            return self.handles[hid]["done"]

    def release(self, hid):
        with self.cv:
            self.handles.pop(hid, None)

    def abort(self, reason, quiet=False):
        with self.cv:
            self.err = reason
            for h in self.handles.values():
                if not h["done"]:
                    h["done"], h["error"] = True, reason
            self.cv.notify_all()

    def error(self):
        return self.err

    def shutdown(self):
        self.abort(self.err or "shut down")

    def stats(self):
        return {}


class FakeScheduler:
    """Gathers the workers' reports and sends the plan, as ServerPool does."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.clients: List[FakeClient] = []
        self.reports: Dict[int, Dict[str, Any]] = {}
        self.lock = threading.Lock()

    def announce(self, epoch: int) -> None:
        for c in self.clients:
            c.handlers["servers"]({"epoch": epoch, "servers": [], "why": "test"})

    def report(self, rank: int, msg: Dict[str, Any]) -> None:
        with self.lock:
            self.reports[rank] = {k: tuple(v) for k, v in msg["rounds"].items()}
            if len(self.reports) < self.n:
                return
            plan, err = redo_plan(self.reports)
            assert err is None, err
            self.plan = plan
            self.reports = {}
        for c in self.clients:
            c.handlers["reroute_plan"]({"epoch": msg["epoch"], "redo": plan})


class FakeClient:
    abort_reason = None

    def __init__(self, rank: int, sched: FakeScheduler) -> None:
        self.rank, self.sched, self.handlers = rank, sched, {}
        sched.clients.append(self)

    def on_message(self, kind, cb):
        self.handlers[kind] = cb

    def send_message(self, msg):
        threading.Thread(target=self.sched.report, args=(self.rank, msg)).start()

    def send_abort(self, reason):
        raise AssertionError(f"worker {self.rank} asked to abort: {reason}")


def _grad(rank: int, rnd: int) -> np.ndarray:
    return np.full(4, 10.0 * rnd + rank + 1, dtype=np.float32)


def test_round_answered_to_one_worker_only_is_summed_again_once():
    n = 2
    old, new = FakeServers(n), FakeServers(n)
    sched = FakeScheduler(n)
    cores: Dict[Tuple[int, int], FakeCore] = {}

    def builder(rank):
        def build(_servers, epoch):
            core = FakeCore(rank, old if epoch == 0 else new)
            cores[(rank, epoch)] = core
            return core

        return build

    ws = [ReroutingWorker(builder(r), FakeClient(r, sched), [], r, WAIT) for r in range(n)]

    def start(r, rnd, buf):
        buf[:] = _grad(r, rnd)
        return ws[r].push_pull(buf.ctypes.data, buf.ctypes.data, buf.nbytes, "float32", "g", 0, 1.0)

    bufs = [np.zeros(4, np.float32) for _ in range(n)]
    # Round 1: the server answers worker 0 and dies before answering worker 1.
    old.muted.add(1)
    h0 = start(0, 1, bufs[0])
    h1 = start(1, 1, bufs[1])
    ws[0].wait(h0, WAIT)
    np.testing.assert_array_equal(bufs[0], _grad(0, 1) + _grad(1, 1))
    # Worker 0 goes on: round 2 reaches the dying server, which never answers it.
    old.muted.add(0)
    b0 = np.zeros(4, np.float32)
    h0 = start(0, 2, b0)
    for r in range(n):
        cores[(r, 0)].abort("lost connection to server 1")
    sched.announce(1)
    ws[1].wait(h1, WAIT)  # round 1 summed again on the new servers
    np.testing.assert_array_equal(bufs[1], _grad(0, 1) + _grad(1, 1))
    b1 = np.zeros(4, np.float32)
    h1 = start(1, 2, b1)  # worker 1's round 2 starts only now, on the new core
    ws[0].wait(h0, WAIT)
    ws[1].wait(h1, WAIT)
    want = _grad(0, 2) + _grad(1, 2)
    np.testing.assert_array_equal(b0, want)
    np.testing.assert_array_equal(b1, want)
    assert sched.plan == {"g": [0, 2]}
    # On the new servers each worker contributed rounds 1 and 2 of g exactly once; worker
    # 0's round 1 was a replay from its copy (its buffer already held the old sum).
    assert sorted(new.contributions) == [
        ("g@servers1", 1, 0),
        ("g@servers1", 1, 1),
        ("g@servers1", 2, 0),
        ("g@servers1", 2, 1),
    ]
    for w in ws:
        assert w.server_epoch(1, timeout=WAIT) == 1
    assert [c["replayed"] for c in ws[0].changes] == [1]
    assert [c["replayed"] for c in ws[1].changes] == [0]
    for w in ws:
        w.shutdown()


@pytest.mark.parametrize(
    "reports, plan",
    [
        ({0: {"g": (3, 3)}, 1: {"g": (3, 3)}}, {}),  # nothing in flight
        ({0: {"g": (3, 4)}, 1: {"g": (3, 3)}}, {"g": [3, 4]}),  # one started round 4
        ({0: {"g": (4, 5)}, 1: {"g": (3, 4)}}, {"g": [3, 5]}),  # answered to rank 0 only
        ({0: {"g": (0, 1)}, 1: {}}, {"g": [0, 1]}),  # absent: not pushed yet (0, 0)
    ],
)
def test_redo_plan(reports, plan):
    got, err = redo_plan(reports)
    assert err is None and got == plan


def test_redo_plan_refuses_inconsistent_reports():
    _, err = redo_plan({0: {"g": (7, 7)}, 1: {"g": (3, 3)}})
    assert err is not None and "'g'" in err and "more than two apart" in err
    _, err = redo_plan({0: {"g": (4, 3)}})
    assert err is not None and "worker 0" in err


def test_compression_and_async_exchanges_are_refused_by_name():
    sched = FakeScheduler(1)
    servers = FakeServers(1)
    w = ReroutingWorker(lambda _s, _e: FakeCore(0, servers), FakeClient(0, sched), [], 0, WAIT)
    buf = np.zeros(4, np.float32)
    args = (buf.ctypes.data, buf.ctypes.data, buf.nbytes, "float32", "layer1.weight", 0, 1.0)
    with pytest.raises(FastPSError, match=r"'layer1\.weight'.*compression \(onebit"):
        w.push_pull(*args, compression="onebit:ef")
    with pytest.raises(FastPSError, match=r"'layer1\.weight'.*async"):
        w.push_pull(*args, mode=1)
    with pytest.raises(FastPSError, match=r"'layer1\.weight'.*compression"):
        w.push_pull_group([(*args, True, True, 0, "topk:0.01")])
