"""The rendezvous service's wire format: one request and one answer per connection.

Frames are the control plane's (length-prefixed JSON, ``fastps.control``). The service
opens with a nonce; the client answers with HMAC-SHA256(token, nonce ‖ job id) and its
request in one frame, so nothing is answered to a process that does not know the job token.
"""

from __future__ import annotations

import socket
import time
from typing import Any, Dict, Mapping, Optional

from fastps import config
from fastps.config import parse_addr
from fastps.control.protocol import FrameDecoder, compute_mac, encode_frame
from fastps.errors import FastPSError, FastPSTimeoutError

# Environment of an elastic worker, set by fastpsrun's elastic driver (and read by
# fastps.config: elastic_addr, elastic_id, elastic_job_id).
ADDR_VAR = "FASTPS_ELASTIC_ADDR"  # host:port of the rendezvous service
ID_VAR = "FASTPS_ELASTIC_ID"  # this worker's slot, "host:index"
JOB_VAR = "FASTPS_ELASTIC_JOB_ID"  # the elastic job's id (generations add "-g<k>")

MAX_FRAME = 1 << 20


def enabled() -> bool:
    """True in a worker started by fastpsrun in elastic mode."""
    return bool(config.elastic_addr())


def recv_message(sock: socket.socket, decoder: FrameDecoder, deadline: float) -> Dict[str, Any]:
    """Reads one frame, waiting at most until ``deadline`` (monotonic seconds)."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise FastPSTimeoutError("no answer from the rendezvous service in time")
        sock.settimeout(left)
        try:
            data = sock.recv(65536)
        except socket.timeout:
            continue
        if not data:
            raise FastPSError("the rendezvous service closed the connection")
        msgs = decoder.feed(data)
        if msgs:
            return msgs[0]


def request(
    msg: Mapping[str, Any],
    timeout: float,
    addr: Optional[str] = None,
    token: Optional[str] = None,
    job_id: Optional[str] = None,
) -> Dict[str, Any]:
    """Sends one request to the rendezvous service and returns its answer (bounded)."""
    addr = addr or config.elastic_addr()
    token = config.job_token() if token is None else token
    job_id = (config.stated_job_id() or "") if job_id is None else job_id
    host, port = parse_addr(addr, ADDR_VAR)
    deadline = time.monotonic() + timeout
    try:
        sock = socket.create_connection((host, port), timeout=min(timeout, 10.0))
    except OSError as exc:
        raise FastPSError(f"cannot reach the rendezvous service at {addr}: {exc}") from None
    with sock:
        decoder = FrameDecoder(MAX_FRAME)
        try:
            hello = recv_message(sock, decoder, time.monotonic() + min(timeout, 10.0))
            nonce = bytes.fromhex(str(hello.get("nonce", "")))
            sock.sendall(encode_frame({**msg, "mac": compute_mac(token, nonce, job_id)}))
            answer = recv_message(sock, decoder, deadline)
        except (OSError, ValueError) as exc:
            raise FastPSError(f"rendezvous service at {addr}: {exc}") from None
    if answer.get("type") == "error":
        raise FastPSError(str(answer.get("message", "rendezvous refused")))
    return answer
