"""Control-plane protocol and the client every worker and server uses to talk to the scheduler.

Wire format: each message is a frame of a 4-byte big-endian length followed by that many
bytes of UTF-8 JSON encoding one object with a string ``"type"``. Frames are at most
:data:`MAX_FRAME` bytes.

Authentication: on accept the scheduler sends ``{"type": "challenge", "nonce": hex}``; the
client answers ``{"type": "auth", "mac": hex(HMAC-SHA256(token, nonce || job_id))}`` and the
scheduler confirms with ``{"type": "auth_ok"}`` or closes the connection.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import socket
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from fastps.config import (
    DEFAULT_HEARTBEAT_INTERVAL,
    DEFAULT_HEARTBEAT_TIMEOUT,
    DEFAULT_TIMEOUT,
    format_addr,
)
from fastps.errors import FastPSAbort, FastPSError, FastPSTimeoutError

__all__ = [
    "MAX_FRAME",
    "FrameError",
    "FrameDecoder",
    "encode_frame",
    "compute_mac",
    "WorkerInfo",
    "ServerInfo",
    "Membership",
    "ControlClient",
]

log = logging.getLogger("fastps.control")

MAX_FRAME = 16 << 20  # process-set collectives relay their data through the scheduler
HEADER = struct.Struct(">I")
AUTH_STEP_TIMEOUT = 10.0
_RECV_THREAD = "fastps-control-receiver"
# How long a withdrawal waits for the scheduler to say whether the op had completed.
_WITHDRAW_ACK_S = 10.0


class _Busy(FastPSError):
    """The scheduler turned this connection away for load; connecting again may work."""


class EndedBeforeMembership(FastPSError):
    """The scheduler shut the job down before every node had registered: its workers all
    finished without joining (``fastpsrun -np 2 hostname``), so a server has nothing to do."""


class FrameError(FastPSError):
    """A frame violated the wire format (too big, not UTF-8 JSON, not an object, no type)."""


def encode_frame(msg: Mapping[str, Any]) -> bytes:
    """Serialises one message into a frame."""
    body = json.dumps(msg, separators=(",", ":")).encode("utf-8")
    if len(body) > MAX_FRAME:
        raise FrameError(f"message of {len(body)} bytes exceeds the {MAX_FRAME}-byte frame limit")
    return HEADER.pack(len(body)) + body


class FrameDecoder:
    """Incremental decoder: :meth:`feed` bytes as they arrive, get back complete messages.

    An oversized length is rejected as soon as its 4 header bytes arrive, before any body is
    buffered. ``max_frame`` may be changed between calls (smaller before authentication).
    """

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()

    def feed(self, data: bytes) -> List[Dict[str, Any]]:
        self._buf += data
        out: List[Dict[str, Any]] = []
        while len(self._buf) >= HEADER.size:
            (length,) = HEADER.unpack_from(self._buf)
            if length > self.max_frame:
                raise FrameError(f"frame of {length} bytes exceeds the {self.max_frame}-byte limit")
            if length == 0:
                raise FrameError("empty frame")
            if len(self._buf) < HEADER.size + length:
                break
            body = bytes(self._buf[HEADER.size : HEADER.size + length])
            del self._buf[: HEADER.size + length]
            out.append(_decode_body(body))
        return out


def _decode_body(body: bytes) -> Dict[str, Any]:
    try:
        msg = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise FrameError(f"frame is not UTF-8 JSON: {type(exc).__name__}") from None
    if not isinstance(msg, dict):
        raise FrameError(f"frame holds a JSON {type(msg).__name__}, not an object")
    if not isinstance(msg.get("type"), str):
        raise FrameError("frame has no string 'type'")
    return msg


def compute_mac(token: str, nonce: bytes, job_id: str) -> str:
    """Hex HMAC-SHA256 keyed by the token over ``nonce || job_id``."""
    return hmac.new(
        token.encode("utf-8"), nonce + job_id.encode("utf-8"), hashlib.sha256
    ).hexdigest()


@dataclass(frozen=True)
class WorkerInfo:
    rank: int
    host: str
    hostname: str
    pid: int
    local_rank: int
    local_size: int
    rack: str = ""


@dataclass(frozen=True)
class ServerInfo:
    id: int
    addr: Optional[str]
    host: str
    hostname: str
    pid: int
    rack: str = ""


@dataclass(frozen=True)
class Membership:
    """Who is in the job, as the scheduler announced it once everyone registered."""

    workers: List[WorkerInfo]
    servers: List[ServerInfo]

    @classmethod
    def from_message(cls, msg: Mapping[str, Any]) -> Membership:
        try:
            workers = [
                WorkerInfo(
                    rank=int(w["rank"]),
                    host=str(w["host"]),
                    hostname=str(w["hostname"]),
                    pid=int(w["pid"]),
                    local_rank=int(w["local_rank"]),
                    local_size=int(w["local_size"]),
                    rack=str(w.get("rack") or ""),
                )
                for w in msg["workers"]
            ]
            servers = [
                ServerInfo(
                    id=int(s["id"]),
                    addr=None if s.get("addr") is None else str(s["addr"]),
                    host=str(s["host"]),
                    hostname=str(s["hostname"]),
                    pid=int(s["pid"]),
                    rack=str(s.get("rack") or ""),
                )
                for s in msg["servers"]
            ]
        except (KeyError, TypeError, ValueError) as exc:
            raise FastPSError(f"malformed membership message from scheduler: {exc!r}") from None
        return cls(workers=workers, servers=servers)

    def worker(self, rank: int) -> WorkerInfo:
        return self.workers[rank]


Callback = Callable[[str], None]


class ControlClient:
    """Connection of one worker or server to the scheduler.

    Threads: a receiver (dispatches scheduler messages, fires the abort/shutdown callbacks)
    and a heartbeat sender; both are daemons and stop in :meth:`close`. The scheduler
    answers heartbeats, so a scheduler that goes silent for ``heartbeat_timeout`` seconds,
    or whose connection drops, counts as an abort.
    """

    def __init__(
        self,
        addr: Tuple[str, int],
        job_id: str,
        token: str,
        timeout: float = DEFAULT_TIMEOUT,
        heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL,
        heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT,
    ) -> None:
        self.addr = (addr[0], int(addr[1]))
        self.job_id = job_id
        self._token = token
        self.timeout = float(timeout)
        self.heartbeat_interval = float(heartbeat_interval)
        self.heartbeat_timeout = float(heartbeat_timeout)
        self._addr_text = format_addr(*self.addr)

        self._cv = threading.Condition()
        self._send_lock = threading.Lock()
        self._sock: Optional[socket.socket] = None
        self._registered = False
        self._membership: Optional[Membership] = None
        self._error: Optional[str] = None
        self._abort_reason: Optional[str] = None
        self._scheduler_lost = False
        self._shutdown = False
        self._closed = False
        self._barrier_done: Dict[str, int] = {}
        self._last_recv = time.monotonic()
        self._abort_cbs: List[Callback] = []
        self._shutdown_cbs: List[Callback] = []
        self._threads: List[threading.Thread] = []
        self._decoder = FrameDecoder()
        self._early: List[Dict[str, Any]] = []
        # (process set id, op name) -> callback for the gather's completion (coordinate())
        self._coords: Dict[Tuple[int, str], Callable[[Dict[str, Any]], None]] = {}
        # Withdrawn announcements the scheduler has not acknowledged yet, per key, oldest
        # first: [withdraw number, callback (None once a late completion used it)].
        self._withdrawn: Dict[Tuple[int, str], List[List[Any]]] = {}
        self._withdraw_seq = 0
        self._unsolicited: Optional[Callable[[Dict[str, Any]], None]] = None
        self._clock_seq = 0
        self._handlers: Dict[str, Callable[[Dict[str, Any]], None]] = {}
        self._heartbeat_stats: Optional[Callable[[], Dict[str, Any]]] = None
        # clock request number -> (the scheduler's time, its machine's boot id)
        self._clocks: Dict[int, Tuple[int, Optional[str]]] = {}

    # ------------------------------------------------------------------ state
    @property
    def membership(self) -> Optional[Membership]:
        return self._membership

    @property
    def abort_reason(self) -> Optional[str]:
        """The abort reason once the job was aborted, else None."""
        return self._abort_reason

    @property
    def scheduler_lost(self) -> bool:
        """Whether the abort is this process's own verdict (the scheduler went silent or its
        connection dropped), not a message from the scheduler."""
        return self._scheduler_lost

    @property
    def shutdown_received(self) -> bool:
        return self._shutdown

    # ------------------------------------------------------------- connecting
    def _connect(self, deadline: float) -> socket.socket:
        delay = 0.05
        last_err: Optional[BaseException] = None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise FastPSTimeoutError(
                    f"could not connect to the scheduler at {self._addr_text} within "
                    f"{self.timeout:g} s (FASTPS_TIMEOUT): {last_err}"
                )
            try:
                sock = socket.create_connection(self.addr, timeout=min(remaining, 5.0))
            except OSError as exc:  # refused, unreachable, DNS not ready yet: retry
                last_err = exc
                time.sleep(min(delay, max(deadline - time.monotonic(), 0)))
                delay = min(delay * 2, 1.0)
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock

    def _authenticate(self, sock: socket.socket) -> None:
        """Answers the challenge; messages that arrive right after ``auth_ok`` (an abort)
        are kept for the receiver thread."""
        sock.settimeout(AUTH_STEP_TIMEOUT)
        decoder = FrameDecoder()
        pending: List[Dict[str, Any]] = []

        def recv_one(step: str) -> Dict[str, Any]:
            while not pending:
                try:
                    data = sock.recv(65536)
                except socket.timeout:
                    raise FastPSTimeoutError(
                        f"scheduler at {self._addr_text} did not answer during {step}"
                    ) from None
                except OSError as exc:
                    data = b""
                    log.debug("recv failed during %s: %s", step, exc)
                if not data:
                    raise FastPSError(
                        f"scheduler at {self._addr_text} closed the connection during {step}: "
                        "is FASTPS_TOKEN / FASTPS_JOB_ID the same as the scheduler's?"
                    )
                pending.extend(decoder.feed(data))
            return pending.pop(0)

        challenge = recv_one("authentication")
        if challenge["type"] == "busy":
            raise _Busy(str(challenge.get("message", "scheduler busy")))
        nonce_hex = challenge.get("nonce")
        if challenge["type"] != "challenge" or not isinstance(nonce_hex, str):
            raise FastPSError(f"unexpected first message from scheduler: {challenge['type']!r}")
        try:
            nonce = bytes.fromhex(nonce_hex)
        except ValueError:
            raise FastPSError("scheduler sent a malformed challenge") from None
        sock.sendall(
            encode_frame({"type": "auth", "mac": compute_mac(self._token, nonce, self.job_id)})
        )
        reply = recv_one("authentication")
        if reply["type"] == "busy":
            raise _Busy(str(reply.get("message", "scheduler busy")))
        if reply["type"] != "auth_ok":
            raise FastPSError(f"scheduler refused authentication: {reply.get('message', reply)}")
        self._decoder = decoder
        self._early = pending

    def register(
        self,
        role: str,
        node_id: int,
        host: str,
        hostname: str,
        data_addr: Optional[str] = None,
        num_workers: Optional[int] = None,
        num_servers: Optional[int] = None,
        rack: str = "",
    ) -> Membership:
        """Connects (retrying while the scheduler is not up yet), authenticates, registers,
        and waits until every worker and server has registered.

        ``num_workers``/``num_servers``, when given, are checked against the scheduler's so
        a process started with a different job size is refused by name.

        Raises FastPSTimeoutError, FastPSAbort (e.g. registration timed out at the
        scheduler), or FastPSError (refused: duplicate id, bad token, ...).
        """
        if role not in ("worker", "server"):
            raise FastPSError(f"cannot register with role {role!r}")
        with self._cv:
            if self._registered or self._closed:
                raise FastPSError("ControlClient.register may be called once, before close()")
            self._registered = True
        start = time.monotonic()
        delay = 0.02
        while True:
            sock = self._connect(start + self.timeout)
            try:
                self._authenticate(sock)
                break
            except _Busy as exc:
                sock.close()
                if time.monotonic() + delay > start + self.timeout:
                    raise FastPSTimeoutError(
                        f"scheduler at {self._addr_text} stayed busy for {self.timeout:g} s "
                        f"(FASTPS_TIMEOUT): {exc}"
                    ) from None
                log.info("scheduler at %s is busy, retrying: %s", self._addr_text, exc)
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
            except BaseException:
                sock.close()
                raise
        sock.settimeout(0.5)  # receiver loop wakes to notice close(); sends share it
        self._sock = sock
        self._last_recv = time.monotonic()
        msg: Dict[str, Any] = {
            "type": "register",
            "role": role,
            "id": int(node_id),
            "host": host,
            "hostname": hostname,
            "pid": os.getpid(),
            "data_addr": data_addr,
        }
        if rack:
            msg["rack"] = rack
        if num_workers is not None:
            msg["num_workers"] = int(num_workers)
        if num_servers is not None:
            msg["num_servers"] = int(num_servers)
        self._send(msg)
        for target, name in ((self._recv_loop, "receiver"), (self._heartbeat_loop, "heartbeat")):
            t = threading.Thread(target=target, name=f"fastps-control-{name}", daemon=True)
            t.start()
            self._threads.append(t)

        # The scheduler's own registration timeout (which names the missing nodes) started
        # before us, so give it a margin to report first.
        wait = self.timeout + 10.0
        with self._cv:
            done = self._cv.wait_for(
                lambda: (
                    self._membership is not None
                    or self._error is not None
                    or self._abort_reason is not None
                    or self._shutdown
                    or self._closed
                ),
                timeout=wait,
            )
            membership, error, reason = self._membership, self._error, self._abort_reason
            ended = self._shutdown
        if membership is not None:
            return membership
        if ended and error is None and reason is None:
            raise EndedBeforeMembership(
                f"the job ended before every node registered ({role} {node_id} had nothing to do)"
            )
        if error is not None:
            self.close()
            raise FastPSError(f"scheduler refused registration of {role} {node_id}: {error}")
        if reason is not None:
            raise FastPSAbort(reason)
        if not done:
            raise FastPSTimeoutError(
                f"registration with the scheduler at {self._addr_text} timed out after {wait:g} s"
            )
        raise FastPSError("ControlClient closed during registration")

    # ---------------------------------------------------------------- sending
    def _send(self, msg: Mapping[str, Any]) -> None:
        frame = encode_frame(msg)
        sock = self._sock
        if sock is None:
            raise FastPSError("not connected to the scheduler (call register first)")
        with self._send_lock:
            try:
                sock.sendall(frame)
            except OSError as exc:
                raise FastPSError(
                    f"sending to scheduler at {self._addr_text} failed: {exc}"
                ) from None

    def _check_live(self) -> None:
        if self._abort_reason is not None:
            raise FastPSAbort(self._abort_reason)
        if self._closed:
            raise FastPSError("ControlClient is closed")
        if self._membership is None:
            raise FastPSError("not registered with the scheduler yet")

    def barrier(self, name: str, timeout: Optional[float] = None) -> None:
        """Blocks until every worker entered the barrier ``name``.

        Raises FastPSTimeoutError after ``timeout`` (default: the client's timeout) and
        FastPSAbort if the job is aborted meanwhile.
        """
        limit = self.timeout if timeout is None else float(timeout)
        with self._cv:
            self._check_live()
            generation = self._barrier_done.get(name, 0)
        self._send({"type": "barrier", "name": name})
        with self._cv:
            done = self._cv.wait_for(
                lambda: (
                    self._barrier_done.get(name, 0) > generation
                    or self._abort_reason is not None
                    or self._closed
                ),
                timeout=limit,
            )
            if self._barrier_done.get(name, 0) > generation:
                return
            if self._abort_reason is not None:
                raise FastPSAbort(self._abort_reason)
        if not done:
            raise FastPSTimeoutError(f"barrier {name!r} timed out after {limit:g} s")
        raise FastPSError(f"ControlClient closed while waiting in barrier {name!r}")

    def clock_offset(self, samples: int = 8, timeout: float = 2.0) -> Tuple[int, int]:
        """(offset_ns, rtt_ns): the scheduler's CLOCK_MONOTONIC minus this process's.

        NTP's estimate over ``samples`` round trips, from the one with the shortest round
        trip: the scheduler read its clock somewhere inside it, so the error is at most
        rtt / 2 (the timeline records it). On the scheduler's own machine (same boot id)
        the clocks are one and the same: (0, 0), exact. Raises FastPSTimeoutError if no
        reply comes.
        """
        best: Optional[Tuple[int, int]] = None
        same_machine = True
        for _ in range(samples):
            with self._cv:
                self._check_live()
                self._clock_seq += 1
                seq = self._clock_seq
            t0 = time.monotonic_ns()
            self._send({"type": "clock", "seq": seq})

            def answered(s: int = seq) -> bool:
                return s in self._clocks or self._abort_reason is not None

            with self._cv:
                ok = self._cv.wait_for(answered, timeout)
                t1 = time.monotonic_ns()
                reply = self._clocks.pop(seq, None)
            if not ok or reply is None:
                raise FastPSTimeoutError(
                    f"the scheduler at {self._addr_text} did not answer a clock request "
                    f"within {timeout:g} s"
                )
            theirs, boot = reply
            same_machine = same_machine and boot is not None and boot == boot_id()
            rtt = t1 - t0
            if best is None or rtt < best[1]:
                best = (theirs - (t0 + t1) // 2, rtt)
        assert best is not None
        return (0, 0) if same_machine else best

    def declare(
        self,
        name: str,
        shape: Sequence[int],
        dtype: str,
        rank: int,
        priority: int,
        version: int = 0,
        compression: str = "",
    ) -> None:
        """Tells the scheduler this worker's tensor ``name`` has ``shape``/``dtype`` and is
        pushed with ``priority`` and ``compression`` (a compressor spec, "" for none);
        ``version`` counts this worker's earlier, different declarations of the name.

        Does not wait. A mismatch with another worker aborts the job with a reason that names
        the tensor and both sides.
        """
        with self._cv:
            self._check_live()
        self._send(
            {
                "type": "declare",
                "name": name,
                "shape": [int(d) for d in shape],
                "dtype": str(dtype),
                "rank": int(rank),
                "priority": int(priority),
                "version": int(version),
                "compression": str(compression),
            }
        )

    def coordinate(
        self,
        set_id: int,
        ranks: Sequence[int],
        name: str,
        record: Any,
        done: Callable[[Dict[str, Any]], None],
    ) -> None:
        """Announces op ``name`` of process set ``set_id`` with this worker's ``record``
        (JSON). Does not wait: ``done(message)`` runs on the receiver thread once every
        member announced it (``message["records"]``, one per member in rank order) or the
        scheduler refused it (``message["error"]``), or with ``{"error": reason}`` if the job
        aborts first."""
        key = (int(set_id), name)
        with self._cv:
            self._check_live()
            if key in self._coords:
                raise ValueError(f"op '{name}' is already in flight")
            self._coords[key] = done
        try:
            self._send(
                {
                    "type": "coord",
                    "set": int(set_id),
                    "ranks": [int(r) for r in ranks],
                    "name": name,
                    "record": record,
                }
            )
        except BaseException:
            with self._cv:
                self._coords.pop(key, None)
            raise

    def withdraw(self, set_id: int, ranks: Sequence[int], name: str) -> bool:
        """Takes back this worker's announcement of ``name`` (its wait was cut short).
        True when the op is withdrawn everywhere, so its name was used by no rank
        (core/collectives/anon_names.py gives an anonymous op's number back then); False when it
        completed anyway.

        The scheduler may have completed the gather already, its completion still on the
        way: then the other members are moving their data and wait for this worker's.
        So the callback stays until the scheduler acknowledges the withdrawal
        (``coord_withdrawn``); a completion read before that is the withdrawn one's (the
        scheduler answers in order) and still goes to the callback, which moves this
        worker's data for an op nobody here waits for any more. Waiting for that answer
        (bounded; never on the receiver thread, which delivers it) tells the two apart."""
        key = (int(set_id), name)
        with self._cv:
            done = self._coords.pop(key, None)
            if done is None:
                return False  # completed meanwhile
            self._withdraw_seq += 1
            seq = self._withdraw_seq
            entry: List[Any] = [seq, done]
            self._withdrawn.setdefault(key, []).append(entry)
        try:
            self._send(
                {
                    "type": "coord",
                    "set": int(set_id),
                    "ranks": [int(r) for r in ranks],
                    "name": name,
                    "withdraw": True,
                    "seq": seq,
                }
            )
        except FastPSError:
            with self._cv:  # the connection is gone: nothing left to take back
                self._forget_withdrawn(key, seq)
            return False
        receivers = [t for t in self._threads if t.name == _RECV_THREAD and t.is_alive()]
        if not receivers or threading.current_thread() in receivers:
            return False  # nobody else reads the answer: cannot wait for it
        deadline = time.monotonic() + _WITHDRAW_ACK_S
        with self._cv:
            while self._is_withdrawing(key, seq) and self._abort_reason is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False  # not confirmed: counting it as used is the safe side
                self._cv.wait(left)
            # Acknowledged: withdrawn everywhere unless a late completion used the callback.
            return entry[1] is not None and self._abort_reason is None

    def _is_withdrawing(self, key: Tuple[int, str], seq: int) -> bool:
        return any(w[0] == seq for w in self._withdrawn.get(key, []))

    def _forget_withdrawn(self, key: Tuple[int, str], seq: int) -> None:
        """Drops withdrawal ``seq`` of ``key`` (``_cv`` held)."""
        pending = [w for w in self._withdrawn.get(key, []) if w[0] != seq]
        if pending:
            self._withdrawn[key] = pending
        else:
            self._withdrawn.pop(key, None)
        self._cv.notify_all()

    def forget_set(self, set_id: int, ranks: Sequence[int]) -> None:
        """Drops the scheduler's pending gathers of a removed process set."""
        self._send(
            {
                "type": "coord",
                "set": int(set_id),
                "ranks": [int(r) for r in ranks],
                "name": "",
                "forget": True,
            }
        )

    def set_heartbeat_stats(self, fn: Optional[Callable[[], Dict[str, Any]]]) -> None:
        """Every heartbeat carries ``fn()`` (a worker's counters, for fastpsrun --progress)."""
        self._heartbeat_stats = fn

    def on_message(self, kind: str, cb: Callable[[Dict[str, Any]], None]) -> None:
        """Calls ``cb(msg)`` on the receiver thread for every message of type ``kind``
        (a type this client does not handle itself: ``stall_query``, say)."""
        self._handlers[kind] = cb

    def send_message(self, msg: Mapping[str, Any]) -> None:
        """Sends one message to the scheduler (for the helpers that registered handlers)."""
        self._send(msg)

    def on_unsolicited(self, cb: Optional[Callable[[Dict[str, Any]], None]]) -> None:
        """Receives completed gathers this worker did not announce (it is in ``join``)."""
        self._unsolicited = cb

    def send_abort(self, reason: str) -> None:
        """Asks the scheduler to abort the job; it broadcasts ``reason`` to every node."""
        try:
            self._send({"type": "abort", "reason": str(reason)})
        except FastPSError as exc:
            log.warning("could not send abort to the scheduler: %s", exc)
            self._trigger_abort(str(reason))

    # -------------------------------------------------------------- callbacks
    def on_abort(self, cb: Callback) -> None:
        """Calls ``cb(reason)`` once when the job aborts (from the receiver thread; at once,
        from this thread, if the job already aborted)."""
        with self._cv:
            reason = self._abort_reason
            if reason is None:
                self._abort_cbs.append(cb)
                return
        _safe_call(cb, reason)

    def on_shutdown(self, cb: Callback) -> None:
        """Calls ``cb("shutdown")`` once when the scheduler tells servers to shut down."""
        with self._cv:
            if not self._shutdown:
                self._shutdown_cbs.append(cb)
                return
        _safe_call(cb, "shutdown")

    def wait_shutdown(self, timeout: Optional[float] = None) -> Optional[str]:
        """Waits for shutdown or abort: returns None on shutdown, the reason on abort.

        ``timeout=None`` waits as long as the job runs (the scheduler's heartbeat checks
        bound it); raises FastPSTimeoutError when a given timeout passes first.
        """
        with self._cv:
            done = self._cv.wait_for(
                lambda: self._shutdown or self._abort_reason is not None or self._closed,
                timeout=timeout,
            )
            if self._abort_reason is not None:
                return self._abort_reason
            if self._shutdown:
                return None
        if not done:
            raise FastPSTimeoutError(f"no shutdown from the scheduler within {timeout:g} s")
        raise FastPSError("ControlClient closed while waiting for shutdown")

    def _trigger_abort(self, reason: str, lost: bool = False) -> None:
        with self._cv:
            if self._abort_reason is not None:
                return
            self._abort_reason = reason
            self._scheduler_lost = lost
            cbs, self._abort_cbs = self._abort_cbs, []
            coords, self._coords = self._coords, {}
            self._withdrawn = {}  # their callers gave up already: nobody to tell
            self._cv.notify_all()
        log.info("fastps job aborted: %s", reason)
        for cb in cbs:
            _safe_call(cb, reason)
        for done in coords.values():
            try:
                done({"error": f"job aborted: {reason}"})
            except Exception:  # noqa: BLE001 - a callback's failure must not stop the others
                log.exception("coordination callback failed")

    # ---------------------------------------------------------------- threads
    def _recv_loop(self) -> None:
        sock = self._sock
        assert sock is not None
        decoder = self._decoder
        for msg in self._early:
            self._dispatch(msg)
        self._early = []
        lost: Optional[str] = None
        while True:
            try:
                data = sock.recv(65536)
            except socket.timeout:
                if self._closed and self._abort_reason is not None:
                    return
                continue
            except OSError as exc:
                lost = str(exc)
                break
            if not data:
                lost = "connection closed"
                break
            self._last_recv = time.monotonic()
            try:
                messages = decoder.feed(data)
            except FrameError as exc:
                lost = f"bad frame from scheduler: {exc}"
                break
            for msg in messages:
                self._dispatch(msg)
        with self._cv:
            benign = (
                self._closed
                or self._shutdown
                or self._abort_reason is not None
                or self._error is not None
            )
            self._cv.notify_all()
        if not benign:
            self._trigger_abort(
                f"lost connection to scheduler at {self._addr_text} ({lost})", lost=True
            )

    def _dispatch(self, msg: Dict[str, Any]) -> None:
        kind = msg["type"]
        if kind == "heartbeat":
            return
        if kind == "membership":
            membership = Membership.from_message(msg)
            with self._cv:
                self._membership = membership
                self._cv.notify_all()
        elif kind == "clock":
            with self._cv:
                boot = msg.get("boot")
                self._clocks[int(msg.get("seq", -1))] = (int(msg.get("t", 0)), boot)
                self._cv.notify_all()
        elif kind == "barrier_done":
            name = str(msg.get("name"))
            with self._cv:
                self._barrier_done[name] = self._barrier_done.get(name, 0) + 1
                self._cv.notify_all()
        elif kind == "abort":
            self._trigger_abort(str(msg.get("reason", "aborted by the scheduler")))
        elif kind == "coord_done":
            key = (int(msg.get("set", -1)), str(msg.get("name")))
            with self._cv:
                late = self._withdrawn.get(key)
                if late and late[0][1] is not None:
                    # The gather completed before the scheduler read this worker's
                    # withdrawal: the others move their data, so this worker must too.
                    done, late[0][1] = late[0][1], None
                    log.info("op %r completed as this worker withdrew it; moving its data", key[1])
                else:
                    done = self._coords.pop(key, None)
            if done is None and not msg.get("error"):
                done = self._unsolicited
            if done is None:
                log.warning("ignoring the result of op %r that this worker did not start", key[1])
                return
            try:
                done(msg)
            except Exception:  # noqa: BLE001 - the receiver thread must keep running
                log.exception("coordination callback for op %r failed", key[1])
        elif kind == "coord_withdrawn":
            with self._cv:
                key = (int(msg.get("set", -1)), str(msg.get("name")))
                self._forget_withdrawn(key, int(msg.get("seq", -1)))
        elif kind == "shutdown":
            with self._cv:
                if self._shutdown:
                    return
                self._shutdown = True
                cbs, self._shutdown_cbs = self._shutdown_cbs, []
                self._cv.notify_all()
            for cb in cbs:
                _safe_call(cb, "shutdown")
        elif kind == "error":
            with self._cv:
                self._error = str(msg.get("message", "unspecified error"))
                self._cv.notify_all()
            log.error("scheduler reported an error: %s", self._error)
        elif kind in self._handlers:
            try:
                self._handlers[kind](msg)
            except Exception:  # noqa: BLE001 - the receiver thread must keep running
                log.exception("handler for scheduler message %r failed", kind)
        else:
            log.debug("ignoring scheduler message of type %r", kind)

    def _heartbeat_loop(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(
                    lambda: self._closed or self._abort_reason is not None,
                    timeout=self.heartbeat_interval,
                )
                if self._closed or self._abort_reason is not None:
                    return
            silent = time.monotonic() - self._last_recv
            if silent > self.heartbeat_timeout:
                self._trigger_abort(
                    f"scheduler at {self._addr_text} silent for {silent:.0f} s "
                    f"(heartbeat timeout {self.heartbeat_timeout:g} s)",
                    lost=True,
                )
                return
            beat: Dict[str, Any] = {"type": "heartbeat"}
            stats = self._heartbeat_stats
            if stats is not None:
                beat["stats"] = stats()
            try:
                self._send(beat)
            except FastPSError:
                pass  # the receiver notices the broken connection

    # ---------------------------------------------------------------- closing
    def close(self) -> None:
        """Leaves the job cleanly (sends ``bye``) and stops the threads. Idempotent."""
        with self._cv:
            if self._closed:
                return
            self._closed = True
            self._cv.notify_all()
        sock = self._sock
        if sock is None:
            return
        try:
            with self._send_lock:
                sock.sendall(encode_frame({"type": "bye"}))
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        # The scheduler closes its side after a bye; the receiver drains until then.
        me = threading.current_thread()
        deadline = time.monotonic() + 5.0
        for t in self._threads:
            if t is not me:
                t.join(max(deadline - time.monotonic(), 0.0))
        try:
            sock.close()
        except OSError:
            pass

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def boot_id() -> Optional[str]:
    """This machine's boot id: processes that share it share CLOCK_MONOTONIC."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


def _safe_call(cb: Callback, arg: str) -> None:
    try:
        cb(arg)
    except Exception:  # a user callback must not kill the receiver thread
        log.exception("fastps control callback %r failed", cb)
