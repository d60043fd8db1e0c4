"""The scheduler: rendezvous, membership, barriers, heartbeats, tensor checks and aborts.

It runs as a thread inside ``fastpsrun`` or on its own (``python -m fastps.scheduler`` with
``FASTPS_SCHEDULER_ADDR`` set to the address to bind). One thread serves every connection
with a selector; all socket I/O is non-blocking and every wait is bounded:

* a connection that does not authenticate within ``auth_timeout`` is closed;
* the job aborts if not every node registered within ``timeout`` (FASTPS_TIMEOUT);
* a registered node that sends nothing for ``heartbeat_timeout`` is declared dead;
* after an abort, connections get ``grace`` seconds to take the message, then are closed.

Any protocol violation (oversized or malformed frame, bad token) closes only the offending
connection. If that connection belonged to a registered node the job cannot go on without
it, so that is reported as the node's death.
"""

from __future__ import annotations

import collections
import dataclasses
import hmac
import logging
import os
import selectors
import signal
import socket
import sys
import threading
import time
from typing import Any, Callable, Deque, Dict, List, Optional, Set, Tuple

from fastps.config import (
    DEFAULT_HANDSHAKE_TIMEOUT,
    DEFAULT_HEARTBEAT_TIMEOUT,
    DEFAULT_TIMEOUT,
    Config,
    format_addr,
)
from fastps.control.coordinator import Coordinator
from fastps.control.protocol import (
    MAX_FRAME,
    FrameDecoder,
    FrameError,
    boot_id,
    compute_mac,
    encode_frame,
)
from fastps.control.server_pool import MAX_SERVER_ID, ServerPool
from fastps.control.stalls import (
    DeadlockWatch,
    confirm_interval,
    control_wait,
    find_stalls,
    poll_interval,
)
from fastps.control.stalls import describe as describe_stall
from fastps.errors import FastPSError

__all__ = ["Scheduler", "main"]

# A stall inquiry still missing a report after this long is started afresh.
STALL_INQUIRY_S = 10.0

log = logging.getLogger("fastps.scheduler")

PREAUTH_MAX_FRAME = 4096  # an auth message is ~100 bytes; refuse anything large early
MAX_OUTBUF = 64 << 20  # a node that stops reading is dropped rather than buffered forever
MAX_UNAUTHENTICATED = 256
BUSY_MESSAGE = "scheduler busy: too many unauthenticated connections (retry)"
TICK = 0.2
LATE_ARRIVALS = 2.0  # after an abort during registration, how long late nodes can hear it
LINGER = 2.0  # after our FIN, how long to wait for the peer's before closing hard


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclasses.dataclass
class _Declared:
    """The first declaration of one version of a tensor, the rank that made it, and the
    ranks that made the same one since (forgotten once every worker has)."""

    shape: List[int]
    dtype: str
    priority: int
    rank: int
    agreed: Set[int] = dataclasses.field(default_factory=set)
    compression: str = ""


def _describe_tensor(dtype: str, shape: List[int]) -> str:
    return f"{dtype}[{', '.join(str(d) for d in shape)}]"


class _Conn:
    """One accepted connection and, once registered, the node behind it."""

    def __init__(self, sock: socket.socket, peer: str, now: float) -> None:
        self.sock = sock
        self.peer = peer
        self.decoder = FrameDecoder(PREAUTH_MAX_FRAME)
        self.out = bytearray()
        self.nonce = os.urandom(32)
        self.authed = False
        self.accepted_at = now
        self.last_seen = now
        self.role: Optional[str] = None
        self.node_id: Optional[int] = None
        self.info: Dict[str, Any] = {}
        self.said_bye = False
        self.draining = False  # no more input handled; close once output is flushed
        self.drain_started_at = 0.0
        self.fin_sent_at: Optional[float] = None
        self.closed = False

    @property
    def label(self) -> str:
        if self.role is None:
            return f"connection from {self.peer}"
        return (
            f"{self.role} {self.node_id} "
            f"(pid {self.info.get('pid')} on host {self.info.get('hostname')})"
        )


class Scheduler:
    """Control-plane hub of one job.

    ``start()`` binds and serves from a daemon thread; ``serve()`` serves in the calling
    thread. ``stop()``, ``abort()`` and ``request_shutdown()`` may be called from any
    thread. ``exit_code`` is 1 once the job aborted, else 0.
    """

    def __init__(
        self,
        num_workers: int,
        num_servers: int,
        job_id: str,
        token: str,
        host: str = "127.0.0.1",
        port: int = 0,
        timeout: float = DEFAULT_TIMEOUT,
        heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT,
        auth_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT,
        grace: float = 5.0,
        elastic_servers: bool = False,
    ) -> None:
        if num_workers < 1:
            raise FastPSError(f"a job needs at least one worker, got num_workers={num_workers}")
        if num_servers < 0:
            raise FastPSError(f"num_servers must be >= 0, got {num_servers}")
        self.num_workers = num_workers
        self.num_servers = num_servers
        self.job_id = job_id
        self._token = token
        self.host = host
        self.port = port
        self.timeout = timeout
        self.heartbeat_timeout = heartbeat_timeout
        self.auth_timeout = auth_timeout
        self.grace = grace

        self._listener: Optional[socket.socket] = None
        self._sel: Optional[selectors.BaseSelector] = None
        self._wake_r: Optional[socket.socket] = None
        self._wake_w: Optional[socket.socket] = None
        self._calls: Deque[Callable[[], None]] = collections.deque()
        self._calls_lock = threading.Lock()
        # Set by a signal handler (abort_from_signal): no lock may be taken there.
        self._signal_reason: Optional[str] = None
        self._thread: Optional[threading.Thread] = None
        self._done = threading.Event()

        self._conns: Set[_Conn] = set()
        self._workers: Dict[int, _Conn] = {}
        self._servers: Dict[int, _Conn] = {}
        self._left: Set[Tuple[str, int]] = set()
        self._barriers: Dict[str, Set[int]] = {}
        self._tensors: Dict[Tuple[str, int], _Declared] = {}  # by (name, version)
        self._coordinator = Coordinator()
        self._stall: Optional[Dict[str, Any]] = None  # the stall inquiry under way
        # The workers' FASTPS_STALL_WARNING_S (their stall_config; 0: inspector off), when
        # the scheduler last looked at the waits it holds, when each was first seen, when
        # the last inquiry started, and when to inquire again to prove a deadlock.
        self._stall_warning = 0.0
        self._stall_look_at = 0.0
        self._stall_held: Dict[Tuple[str, int, str], float] = {}
        self._stall_asked_at = 0.0
        self._stall_recheck_at: Optional[float] = None
        self._deadlock = DeadlockWatch()
        # rank -> (when, the counters its last heartbeat carried), for fastpsrun --progress
        self._worker_stats: Dict[int, Tuple[float, Dict[str, Any]]] = {}
        self._stats_lock = threading.Lock()
        self._started_at = 0.0
        self._membership_sent = False
        self._shutdown_sent = False
        self._stop_requested = False
        self.abort_reason: Optional[str] = None
        # Servers that leave and join without ending the job (core/control/server_pool.py).
        self._server_pool: Optional[ServerPool] = (
            ServerPool(_PoolHostOf(self)) if elastic_servers else None
        )
        self._abort_at = 0.0
        # Called (on the scheduler's thread) with the reason when the job aborts; a launcher
        # sets it to report the root cause itself, first and once.
        self.on_abort: Optional[Callable[[str], object]] = None
        # Called (on the scheduler's thread, just before the abort it causes) with the role,
        # id and reason when a node's death aborts the job (closed connection, heartbeat
        # timeout): the elastic driver's verdict that the process is gone, hung or not.
        self.on_node_lost: Optional[Callable[[str, int, str], object]] = None

    # ------------------------------------------------------------ public API
    @property
    def address(self) -> Tuple[str, int]:
        return self.host, self.port

    @property
    def address_text(self) -> str:
        return format_addr(self.host, self.port)

    @property
    def exit_code(self) -> int:
        return 1 if self.abort_reason is not None else 0

    @property
    def finished(self) -> bool:
        return self._done.is_set()

    def bind(self) -> int:
        """Creates the listening socket (idempotent) and returns the bound port."""
        if self._listener is not None:
            return self.port
        try:
            infos = socket.getaddrinfo(
                self.host, self.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )
            family = infos[0][0]
            listener = socket.create_server((self.host, self.port), family=family, backlog=128)
        except OSError as exc:
            raise FastPSError(f"scheduler cannot listen on {self.address_text}: {exc}") from None
        listener.setblocking(False)
        self._listener = listener
        self.port = listener.getsockname()[1]
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(listener, selectors.EVENT_READ, "listener")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        if not self._token:
            log.warning("FASTPS_TOKEN is empty: any process that knows the job id can join")
        log.info(
            "scheduler for job %s listening on %s (%d workers, %d servers)",
            self.job_id,
            self.address_text,
            self.num_workers,
            self.num_servers,
        )
        return self.port

    def start(self) -> int:
        """Binds and serves from a daemon thread; returns the bound port."""
        port = self.bind()
        self._thread = threading.Thread(target=self.serve, name="fastps-scheduler", daemon=True)
        self._thread.start()
        return port

    def serve(self) -> int:
        """Serves until every node left, the job aborted and drained, or ``stop()``.

        Returns :attr:`exit_code`.
        """
        self.bind()
        self._started_at = time.monotonic()
        try:
            self._loop()
        except Exception:
            log.exception("scheduler failed")
            if self.abort_reason is None:
                self.abort_reason = "scheduler failed with an internal error"
        finally:
            self._teardown()
            self._done.set()
        return self.exit_code

    def join(self, timeout: Optional[float] = None) -> bool:
        """Waits until the scheduler stopped serving; True if it did."""
        return self._done.wait(timeout)

    def server_count(self) -> Optional[int]:
        """The servers in the job now (with elastic servers: after deaths and joins), or
        None while the membership has not gone out (servers still starting)."""
        if not self._membership_sent:
            return None
        return len(self._servers)

    def stop(self) -> None:
        """Stops serving soon and closes every connection (nodes then see a lost scheduler)."""
        self._call_soon(self._request_stop)

    def abort(self, reason: str) -> None:
        """Aborts the job: every node gets ``{"type": "abort", "reason": reason}``."""
        self._call_soon(lambda: self._abort(reason))

    def abort_from_signal(self, reason: str) -> None:
        """:meth:`abort` for a signal handler: a plain assignment and a wake-up byte, no
        lock (the handler may have interrupted the loop while it held _calls_lock)."""
        self._signal_reason = reason
        self._wake_loop()

    def request_shutdown(self) -> None:
        """Sends ``shutdown`` to the registered servers now (e.g. all workers have exited)."""
        self._call_soon(self._send_shutdown)

    # ------------------------------------------------------------ event loop
    def _call_soon(self, fn: Callable[[], None]) -> None:
        with self._calls_lock:
            self._calls.append(fn)
        self._wake_loop()

    def _wake_loop(self) -> None:
        """One byte to the loop's wake-up socket (no lock: signal handlers call it too)."""
        wake = self._wake_w
        if wake is not None:
            try:
                wake.send(b"x")
            except OSError:
                pass

    def _request_stop(self) -> None:
        self._stop_requested = True

    def _loop(self) -> None:
        sel = self._sel
        assert sel is not None
        while True:
            for key, mask in sel.select(TICK):
                if key.data == "listener":
                    self._accept()
                elif key.data == "wake":
                    self._run_calls()
                else:
                    conn: _Conn = key.data
                    if mask & selectors.EVENT_READ and not conn.closed:
                        self._on_readable(conn)
                    if mask & selectors.EVENT_WRITE and not conn.closed:
                        self._flush(conn)
            self._run_calls()
            self._check_timers(time.monotonic())
            if self._should_stop(time.monotonic()):
                return

    def _run_calls(self) -> None:
        reason = self._signal_reason
        if reason is not None:
            self._signal_reason = None
            self._abort(reason)
        if self._wake_r is not None:
            try:
                while self._wake_r.recv(4096):
                    pass
            except (BlockingIOError, InterruptedError):
                pass
        while True:
            with self._calls_lock:
                if not self._calls:
                    return
                fn = self._calls.popleft()
            fn()

    def _should_stop(self, now: float) -> bool:
        if self._stop_requested:
            return True
        if self.abort_reason is not None:
            since = now - self._abort_at
            if since > self.grace:
                return True
            # Before the membership was complete, nodes may still be on their way: they must
            # hear the abort's reason, not find nobody listening.
            live = [c for c in self._conns if c.authed]
            return not live and (self._membership_sent or since > LATE_ARRIVALS)
        total = self.num_workers + self.num_servers
        if self._membership_sent and len(self._left) == total:
            return not any(c.role is not None for c in self._conns)
        return False

    def _teardown(self) -> None:
        for conn in list(self._conns):
            self._close_conn(conn, None)
        if self._sel is not None:
            self._sel.close()
        for s in (self._listener, self._wake_r, self._wake_w):
            if s is not None:
                try:
                    s.close()
                except OSError:
                    pass
        self._wake_w = None
        log.info("scheduler for job %s stopped (exit code %d)", self.job_id, self.exit_code)

    # ---------------------------------------------------------- connections
    def _accept(self) -> None:
        assert self._listener is not None and self._sel is not None
        while True:
            try:
                sock, addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. EMFILE: keep serving the connections we have
                log.warning("accept failed: %s", exc)
                return
            peer = format_addr(str(addr[0]), int(addr[1]))
            if self._stop_requested:
                sock.close()
                continue
            # After an abort, newcomers still authenticate and then hear the abort's reason.
            waiting = [c for c in self._conns if not c.authed and not c.draining]
            if len(waiting) >= MAX_UNAUTHENTICATED:
                # Turn the oldest away, not the newcomer: silent peers cannot lock the door.
                oldest = min(waiting, key=lambda c: c.accepted_at)
                log.warning(
                    "refused connection from %s: too many unauthenticated connections",
                    oldest.peer,
                )
                self._send(oldest, {"type": "busy", "message": BUSY_MESSAGE})
                self._drain(oldest)
            sock.setblocking(False)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
            conn = _Conn(sock, peer, time.monotonic())
            self._conns.add(conn)
            self._sel.register(sock, selectors.EVENT_READ, conn)
            log.debug("accepted connection from %s", peer)
            self._send(conn, {"type": "challenge", "nonce": conn.nonce.hex()})

    def _on_readable(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._lost(conn, f"connection error ({exc})")
            return
        if not data:
            self._lost(conn, "connection closed")
            return
        if conn.draining:
            return  # leaving or refused: input no longer matters
        try:
            messages = conn.decoder.feed(data)
        except FrameError as exc:
            self._protocol_error(conn, f"malformed frame: {exc}")
            return
        for msg in messages:
            if conn.closed or conn.draining:
                return
            self._handle(conn, msg)

    def _send(self, conn: _Conn, msg: Dict[str, Any]) -> None:
        if conn.closed or conn.fin_sent_at is not None:
            return
        conn.out += encode_frame(msg)
        if len(conn.out) > MAX_OUTBUF:
            self._protocol_error(conn, "not reading its messages (output buffer full)")
            return
        self._flush(conn)

    def _flush(self, conn: _Conn) -> None:
        while conn.out:
            try:
                sent = conn.sock.send(conn.out)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                conn.out.clear()
                self._lost(conn, f"connection error ({exc})")
                return
            del conn.out[:sent]
        if conn.closed or self._sel is None:
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.out else 0)
        self._sel.modify(conn.sock, events, conn)
        if not conn.out and conn.draining and conn.fin_sent_at is None:
            try:
                conn.sock.shutdown(socket.SHUT_WR)
            except OSError:
                self._close_conn(conn, None)
                return
            conn.fin_sent_at = time.monotonic()

    def _drain(self, conn: _Conn) -> None:
        """Stops handling input from ``conn``; closes it once its output is flushed."""
        if not conn.draining:
            conn.draining = True
            conn.drain_started_at = time.monotonic()
        self._flush(conn)

    def _close_conn(self, conn: _Conn, why: Optional[str]) -> None:
        if conn.closed:
            return
        conn.closed = True
        self._conns.discard(conn)
        if self._sel is not None:
            try:
                self._sel.unregister(conn.sock)
            except (KeyError, ValueError):
                pass
        try:
            conn.sock.close()
        except OSError:
            pass
        if why is not None:
            log.debug("closed %s: %s", conn.label, why)

    def _lost(self, conn: _Conn, why: str) -> None:
        """The peer closed (or broke) the connection."""
        self._close_conn(conn, why)
        self._node_gone(conn, f"{conn.label} died: {why}")

    def _protocol_error(self, conn: _Conn, why: str) -> None:
        """Closes a connection that broke the protocol; the job goes on unless it was a node."""
        log.warning("closed %s: %s", conn.label, why)
        self._close_conn(conn, why)
        self._node_gone(conn, f"{conn.label} sent a {why}; connection closed")

    def _node_gone(self, conn: _Conn, death_reason: str) -> None:
        if conn.role is None or conn.node_id is None:
            return
        key = (conn.role, conn.node_id)
        if key in self._left:
            return
        pool = self._server_pool
        if conn.role == "server" and pool is not None and pool.server_gone(conn, "died"):
            self._left.add(key)
            return
        if conn.said_bye or (conn.role == "server" and self._shutdown_sent):
            self._left.add(key)
            log.info("%s left", conn.label)
            return
        hook = self.on_node_lost
        # Only the loss that aborts the job: after the abort the others leave without a bye.
        if hook is not None and self.abort_reason is None:
            try:
                hook(conn.role, conn.node_id, death_reason)
            except Exception:
                log.exception("on_node_lost hook failed")
        self._abort(death_reason)

    def _check_timers(self, now: float) -> None:
        for conn in list(self._conns):
            if conn.closed:
                continue
            if conn.fin_sent_at is not None:
                if now - conn.fin_sent_at > LINGER:
                    self._close_conn(conn, "peer did not close after our FIN")
            elif conn.draining:
                if now - conn.drain_started_at > self.grace:
                    self._close_conn(conn, "peer did not read its last messages")
            elif not conn.authed:
                if now - conn.accepted_at > self.auth_timeout:
                    log.warning(
                        "refused connection from %s: no authentication within %g s",
                        conn.peer,
                        self.auth_timeout,
                    )
                    self._close_conn(conn, "authentication timeout")
            elif conn.role is not None and not conn.draining:
                if now - conn.last_seen > self.heartbeat_timeout:
                    reason = (
                        f"{conn.label} died: heartbeat timeout after {self.heartbeat_timeout:g} s"
                    )
                    self._close_conn(conn, "heartbeat timeout")
                    self._node_gone(conn, reason)
        if (
            not self._membership_sent
            and self.abort_reason is None
            and now - self._started_at > self.timeout
        ):
            missing = [f"worker {r}" for r in range(self.num_workers) if r not in self._workers]
            missing += [f"server {s}" for s in range(self.num_servers) if s not in self._servers]
            shown = ", ".join(missing[:16])
            if len(missing) > 16:
                shown += f" and {len(missing) - 16} more"
            self._abort(f"registration timed out after {self.timeout:g} s: missing {shown}")
        self._stall_tick(now)

    # ------------------------------------------------------------- messages
    def _handle(self, conn: _Conn, msg: Dict[str, Any]) -> None:
        kind = msg["type"]
        if not conn.authed:
            self._authenticate(conn, msg)
            return
        conn.last_seen = time.monotonic()
        if kind == "heartbeat":
            self._send(conn, {"type": "heartbeat"})
            stats = msg.get("stats")
            if isinstance(stats, dict) and conn.role == "worker" and conn.node_id is not None:
                with self._stats_lock:
                    self._worker_stats[conn.node_id] = (conn.last_seen, stats)
        elif kind == "clock":
            # The timeline's clock alignment (ControlClient.clock_offset): our clock, now.
            now = time.monotonic_ns()
            self._send(conn, {"type": "clock", "seq": msg.get("seq"), "t": now, "boot": boot_id()})
        elif kind == "register":
            self._register(conn, msg)
        elif kind == "stall_check":
            self._stall_check(conn)
        elif kind == "stall_report":
            self._stall_report(conn, msg)
        elif kind == "stall_config":
            self._stall_config(conn, msg)
        elif kind == "barrier":
            self._barrier(conn, msg)
        elif kind == "declare":
            self._declare(conn, msg)
        elif kind == "coord":
            self._coord(conn, msg)
        elif kind == "bye":
            self._bye(conn)
        elif kind == "reroute_report" and self._server_pool is not None:
            self._server_pool.report(conn, msg)
        elif kind == "abort":
            reason = msg.get("reason")
            if not isinstance(reason, str) or not reason:
                reason = f"{conn.label} requested an abort"
            log.error("%s requested an abort: %s", conn.label, reason)
            self._abort(reason)
        else:
            self._protocol_error(conn, f"message of unknown type {str(kind)[:64]!r}")

    def _authenticate(self, conn: _Conn, msg: Dict[str, Any]) -> None:
        mac = msg.get("mac")
        expected = compute_mac(self._token, conn.nonce, self.job_id).encode("ascii")
        if msg["type"] != "auth" or not isinstance(mac, str):
            log.warning("refused connection from %s: expected an auth message", conn.peer)
            self._close_conn(conn, "no auth message")
            return
        if not hmac.compare_digest(mac.encode("utf-8", "replace"), expected):
            log.warning("refused connection from %s: bad token", conn.peer)
            self._close_conn(conn, "bad token")
            return
        conn.authed = True
        conn.decoder.max_frame = MAX_FRAME
        conn.last_seen = time.monotonic()
        self._send(conn, {"type": "auth_ok"})
        if self.abort_reason is not None:
            self._send(conn, {"type": "abort", "reason": self.abort_reason})
            self._drain(conn)

    def _reject(self, conn: _Conn, message: str) -> None:
        log.error("refused registration from %s: %s", conn.peer, message)
        self._send(conn, {"type": "error", "message": message})
        self._drain(conn)

    def _register(self, conn: _Conn, msg: Dict[str, Any]) -> None:
        role, node_id = msg.get("role"), msg.get("id")
        host, hostname, pid = msg.get("host"), msg.get("hostname"), msg.get("pid")
        data_addr = msg.get("data_addr")
        rack = msg.get("rack", "")
        if conn.role is not None:
            self._reject(conn, f"{conn.label} registered twice")
            return
        if (
            role not in ("worker", "server")
            or not isinstance(node_id, int)
            or isinstance(node_id, bool)
        ):
            self._reject(conn, f"invalid register message: role={role!r} id={node_id!r}")
            return
        if not (isinstance(host, str) and isinstance(hostname, str) and _is_int(pid)):
            self._reject(conn, f"invalid register message from {role} {node_id}: host/hostname/pid")
            return
        if not isinstance(rack, str) or len(rack) > 64:
            self._reject(conn, f"invalid rack {rack!r} from {role} {node_id}: FASTPS_RACK")
            return
        if data_addr is not None and not isinstance(data_addr, str):
            self._reject(conn, f"invalid data_addr {data_addr!r} from {role} {node_id}")
            return
        label = f"{role} {node_id}"
        # With elastic servers a server may join the running job (core/elastic/server_pool).
        joining = self._membership_sent and role == "server" and self._server_pool is not None
        if self._membership_sent and not joining:
            self._reject(conn, f"{label} registered after the job's membership was complete")
            return
        checked = [("num_workers", self.num_workers)]
        if self._server_pool is None:
            checked.append(("num_servers", self.num_servers))
        for field, expected in checked:
            claimed = msg.get(field)
            if claimed is not None and claimed != expected:
                self._reject(
                    conn,
                    f"{label} (pid {pid} on host {hostname}) was started with "
                    f"FASTPS_{field.upper()}={claimed} but the scheduler expects {expected}",
                )
                return
        table = self._workers if role == "worker" else self._servers
        size = self.num_workers if role == "worker" else self.num_servers
        if role == "server" and self._server_pool is not None:
            size = MAX_SERVER_ID + 1
        if not 0 <= node_id < size:
            what = "rank" if role == "worker" else "id"
            self._reject(
                conn,
                f"{role} {what} {node_id} (pid {pid} on host {hostname}) is out of range: "
                f"the job has {size} {role}s, so valid values are 0..{size - 1}",
            )
            return
        other = table.get(node_id)
        if other is not None:
            self._reject(
                conn,
                f"duplicate {label}: pid {pid} on host {hostname} registered it, but pid "
                f"{other.info.get('pid')} on host {other.info.get('hostname')} already did",
            )
            return
        conn.role, conn.node_id = role, node_id
        conn.info = {
            "host": host,
            "hostname": hostname,
            "pid": pid,
            "data_addr": data_addr,
            "rack": rack,
        }
        table[node_id] = conn
        log.info("registered %s", conn.label)
        if role == "server" and self._shutdown_sent:
            self._send(conn, {"type": "shutdown"})
        if joining:
            assert self._server_pool is not None
            self._left.discard(("server", node_id))  # an id a departed server had
            self._server_pool.admit(conn)
            return
        if len(self._workers) == self.num_workers and len(self._servers) == self.num_servers:
            self._send_membership()

    def _send_membership(self) -> None:
        msg = self._membership_message()
        self._membership_sent = True
        log.info(
            "membership complete: %d workers on %d hosts, %d servers",
            len(msg["workers"]),
            len({w["hostname"] for w in msg["workers"]}),
            len(msg["servers"]),
        )
        for conn in [*self._workers.values(), *self._servers.values()]:
            self._send(conn, msg)

    def _membership_message(self) -> Dict[str, Any]:
        """The workers and the servers now in the job, as every node receives them."""
        by_host: Dict[str, List[int]] = {}
        for rank in sorted(self._workers):
            by_host.setdefault(self._workers[rank].info["hostname"], []).append(rank)
        workers = []
        for rank in sorted(self._workers):
            info = self._workers[rank].info
            group = by_host[info["hostname"]]
            workers.append(
                {
                    "rank": rank,
                    "host": info["host"],
                    "hostname": info["hostname"],
                    "pid": info["pid"],
                    "local_rank": group.index(rank),
                    "local_size": len(group),
                    "rack": info.get("rack", ""),
                }
            )
        servers = [
            {
                "id": sid,
                "addr": self._servers[sid].info["data_addr"],
                "host": self._servers[sid].info["host"],
                "hostname": self._servers[sid].info["hostname"],
                "pid": self._servers[sid].info["pid"],
                "rack": self._servers[sid].info.get("rack", ""),
            }
            for sid in sorted(self._servers)
            if ("server", sid) not in self._left
        ]
        return {"type": "membership", "workers": workers, "servers": servers}

    def _barrier(self, conn: _Conn, msg: Dict[str, Any]) -> None:
        name = msg.get("name")
        if conn.role != "worker" or conn.node_id is None:
            self._send(conn, {"type": "error", "message": "only registered workers enter barriers"})
            return
        if not isinstance(name, str):
            self._protocol_error(conn, f"barrier message with a non-string name {name!r}")
            return
        arrived = self._barriers.setdefault(name, set())
        arrived.add(conn.node_id)
        log.debug(
            "worker %d entered barrier %r (%d/%d)",
            conn.node_id,
            name,
            len(arrived),
            self.num_workers,
        )
        if len(arrived) == self.num_workers:
            del self._barriers[name]
            for worker in self._workers.values():
                self._send(worker, {"type": "barrier_done", "name": name})

    def worker_stats(self) -> Dict[int, Tuple[float, Dict[str, Any]]]:
        """Each worker's latest counters (any thread): rank -> (time received, counters)."""
        with self._stats_lock:
            return dict(self._worker_stats)

    def _stall_config(self, conn: _Conn, msg: Dict[str, Any]) -> None:
        warning = msg.get("warning_s")
        if conn.role != "worker" or not isinstance(warning, (int, float)) or warning <= 0:
            return
        known = self._stall_warning
        self._stall_warning = float(warning) if not known else min(known, float(warning))

    def _stall_check(self, conn: _Conn) -> None:
        """A worker's push_pull waited too long: ask every worker what it submitted
        (core/worker/stall.py). One inquiry at a time; one that lost a worker is restarted."""
        if conn.role != "worker" or conn.node_id is None:
            return
        self._stall_inquire(time.monotonic())

    def _stall_inquire(self, now: float) -> None:
        if self._stall is not None and now - self._stall["started"] < STALL_INQUIRY_S:
            return
        active = [
            r for r, c in self._workers.items() if not c.closed and ("worker", r) not in self._left
        ]
        self._stall = {"started": now, "pending": set(active), "reports": {}}
        self._stall_asked_at = now
        for r in active:
            self._send(self._workers[r], {"type": "stall_query"})

    def _stall_tick(self, now: float) -> None:
        """The waits the scheduler holds itself (a collective's announcement, a barrier)
        raise no worker's stall_check: past the warning period, inquire from here. Also
        the follow-up inquiry that proves a deadlock."""
        warning = self._stall_warning
        if warning <= 0 or self.abort_reason is not None or not self._membership_sent:
            return
        if self._stall_recheck_at is not None and now >= self._stall_recheck_at:
            self._stall_recheck_at = None
            self._stall_inquire(now)
            return
        if now < self._stall_look_at:
            return
        self._stall_look_at = now + poll_interval(warning)
        held = self._held_waits(now)
        if any(w["age_s"] >= warning for w in held) and now - self._stall_asked_at >= warning:
            self._stall_inquire(now)

    def _held_waits(self, now: float) -> List[Dict[str, Any]]:
        """The collectives announced by some members only and the barriers some workers
        entered, each with the ranks it holds, the ranks it lacks and its age (since this
        first saw it)."""
        found: List[Tuple[str, int, str, List[int], List[int]]] = [
            ("op", set_id, name, waiting, lacking)
            for set_id, name, waiting, lacking in self._coordinator.waits()
            if waiting
        ]
        for name, arrived in self._barriers.items():
            lacking = [r for r in range(self.num_workers) if r not in arrived]
            found.append(("barrier", 0, name, sorted(arrived), lacking))
        since = {(k, sid, n): self._stall_held.get((k, sid, n), now) for k, sid, n, _, _ in found}
        self._stall_held = since
        # A barrier's waiters may have timed out and gone on (nothing withdraws them):
        # one as old as the barrier timeout (FASTPS_TIMEOUT, as here) waits for nobody.
        late = self.timeout - poll_interval(self._stall_warning or self.timeout)
        return [
            control_wait(k, n, waiting, lacking, now - since[(k, sid, n)], sid)
            for k, sid, n, waiting, lacking in found
            if k != "barrier" or now - since[(k, sid, n)] < late
        ]

    def _stable_ranks(self) -> Optional[List[int]]:
        """Every rank, if the job's workers are all in and none has left; else None.

        A deadlock is proven only over a fixed membership. Within one scheduler it is
        fixed once complete: a lost worker aborts the job, and an elastic job forms each
        generation (a replaced worker's) with a scheduler of its own. A worker that left
        is not counted as never submitting (its last counts are unknown): no proof then."""
        if not self._membership_sent or self.abort_reason is not None:
            return None
        if len(self._workers) != self.num_workers:
            return None
        for r, c in self._workers.items():
            if c.closed or ("worker", r) in self._left:
                return None
        return list(range(self.num_workers))

    def _stall_report(self, conn: _Conn, msg: Dict[str, Any]) -> None:
        inquiry = self._stall
        rank = conn.node_id
        if inquiry is None or conn.role != "worker" or rank not in inquiry["pending"]:
            return
        report = msg.get("report")
        if not isinstance(report, dict):
            self._protocol_error(conn, "stall_report without a report")
            return
        inquiry["pending"].discard(rank)
        inquiry["reports"][rank] = report
        if inquiry["pending"]:
            return
        self._stall = None
        now = time.monotonic()
        reports = inquiry["reports"]
        held = self._held_waits(now)
        try:
            stalls = find_stalls(reports, range(self.num_workers))
            warnings = [float(r.get("warning_s", 0) or 0) for r in reports.values()]
        except (TypeError, ValueError, AttributeError) as exc:
            log.warning("malformed stall report: %s", exc)
            return
        warning = min([w for w in warnings if w > 0] or [self._stall_warning or 0.0])
        # Only waits past the warning are stalls (an inquiry sees every wait in flight).
        stalls = [s for s in stalls if s["age_s"] >= warning]
        for s in stalls:
            log.warning("stall: %s", describe_stall(s))
        for w in held:
            if w["age_s"] >= warning:
                log.warning("stall: %s", describe_stall(w))
        if self._stall_permanent(now, reports, held, warning):
            return
        for r in reports:
            worker = self._workers.get(r)
            if worker is not None and not worker.closed:
                self._send(worker, {"type": "stall_result", "stalls": stalls})

    def _stall_permanent(
        self,
        now: float,
        reports: Dict[int, Any],
        held: List[Dict[str, Any]],
        warning: float,
    ) -> bool:
        """Aborts the job if the stall is proven permanent (core/worker/stall.py, DeadlockWatch);
        else, while it looks like one, schedules the inquiry that can prove it."""
        ranks = self._stable_ranks()
        if ranks is None or warning <= 0 or set(reports) != set(ranks):
            self._deadlock.reset()
            return False
        try:
            text, again = self._deadlock.observe(
                now, reports, held, ranks, confirm_interval(warning)
            )
        except (TypeError, ValueError, AttributeError, KeyError, IndexError) as exc:
            log.warning("malformed stall report: %s", exc)
            self._deadlock.reset()
            return False
        self._stall_recheck_at = again
        if text is None:
            return False
        log.error("stall: %s", text)
        self._abort(text)
        return True

    def _coord(self, conn: _Conn, msg: Dict[str, Any]) -> None:
        """A collective announced by one worker (``core/control/coordinator.py``)."""
        set_id: Any
        set_id, ranks, name = msg.get("set"), msg.get("ranks"), msg.get("name")
        if conn.role != "worker" or conn.node_id is None:
            self._send(conn, {"type": "error", "message": "only registered workers coordinate"})
            return
        if (
            not _is_int(set_id)
            or not isinstance(name, str)
            or not isinstance(ranks, list)
            or not ranks
            or not all(_is_int(r) and 0 <= r < self.num_workers for r in ranks)
        ):
            self._protocol_error(conn, f"invalid coord message for op {str(name)[:200]!r}")
            return
        if msg.get("forget"):
            self._coordinator.forget_set(set_id)
            return
        if msg.get("withdraw"):
            self._coordinator.withdraw(set_id, name, conn.node_id)
            # In order after any completion of the gather it left: from then on the
            # worker knows no completion of its withdrawn announcement is on the way.
            ack = {"type": "coord_withdrawn", "set": set_id, "name": name}
            self._send(conn, {**ack, "seq": msg["seq"] if _is_int(msg.get("seq")) else -1})
            return
        done, error = self._coordinator.announce(
            set_id, ranks, name, conn.node_id, msg.get("record")
        )
        if error is not None:
            self._send(conn, {"type": "coord_done", "set": set_id, "name": name, "error": error})
        for completed in done:
            for rank in completed.ranks:
                worker = self._workers.get(rank)
                if worker is not None:
                    self._send(worker, completed.message)

    def _declare(self, conn: _Conn, msg: Dict[str, Any]) -> None:
        """Checks a worker's declaration of a tensor against the other workers'.

        A declaration is (shape, dtype, priority). A worker declares a tensor again each
        time that changes on its side, numbering its declarations of the name (``version``);
        every worker runs the same program, so declaration ``v`` must agree on every worker.
        The priority must agree because the push window's deadlock freedom rests on every
        worker ordering the parts alike (docs/design/architecture.md).
        """
        if conn.role != "worker":
            # Only a member's tensors count: anyone else could abort the job by declaring.
            self._protocol_error(conn, "declare message from a connection that is not a worker")
            return
        name, shape, dtype = msg.get("name"), msg.get("shape"), msg.get("dtype")
        priority, version = msg.get("priority"), msg.get("version")
        compression = msg.get("compression", "")
        rank = msg.get("rank", conn.node_id)
        if (
            not isinstance(name, str)
            or not isinstance(dtype, str)
            or not isinstance(shape, list)
            or not all(_is_int(d) and d >= 0 for d in shape)
            or not isinstance(rank, int)
            or isinstance(rank, bool)
            or not isinstance(priority, int)
            or isinstance(priority, bool)
            or not isinstance(version, int)
            or isinstance(version, bool)
            or version < 0
            or not isinstance(compression, str)
        ):
            self._protocol_error(conn, f"invalid declare message for tensor {str(name)[:200]!r}")
            return
        shape = [int(d) for d in shape]
        key = (name, version)
        known = self._tensors.get(key)
        if known is None:
            known = self._tensors[key] = _Declared(shape, dtype, priority, rank, set(), compression)
        if (
            known.shape == shape
            and known.dtype == dtype
            and known.priority == priority
            and known.compression == compression
        ):
            # A tensor whose shape changes every step is declared every step: forget each
            # version once every worker declared it, so the table stays small.
            known.agreed.add(rank)
            if len(known.agreed) >= self.num_workers:
                del self._tensors[key]
            return
        which = f" (declaration {version + 1} of it)" if version else ""
        if known.shape != shape or known.dtype != dtype:
            self._abort(
                f"tensor {name!r} mismatch{which}: rank {known.rank} has "
                f"{_describe_tensor(known.dtype, known.shape)}, rank {rank} has "
                f"{_describe_tensor(dtype, shape)}"
            )
        elif known.priority != priority:
            self._abort(
                f"tensor {name!r} priority mismatch{which}: rank {known.rank} gives it priority "
                f"{known.priority}, rank {rank} gives it priority {priority}; every worker must "
                "give a tensor the same priority (the push order across workers depends on it)"
            )
        elif known.compression != compression:
            self._abort(
                f"tensor {name!r} compression mismatch{which}: rank {known.rank} compresses it "
                f"with {known.compression or 'none'}, rank {rank} with {compression or 'none'}; "
                "every worker must compress a tensor alike (docs/guide/compression.md)"
            )

    def _bye(self, conn: _Conn) -> None:
        conn.said_bye = True
        pool = self._server_pool
        if conn.role is not None and conn.node_id is not None:
            if pool is not None and conn.role == "server":
                pool.server_gone(conn, "left")
            self._left.add((conn.role, conn.node_id))
            if pool is not None and conn.role == "worker":
                pool.worker_gone(conn.node_id)
            log.info("%s left", conn.label)
            workers_left = sum(1 for role, _ in self._left if role == "worker")
            if conn.role == "worker" and workers_left == self.num_workers:
                self._send_shutdown()
        self._drain(conn)

    def _send_shutdown(self) -> None:
        if self._shutdown_sent:
            return
        self._shutdown_sent = True
        log.info("all workers finished: shutting down %d servers", len(self._servers))
        for sid, conn in self._servers.items():
            if ("server", sid) not in self._left:
                self._send(conn, {"type": "shutdown"})

    def _abort(self, reason: str) -> None:
        if self.abort_reason is not None:
            return
        self.abort_reason = reason
        self._abort_at = time.monotonic()
        hook = self.on_abort
        log.log(logging.INFO if hook else logging.ERROR, "aborting job %s: %s", self.job_id, reason)
        if hook is not None:
            try:
                hook(reason)
            except Exception:
                log.exception("abort hook failed")
        for conn in list(self._conns):
            if conn.authed and not conn.closed:
                self._send(conn, {"type": "abort", "reason": reason})
                self._drain(conn)


class _PoolHostOf:
    """The scheduler as its server pool sees it (server_pool.PoolHost)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self._s = scheduler

    def live_servers(self) -> Dict[int, _Conn]:
        s = self._s
        return {
            sid: c
            for sid, c in s._servers.items()
            if not c.closed and ("server", sid) not in s._left
        }

    def live_workers(self) -> Dict[int, _Conn]:
        s = self._s
        return {
            r: c for r, c in s._workers.items() if not c.closed and ("worker", r) not in s._left
        }

    def may_change_servers(self) -> bool:
        s = self._s
        return not s._shutdown_sent and s.abort_reason is None and s._membership_sent

    def server(self, sid: int) -> Optional[_Conn]:
        return self._s._servers.get(sid)

    def forget_server(self, sid: int) -> None:
        del self._s._servers[sid]

    def membership(self) -> Dict[str, Any]:
        return self._s._membership_message()

    def send(self, conn: _Conn, msg: Dict[str, Any]) -> None:
        self._s._send(conn, msg)

    def fail_job(self, reason: str) -> None:
        self._s._abort(reason)

    def reject(self, conn: _Conn, text: str) -> None:
        self._s._protocol_error(conn, text)


def main() -> None:
    """``python -m fastps.scheduler``: serves one job, exits 0 if it finished, 1 if aborted."""
    try:
        cfg = Config.from_env({**os.environ, "FASTPS_ROLE": "scheduler"})
        host, port = cfg.require_scheduler_addr()
    except FastPSError as exc:
        print(f"fastps scheduler: {exc}", file=sys.stderr)
        sys.exit(2)
    logging.basicConfig(format="fastps-scheduler %(levelname)s: %(message)s")
    logging.getLogger("fastps").setLevel(cfg.scheduler_log_level())
    scheduler = Scheduler(
        num_workers=cfg.num_workers,
        num_servers=cfg.num_servers,
        job_id=cfg.job_id,
        token=cfg.token,
        host=host,
        port=port,
        timeout=cfg.timeout,
        heartbeat_timeout=cfg.heartbeat_timeout,
        auth_timeout=cfg.handshake_timeout,
        elastic_servers=cfg.elastic_servers,
    )
    try:
        scheduler.bind()
    except FastPSError as exc:
        print(f"fastps scheduler: {exc}", file=sys.stderr)
        sys.exit(2)
    print(f"fastps scheduler: job {cfg.job_id} on {scheduler.address_text}", flush=True)

    def on_signal(signum: int, _frame: object) -> None:
        scheduler.abort_from_signal(f"scheduler terminated by {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    sys.exit(scheduler.serve())


if __name__ == "__main__":
    main()
