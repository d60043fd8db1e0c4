"""A small key-value store for the rendezvous where torch's store is not there.

Launchers that set ``MASTER_ADDR``/``MASTER_PORT``/``RANK``/``WORLD_SIZE`` (a SLURM script,
a Kubernetes job) start TensorFlow and MXNet jobs too, in environments without torch. Then
rank 0 serves this store at ``MASTER_ADDR:MASTER_PORT`` and every rank talks to it with
:class:`StoreClient`, which has the methods of torch's store that
``fastps.launch.store_rendezvous`` uses (``set``, ``get``, ``add``, ``check``, ``wait``).
A job whose processes can import torch uses torch's store instead (the two do not speak to
each other). Like torch's ``TCPStore`` it has no authentication: it carries the job's token,
so the port must be reachable only from the job's machines (the same trust as torch's).

Protocol: one JSON object per line each way; values travel as text.
"""

from __future__ import annotations

import datetime
import json
import socket
import socketserver
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Union

from fastps.config import format_addr
from fastps.errors import FastPSError, FastPSTimeoutError

__all__ = ["StoreServer", "StoreClient"]

Seconds = Union[float, datetime.timedelta]


def _seconds(value: Seconds) -> float:
    return value.total_seconds() if isinstance(value, datetime.timedelta) else float(value)


class _State:
    def __init__(self) -> None:
        self.data: Dict[str, str] = {}
        self.changed = threading.Condition()


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        state = self.server.state
        for line in self.rfile:
            try:
                req = json.loads(line)
                reply = self._answer(state, req)
            except (ValueError, KeyError, TypeError) as exc:
                reply = {"error": f"bad request: {exc}"}
            self.wfile.write((json.dumps(reply) + "\n").encode())
            self.wfile.flush()

    @staticmethod
    def _answer(state: _State, req: Dict[str, Any]) -> Dict[str, Any]:
        op = req["op"]
        with state.changed:
            if op == "set":
                state.data[str(req["key"])] = str(req["value"])
                state.changed.notify_all()
                return {"ok": True}
            if op == "add":
                value = int(state.data.get(req["key"], "0")) + int(req["amount"])
                state.data[str(req["key"])] = str(value)
                state.changed.notify_all()
                return {"value": value}
            if op == "check":
                return {"value": all(k in state.data for k in req["keys"])}
            if op in ("get", "wait"):
                keys = [req["key"]] if op == "get" else list(req["keys"])
                deadline = time.monotonic() + float(req["timeout"])
                while not all(k in state.data for k in keys):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        missing = [k for k in keys if k not in state.data]
                        return {"timeout": missing}
                    state.changed.wait(min(left, 1.0))
                return {"value": state.data[keys[0]] if op == "get" else True}
        return {"error": f"unknown op {op!r}"}


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr: Any, state: _State) -> None:
        self.state = state
        super().__init__(addr, _Handler)


class StoreServer:
    """Serves the store from a daemon thread of this process (rank 0's) until it exits."""

    def __init__(self, host: str, port: int) -> None:
        try:
            self._server = _Server((host, port), _State())
        except OSError as exc:
            raise FastPSError(
                f"rank 0 cannot serve the rendezvous store on {format_addr(host, port)} "
                f"(MASTER_ADDR:MASTER_PORT): {exc}"
            ) from None
        self.port = int(self._server.server_address[1])
        threading.Thread(
            target=self._server.serve_forever, name="fastps-kv-store", daemon=True
        ).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class StoreClient:
    """torch's store methods over :class:`StoreServer`; connects until ``timeout``."""

    def __init__(self, host: str, port: int, timeout: Seconds) -> None:
        self.host = host
        self.port = port
        self._timeout = _seconds(timeout)
        self._lock = threading.Lock()
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                self._sock = socket.create_connection((host, port), timeout=5.0)
                break
            except OSError as exc:
                if time.monotonic() >= deadline:
                    raise FastPSTimeoutError(
                        f"no rendezvous store at {format_addr(host, port)} "
                        f"(MASTER_ADDR:MASTER_PORT) after {self._timeout:g} s: {exc}"
                    ) from None
                time.sleep(0.2)
        self._sock.settimeout(None)
        self._file = self._sock.makefile("rwb")

    def _call(self, req: Dict[str, Any]) -> Any:
        with self._lock:
            self._file.write((json.dumps(req) + "\n").encode())
            self._file.flush()
            line = self._file.readline()
        if not line:
            raise FastPSError(
                f"the rendezvous store at {format_addr(self.host, self.port)} closed the "
                "connection (rank 0 gone?)"
            )
        reply = json.loads(line)
        if "timeout" in reply:
            raise FastPSTimeoutError(
                f"rendezvous store: keys {reply['timeout']} did not arrive within "
                f"{req.get('timeout', self._timeout):g} s"
            )
        if "error" in reply:
            raise FastPSError(f"rendezvous store: {reply['error']}")
        return reply.get("value")

    def set(self, key: str, value: Union[str, bytes]) -> None:
        text = value.decode() if isinstance(value, (bytes, bytearray)) else str(value)
        self._call({"op": "set", "key": key, "value": text})

    def get(self, key: str) -> bytes:
        return str(self._call({"op": "get", "key": key, "timeout": self._timeout})).encode()

    def add(self, key: str, amount: int) -> int:
        return int(self._call({"op": "add", "key": key, "amount": int(amount)}))

    def check(self, keys: Sequence[str]) -> bool:
        return bool(self._call({"op": "check", "keys": list(keys)}))

    def wait(self, keys: List[str], timeout: Optional[Seconds] = None) -> None:
        limit = self._timeout if timeout is None else _seconds(timeout)
        self._call({"op": "wait", "keys": list(keys), "timeout": limit})

    def set_timeout(self, timeout: Seconds) -> None:
        self._timeout = _seconds(timeout)
