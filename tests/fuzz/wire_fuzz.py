"""Structure-aware fuzzer of the data-plane wire format (csrc/transport/wire.h).

It starts a real summation server (server_target.py), authenticates with the job's token as
a real worker would, and sends valid frame headers with fields mutated to interesting
values, every frame length from 0 up, truncated headers and payloads, oversized lengths,
mutated handshakes and plain garbage before and after authentication, and routed pushes
(forward / want-only flags and counts, valid and not). Every ``check_every`` cases (and at
the end) two honest workers push a part and must get the exact sum back, a routed part must
reach its receivers exactly (and its sender as an empty answer), and
the server process must still be alive: no crash, no stall, no corrupted state.

    python tests/fuzz/wire_fuzz.py --cases 100000 [--seed N]

The default test suite runs a few hundred cases (tests/integration/test_fuzz.py).
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import os
import random
import secrets
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

HEADER = struct.Struct("<IBBHIIQQQQQII")  # FrameHeader, 64 bytes
CHALLENGE = struct.Struct("<I32s")
HELLO = struct.Struct("<III32s")
FRAME_MAGIC = 0x4D535046
HELLO_MAGIC = 0x48535046
CHALLENGE_MAGIC = 0x43535046
PUSH, RESULT, ERROR, FATAL, BYE, SHM_ATTACH = 1, 2, 3, 4, 5, 6
FLAG_SHM = 1
FLAG_NO_DATA = 2  # a routed push asking only for the result: no payload follows
FLAG_NO_REPLY = 4  # a routed push whose sender wants no result: answered with len 0
FLOAT32 = 0
MAX_PART = 256 << 20
FIELDS = (
    "magic",
    "type",
    "dtype",
    "flags",
    "sender",
    "part",
    "tensor",
    "len",
    "tensor_bytes",
    "round",
    "shm_offset",
    "shm_segment",
    "pushers",
)
U64 = (1 << 64) - 1
U32 = (1 << 32) - 1

# Values worth trying for each field besides random ones.
INTERESTING: Dict[str, List[int]] = {
    "magic": [0, FRAME_MAGIC ^ 1, HELLO_MAGIC, U32],
    "type": list(range(0, 12)) + [127, 128, 255],
    "dtype": list(range(0, 11)) + [127, 255],
    "flags": [0, 1, 2, 3, 4, 5, 6, 7, 8, 0x8000, 0xFFFF],
    "sender": [0, 1, 2, 3, 1000, U32],
    "part": [0, 1, U32],
    "tensor": [0, 1, U64],
    "len": [
        0,
        1,
        2,
        3,
        4,
        5,
        7,
        8,
        12,
        4096,
        MAX_PART - 4,
        MAX_PART,
        MAX_PART + 4,
        1 << 31,
        1 << 32,
        1 << 63,
        U64 - 3,
        U64,
    ],
    "tensor_bytes": [0, 1, 4, 8, U64],
    "round": [0, 1, 2, U64],
    "shm_offset": [0, 4096, 4095, (1 << 63), U64 - 4095],
    "shm_segment": [0, 1, 2, 1000, U32],
    "pushers": [0, 1, 2, 3, 1000, U32],
}
WIDTH = {
    "magic": U32,
    "type": 255,
    "dtype": 255,
    "flags": 0xFFFF,
    "sender": U32,
    "part": U32,
    "shm_segment": U32,
    "pushers": U32,
}


def pack(h: Dict[str, int]) -> bytes:
    return HEADER.pack(*(h[f] for f in FIELDS))


def unpack(b: bytes) -> Dict[str, int]:
    return dict(zip(FIELDS, HEADER.unpack(b)))


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


@dataclass
class Target:
    """A server process under test and the job it serves."""

    num_workers: int = 2
    env: Optional[Dict[str, str]] = None
    job_id: str = field(default_factory=lambda: "fz" + secrets.token_hex(3))
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    proc: Optional[subprocess.Popen] = None
    port: int = 0
    log_path: str = ""

    def start(self) -> None:
        here = os.path.dirname(os.path.abspath(__file__))
        self.log_path = os.path.join("/tmp", f"fastps-fuzz-{self.job_id}.log")
        log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                os.path.join(here, "server_target.py"),
                self.job_id,
                self.token,
                str(self.num_workers),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=self.env,
        )
        log.close()
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.strip().isdigit():
            raise RuntimeError(f"server target did not start: {line!r}\n{self.log()}")
        self.port = int(line)

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> Tuple[int, str]:
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.close()
            out = self.proc.stdout.read() if self.proc.stdout else ""
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return -9, "server did not stop within 30 s"
        return code, out

    def connect(self, timeout: float = 5.0) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s

    def mac(self, nonce: bytes, rank: int) -> bytes:
        msg = nonce + self.job_id.encode() + struct.pack("<I", rank)
        return hmac.new(self.token.encode(), msg, hashlib.sha256).digest()

    def authed(self, rank: int, timeout: float = 5.0) -> socket.socket:
        """A connection that passed the handshake as worker ``rank``."""
        s = self.connect(timeout)
        magic, nonce = CHALLENGE.unpack(recv_exact(s, CHALLENGE.size))
        assert magic == CHALLENGE_MAGIC, hex(magic)
        s.sendall(HELLO.pack(HELLO_MAGIC, rank, 0, self.mac(nonce, rank)))
        ok = recv_exact(s, 1)
        if ok != b"\x01":
            raise ConnectionError(f"server refused rank {rank}: {ok!r}")
        return s


def valid_push(rng: random.Random, rank: int, n_elems: int) -> Dict[str, int]:
    n = n_elems * 4
    return {
        "magic": FRAME_MAGIC,
        "type": PUSH,
        "dtype": FLOAT32,
        "flags": 0,
        "sender": rank,
        "part": rng.randrange(4),
        "tensor": rng.getrandbits(64),
        "len": n,
        "tensor_bytes": n * rng.choice([1, 2]),
        "round": 0,
        "shm_offset": 0,
        "shm_segment": 0,
        "pushers": 0,
    }


def mutate(rng: random.Random, h: Dict[str, int], fields: int) -> Dict[str, int]:
    h = dict(h)
    for name in rng.sample(FIELDS, fields):
        if rng.random() < 0.75:
            h[name] = rng.choice(INTERESTING[name])
        else:
            h[name] = rng.getrandbits(64) & WIDTH.get(name, U64)
    return h


def payload_for(rng: random.Random, h: Dict[str, int]) -> Tuple[bytes, bool]:
    """Bytes to send after a header and whether they are short of what the header claims."""
    want = 0 if h["flags"] & (FLAG_SHM | FLAG_NO_DATA) else h["len"]
    n = min(want, 64 << 10)
    if want and rng.random() < 0.2:
        n = rng.randrange(n + 1)  # truncated payload
    return os.urandom(n), n < want


class Fuzzer:
    def __init__(self, target: Target, seed: int) -> None:
        self.t = target
        self.rng = random.Random(seed)
        self.counts: Dict[str, int] = {}
        self.checks = 0
        self.closed_by_server = 0

    # ------------------------------------------------------------------ cases
    def case_mutated_header(self, s: socket.socket) -> None:
        rank = self.rng.randrange(self.t.num_workers)
        h = mutate(
            self.rng,
            valid_push(self.rng, rank, self.rng.randrange(0, 64)),
            self.rng.choice([1, 1, 1, 2, 3]),
        )
        body, _ = payload_for(self.rng, h)
        s.sendall(pack(h) + body)

    def case_every_length(self, s: socket.socket) -> None:
        # Lengths 0..N with every dtype code (valid and not), exact payloads.
        n = self.rng.randrange(0, 40)
        h = valid_push(self.rng, 0, 0)
        h["dtype"] = self.rng.randrange(0, 12)
        h["len"] = n
        h["tensor_bytes"] = self.rng.choice([n, n + 4, 0])
        h["sender"] = self.rng.choice([0, 0, 1, 2, U32])
        h["type"] = self.rng.choice([PUSH, PUSH, RESULT, ERROR, FATAL, SHM_ATTACH, 0, 255])
        s.sendall(pack(h) + os.urandom(n))

    def case_truncated_header(self, s: socket.socket) -> None:
        h = mutate(self.rng, valid_push(self.rng, 0, 4), self.rng.randrange(0, 2))
        s.sendall(pack(h)[: self.rng.randrange(0, 64)])

    def case_oversize(self, s: socket.socket) -> None:
        h = valid_push(self.rng, 0, 1)
        h["len"] = self.rng.choice([MAX_PART + 4, 1 << 31, 1 << 40, 1 << 63, U64 - 3])
        h["tensor_bytes"] = self.rng.choice([h["len"], U64])
        s.sendall(pack(h) + os.urandom(self.rng.randrange(0, 4096)))

    def case_garbage_after_auth(self, s: socket.socket) -> None:
        s.sendall(os.urandom(self.rng.randrange(1, 300)))

    def case_sequence(self, s: socket.socket) -> None:
        # Several frames, valid ones and mutated ones, back to back (incl. byes).
        rank = 0
        frames = b""
        for _ in range(self.rng.randrange(2, 8)):
            h = valid_push(self.rng, rank, self.rng.randrange(0, 16))
            h["pushers"] = 2
            roll = self.rng.random()
            if roll < 0.3:
                h = mutate(self.rng, h, 1)
            elif roll < 0.4:
                h["type"] = BYE
            body, short = payload_for(self.rng, h)
            frames += pack(h) + body
            if short:
                break
        s.sendall(frames)

    def case_routed(self, s: socket.socket) -> None:
        # Routed pushes (forward / want-only) with their counts and flags varied, valid
        # and not: a part nobody carries data for, pushers beyond the job, routed flags
        # on other frame types or with the shared-memory flag.
        frames = b""
        tensor = self.rng.getrandbits(62)
        for _ in range(self.rng.randrange(1, 5)):
            h = valid_push(self.rng, 0, self.rng.randrange(0, 16))
            h["tensor"] = tensor
            h["flags"] = self.rng.choice([FLAG_NO_DATA, FLAG_NO_REPLY, 0, 6, 3, 5, 7])
            h["pushers"] = self.rng.choice([1, 1, 2, 3, 0])
            h["type"] = self.rng.choice([PUSH, PUSH, PUSH, RESULT, SHM_ATTACH])
            if self.rng.random() < 0.3:
                h = mutate(self.rng, h, 1)
            body, short = payload_for(self.rng, h)
            frames += pack(h) + body
            if short:
                break
        s.sendall(frames)

    # Handshake cases: on a raw connection, before authentication.
    def case_bad_hello(self, s: socket.socket) -> None:
        magic, nonce = CHALLENGE.unpack(recv_exact(s, CHALLENGE.size))
        rank = self.rng.choice([0, 1, 2, 1000, U32])
        mac = self.t.mac(nonce, rank)
        roll = self.rng.randrange(5)
        if roll == 0:
            mac = os.urandom(32)
        elif roll == 1:
            mac = self.t.mac(nonce, (rank + 1) & U32)
        hello = HELLO.pack(
            self.rng.choice([HELLO_MAGIC, HELLO_MAGIC, 0, FRAME_MAGIC]),
            rank,
            self.rng.choice([0, 1, U32]),
            mac,
        )
        s.sendall(hello[: self.rng.choice([HELLO.size, HELLO.size, self.rng.randrange(44)])])

    def case_garbage_before_auth(self, s: socket.socket) -> None:
        s.sendall(os.urandom(self.rng.randrange(0, 200)))

    AUTHED: List[Callable[[Fuzzer, socket.socket], None]] = [
        case_mutated_header,
        case_mutated_header,
        case_mutated_header,
        case_every_length,
        case_truncated_header,
        case_oversize,
        case_garbage_after_auth,
        case_sequence,
        case_routed,
        case_routed,
    ]
    RAW: List[Callable[[Fuzzer, socket.socket], None]] = [case_bad_hello, case_garbage_before_auth]

    def one_case(self) -> None:
        raw = self.rng.random() < 0.1
        fn = self.rng.choice(self.RAW if raw else self.AUTHED)
        self.counts[fn.__name__] = self.counts.get(fn.__name__, 0) + 1
        s = self.t.connect() if raw else self.t.authed(self.rng.randrange(self.t.num_workers))
        try:
            fn(self, s)
            # Half the time wait briefly for the server's verdict, half the time hang up
            # at once (a clean bye or an abrupt close) so the server sees every ending.
            if self.rng.random() < 0.5:
                s.settimeout(0.02)
                try:
                    while s.recv(65536):
                        pass
                    self.closed_by_server += 1
                except (socket.timeout, ConnectionError):
                    pass
            elif not raw and self.rng.random() < 0.5:
                h = valid_push(self.rng, 0, 0)
                h["type"] = BYE
                s.sendall(pack(h))
        except (ConnectionError, BrokenPipeError, OSError):
            self.closed_by_server += 1
        finally:
            s.close()

    # ---------------------------------------------------------------- liveness
    def check_sums(self) -> None:
        """Every worker pushes one part; each must get the exact sum back within 10 s."""
        n = 257
        tensor = (1 << 63) | self.rng.getrandbits(62)  # apart from the fuzz cases' ids
        socks = [self.t.authed(r, timeout=10.0) for r in range(self.t.num_workers)]
        values = [
            [float(self.rng.randrange(-1000, 1000)) for _ in range(n)]
            for _ in range(self.t.num_workers)
        ]
        want = [sum(col) for col in zip(*values)]
        try:
            for r, s in enumerate(socks):
                h = valid_push(self.rng, r, n)
                h.update(tensor=tensor, part=0, tensor_bytes=4 * n)
                s.sendall(pack(h) + struct.pack(f"<{n}f", *values[r]))
            for r, s in enumerate(socks):
                s.settimeout(10.0)
                while True:
                    h = unpack(recv_exact(s, HEADER.size))
                    body = recv_exact(s, h["len"])
                    if h["type"] == FATAL:  # a fuzz connection went away meanwhile
                        continue
                    if h["type"] == ERROR and h["tensor"] != tensor:
                        continue  # a fuzz case's verdict, sent to every connection
                    break
                assert h["type"] == RESULT, (h, body[:200])
                got = list(struct.unpack(f"<{n}f", body))
                assert got == want, f"worker {r}: wrong sum {got[:4]} want {want[:4]}"
            for r, s in enumerate(socks):
                bye = valid_push(self.rng, r, 0)
                bye["type"] = BYE
                s.sendall(pack(bye))
        finally:
            for s in socks:
                s.close()
        self.checks += 1

    def check_forward(self) -> None:
        """A routed part: worker 0 forwards its block (wants no result), the others only
        ask for it; each receiver must get worker 0's exact bytes, worker 0 an empty
        answer, within 10 s."""
        n = 129
        tensor = (1 << 63) | self.rng.getrandbits(62)
        socks = [self.t.authed(r, timeout=10.0) for r in range(self.t.num_workers)]
        block = [float(self.rng.randrange(-1000, 1000)) for _ in range(n)]
        try:
            for r, s in enumerate(socks):
                h = valid_push(self.rng, r, n)
                h.update(tensor=tensor, part=0, tensor_bytes=4 * n, pushers=self.t.num_workers)
                if r == 0:
                    h["flags"] = FLAG_NO_REPLY
                    s.sendall(pack(h) + struct.pack(f"<{n}f", *block))
                else:
                    h["flags"] = FLAG_NO_DATA
                    s.sendall(pack(h))
            for r, s in enumerate(socks):
                s.settimeout(10.0)
                while True:
                    h = unpack(recv_exact(s, HEADER.size))
                    body = recv_exact(s, h["len"])
                    if h["type"] == FATAL or (h["type"] == ERROR and h["tensor"] != tensor):
                        continue
                    break
                assert h["type"] == RESULT, (h, body[:200])
                if r == 0:
                    assert h["len"] == 0, f"the forwarding worker got {h['len']} bytes back"
                else:
                    got = list(struct.unpack(f"<{n}f", body))
                    assert got == block, f"worker {r}: wrong block {got[:4]} want {block[:4]}"
            for r, s in enumerate(socks):
                bye = valid_push(self.rng, r, 0)
                bye["type"] = BYE
                s.sendall(pack(bye))
        finally:
            for s in socks:
                s.close()
        self.checks += 1

    def run(self, cases: int, check_every: int = 250, deadline: Optional[float] = None) -> int:
        done = 0
        for done in range(1, cases + 1):
            try:
                self.one_case()
                if done % check_every == 0:
                    self.check_sums()
                    self.check_forward()
            except OSError as exc:
                if self.t.alive():
                    raise AssertionError(f"case {done}: server alive but {exc!r}") from exc
            if not self.t.alive():
                self.t.proc.wait()
                raise AssertionError(
                    f"server died (exit {self.t.proc.returncode}) after case "
                    f"{done}:\n{self.t.log()[-3000:]}"
                )
            if deadline is not None and time.monotonic() > deadline:
                break
        self.check_sums()
        self.check_forward()
        return done


def fuzz(
    cases: int,
    seed: int,
    env: Optional[Dict[str, str]] = None,
    max_seconds: Optional[float] = None,
    num_workers: int = 2,
) -> Dict[str, object]:
    target = Target(num_workers=num_workers, env=env)
    target.start()
    t0 = time.monotonic()
    fz = Fuzzer(target, seed)
    try:
        done = fz.run(cases, deadline=None if max_seconds is None else t0 + max_seconds)
    finally:
        code, out = target.stop() if target.alive() else (target.proc.returncode, "")
    log = target.log()
    if code != 0:
        raise AssertionError(f"server exited with {code}:\n{log[-4000:]}")
    if "ERROR: AddressSanitizer" in log or "runtime error:" in log:
        raise AssertionError(f"sanitizer report:\n{log[-6000:]}")
    os.unlink(target.log_path)
    return {
        "cases": done,
        "seconds": round(time.monotonic() - t0, 1),
        "sum_checks": fz.checks,
        "closed_by_server": fz.closed_by_server,
        "by_kind": fz.counts,
        "server_error": out.strip()[:200],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=int(os.environ.get("FASTPS_FUZZ_CASES", 1000)))
    ap.add_argument("--seed", type=int, default=int(time.time()))
    args = ap.parse_args()
    print(f"seed {args.seed}", flush=True)
    print(fuzz(args.cases, args.seed))


if __name__ == "__main__":
    main()
