"""Structure-aware fuzzer of the control protocol (core/control/protocol.py,
core/control/scheduler.py).

Phase A sends, against one long-lived scheduler, everything an outsider or an authenticated
but unregistered peer can send: garbage, zero and oversized frame lengths, truncated frames,
non-JSON, wrong macs, and every message type with each field set to an invalid value. The
scheduler must close such connections and nothing else: a legitimate two-worker job must
then register, pass a barrier and finish on it.

Phase B registers a real worker 0 on a fresh scheduler and then sends one mutated message
as that worker: the scheduler may refuse it or abort the job naming the worker, but it must
never fail internally or stall.

    python tests/fuzz/control_fuzz.py --cases 100000 [--seed N]
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import secrets
import socket
import struct
import threading
import time
from typing import Any, Callable, Dict, List, Optional

from fastps.control.protocol import ControlClient, FrameDecoder, compute_mac, encode_frame
from fastps.control.scheduler import Scheduler

WEIRD: List[Any] = [
    None,
    -1,
    0,
    1,
    2,
    2**70,
    -(2**70),
    1.5,
    float("inf"),
    True,
    "",
    "x" * 5000,
    "\u0000",
    [],
    [1, -1],
    {},
    {"a": 1},
    "worker",
    "server",
]
REGISTER = {
    "type": "register",
    "role": "worker",
    "id": 0,
    "host": "127.0.0.1",
    "hostname": "fz",
    "pid": 1,
    "data_addr": None,
    "num_workers": 2,
    "num_servers": 0,
}
MESSAGES: List[Dict[str, Any]] = [
    REGISTER,
    {"type": "barrier", "name": "b"},
    {"type": "declare", "name": "t", "shape": [2, 3], "dtype": "float32", "rank": 0},
    {"type": "heartbeat"},
    {"type": "bye"},
    {"type": "abort", "reason": "fuzz"},
    {"type": "nonsense"},
]


def invalid_for(name: str, rng: random.Random) -> Any:
    """A value the scheduler must refuse in the field ``name`` of a register message."""
    bad: Dict[str, List[Any]] = {
        "role": [None, 1, "", "scheduler", "Worker", [], {}],
        "id": [None, -1, 2, 1000, 2**70, 1.0, True, "0", []],
        "host": [None, 1, [], {}],
        "hostname": [None, 1, [], {}],
        "pid": [None, "1", 1.5, True, []],
        "data_addr": [1, [], {}, True],
        "num_workers": [0, 1, 3, -1, "2", 2.5],
        "num_servers": [1, -1, "0", 0.5],
    }
    return rng.choice(bad[name])


class RawClient:
    """Speaks the control protocol byte by byte, so anything can be sent."""

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched
        self.sock = socket.create_connection(sched.address, timeout=5.0)
        self.decoder = FrameDecoder()
        self.pending: List[Dict[str, Any]] = []

    def recv(self, timeout: float = 5.0) -> Optional[Dict[str, Any]]:
        self.sock.settimeout(timeout)
        while not self.pending:
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                return None
            except OSError:
                data = b""
            if not data:
                return None
            self.pending.extend(self.decoder.feed(data))
        return self.pending.pop(0)

    def auth(self) -> None:
        ch = self.recv()
        assert ch is not None and ch["type"] == "challenge", ch
        mac = compute_mac(self.sched._token, bytes.fromhex(ch["nonce"]), self.sched.job_id)
        self.send({"type": "auth", "mac": mac})
        ok = self.recv()
        assert ok is not None and ok["type"] == "auth_ok", ok

    def send(self, msg: Dict[str, Any]) -> None:
        self.sock.sendall(encode_frame(msg))

    def raw(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError:
            pass

    def closed_within(self, timeout: float) -> bool:
        """True if the scheduler closed the connection (reading what it sent meanwhile)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self.sock.settimeout(max(0.001, end - time.monotonic()))
            try:
                if not self.sock.recv(65536):
                    return True
            except socket.timeout:
                return False
            except OSError:
                return True
        return False

    def close(self) -> None:
        self.sock.close()


def garbage_frames(rng: random.Random) -> bytes:
    """Frames broken at the framing layer."""
    kind = rng.randrange(8)
    if kind == 0:
        return os.urandom(rng.randrange(1, 300))
    if kind == 1:
        return struct.pack(">I", 0)
    if kind == 2:
        return struct.pack(">I", rng.choice([4097, 1 << 20, (1 << 20) + 1, (1 << 32) - 1]))
    if kind == 3:
        return struct.pack(">I", rng.randrange(1, 4096))[: rng.randrange(1, 4)]
    if kind == 4:  # a length followed by fewer bytes than it claims
        return struct.pack(">I", 100) + b"{" * rng.randrange(0, 99)
    if kind == 5:
        body = rng.choice(
            [
                b"\xff\xfe",
                b"[1,2]",
                b'"s"',
                b"{}",
                b'{"type": 5}',
                b"nul",
                b"[" * 5000,
                b'{"type":"auth"',
            ]
        )
        return struct.pack(">I", len(body)) + body
    if kind == 6:
        body = os.urandom(rng.randrange(1, 200))
        return struct.pack(">I", len(body)) + body
    msg = dict(rng.choice(MESSAGES))
    frame = encode_frame(msg)
    return frame[: rng.randrange(1, len(frame))]


def mutated_message(rng: random.Random, invalid_only: bool) -> Dict[str, Any]:
    msg = dict(rng.choice(MESSAGES))
    if invalid_only:
        if msg["type"] in ("abort", "bye"):  # valid from anyone: would end phase A's job
            msg["type"] = rng.choice(["Abort", "bye ", "", "x" * 300])
        elif msg["type"] == "register":
            field = rng.choice([k for k in msg if k != "type"])
            msg[field] = invalid_for(field, rng)
            return msg
    for field in rng.sample([k for k in msg if k != "type"] or ["extra"], 1):
        msg[field] = rng.choice(WEIRD)
    if rng.random() < 0.1:
        msg["type"] = rng.choice(WEIRD[1:] + ["auth", "challenge", "membership"])
    return msg


class ControlFuzzer:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.counts: Dict[str, int] = {}

    def new_scheduler(self, num_workers: int = 2) -> Scheduler:
        sched = Scheduler(
            num_workers,
            0,
            "cf" + secrets.token_hex(3),
            secrets.token_hex(8),
            timeout=60.0,
            heartbeat_timeout=10.0,
            auth_timeout=1.0,
            grace=0.5,
        )
        sched.start()
        return sched

    # Phase A: nothing here may change the job.
    def outsider_case(self, sched: Scheduler) -> None:
        rng = self.rng
        c = RawClient(sched)
        try:
            kind = rng.randrange(5)
            name = [
                "garbage_preauth",
                "bad_auth",
                "garbage_postauth",
                "invalid_msg",
                "msg_preauth",
            ][kind]
            self.counts[name] = self.counts.get(name, 0) + 1
            if kind == 0:
                c.raw(garbage_frames(rng))
            elif kind == 1:
                c.recv()
                c.send({"type": "auth", "mac": rng.choice(WEIRD)})
            elif kind == 4:
                c.recv()
                c.send(mutated_message(rng, invalid_only=True))
            else:
                c.auth()
                if kind == 2:
                    c.raw(garbage_frames(rng))
                else:
                    for _ in range(rng.randrange(1, 4)):
                        c.send(mutated_message(rng, invalid_only=True))
            if rng.random() < 0.3:
                c.closed_within(0.02)
        except (OSError, AssertionError):
            pass
        finally:
            c.close()

    def legit_job(self, sched: Scheduler) -> None:
        errors: List[BaseException] = []

        def worker(rank: int) -> None:
            client = ControlClient(sched.address, sched.job_id, sched._token, timeout=20.0)
            try:
                m = client.register("worker", rank, "127.0.0.1", "fz", num_workers=2, num_servers=0)
                assert len(m.workers) == 2
                client.barrier("after-fuzz", timeout=20.0)
            except BaseException as exc:  # reported below
                errors.append(exc)
            finally:
                client.close()

        threads = [threading.Thread(target=worker, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        if errors:
            raise AssertionError(f"legitimate job failed after fuzzing: {errors[0]!r}")
        if not sched.join(20):
            raise AssertionError("scheduler did not finish after the legitimate job")
        if sched.exit_code != 0:
            raise AssertionError(f"scheduler aborted: {sched.abort_reason}")

    # Phase B: a registered worker misbehaves once.
    def member_case(self) -> None:
        sched = self.new_scheduler()
        c = RawClient(sched)
        sent: Dict[str, Any] = {}
        try:
            c.auth()
            c.send(dict(REGISTER))
            if self.rng.random() < 0.3:
                c.raw(garbage_frames(self.rng))
                kind = "member_garbage"
            else:
                sent = mutated_message(self.rng, invalid_only=False)
                c.send(sent)
                kind = "member_mutated"
            self.counts[kind] = self.counts.get(kind, 0) + 1
            c.closed_within(0.02)
        except OSError:
            pass
        finally:
            c.close()
            sched.stop()
            if not sched.join(10):
                raise AssertionError("scheduler did not stop within 10 s")
            reason = sched.abort_reason or ""
            if "internal error" in reason:
                raise AssertionError(f"scheduler failed internally: {reason}")
            # An abort a node asks for carries that node's own words.
            if reason and "worker 0" not in reason and sent.get("type") != "abort":
                raise AssertionError(f"abort does not name the culprit: {reason}")

    def run(self, cases: int, deadline: Optional[float] = None) -> int:
        sched = self.new_scheduler()
        done = 0
        per_job = 500
        try:
            for done in range(1, cases + 1):
                if self.rng.random() < 0.15:
                    self.member_case()
                else:
                    self.outsider_case(sched)
                    if sched.abort_reason is not None:
                        raise AssertionError(
                            f"case {done}: an outsider aborted the job: {sched.abort_reason}"
                        )
                if done % per_job == 0:
                    self.legit_job(sched)
                    sched = self.new_scheduler()
                if deadline is not None and time.monotonic() > deadline:
                    break
            self.legit_job(sched)
        finally:
            sched.stop()
        return done


def fuzz(cases: int, seed: int, max_seconds: Optional[float] = None) -> Dict[str, object]:
    # Refusals are logged as warnings by design; thousands of them would drown the output.
    logging.getLogger("fastps").setLevel(logging.CRITICAL)
    failures: List[str] = []
    original: Callable[..., None] = logging.Logger.exception

    def spy(self: logging.Logger, msg: object, *args: object, **kw: Any) -> None:
        failures.append(str(msg))
        original(self, msg, *args, **kw)

    logging.Logger.exception = spy  # type: ignore[method-assign]
    t0 = time.monotonic()
    fz = ControlFuzzer(seed)
    try:
        done = fz.run(cases, None if max_seconds is None else t0 + max_seconds)
    finally:
        logging.Logger.exception = original  # type: ignore[method-assign]
        logging.getLogger("fastps").setLevel(logging.NOTSET)
    if failures:
        raise AssertionError(f"scheduler logged internal failures: {failures[:3]}")
    return {"cases": done, "seconds": round(time.monotonic() - t0, 1), "by_kind": fz.counts}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=int(os.environ.get("FASTPS_FUZZ_CASES", 1000)))
    ap.add_argument("--seed", type=int, default=int(time.time()))
    args = ap.parse_args()
    print(f"seed {args.seed}", flush=True)
    print(fuzz(args.cases, args.seed))


if __name__ == "__main__":
    main()
