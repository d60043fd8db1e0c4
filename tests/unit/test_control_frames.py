"""The control plane's framing and messages (core/control/protocol.py) without a socket:
frames decoded byte by byte, size and content limits, messages JSON-safe."""

from __future__ import annotations

import json
import struct

import pytest
from fastps.control.protocol import (
    MAX_FRAME,
    FrameDecoder,
    FrameError,
    encode_frame,
)


def test_frame_decoder_round_trip_and_limits() -> None:
    dec = FrameDecoder()
    frame = encode_frame({"type": "x", "v": [1, 2]}) + encode_frame({"type": "y"})
    got = [m for i in range(len(frame)) for m in dec.feed(frame[i : i + 1])]
    assert got == [{"type": "x", "v": [1, 2]}, {"type": "y"}]
    with pytest.raises(FrameError, match="exceeds"):
        FrameDecoder().feed(struct.pack(">I", MAX_FRAME + 1))
    for body in (b"\xff\xfe", b"[1, 2]", b'{"no_type": 1}', b"[" * 100000):
        with pytest.raises(FrameError):
            FrameDecoder().feed(struct.pack(">I", len(body)) + body)


def test_message_helpers_are_json_safe() -> None:
    frame = encode_frame({"type": "declare", "name": "ü", "shape": [], "dtype": "bf16", "rank": 0})
    assert json.loads(frame[4:].decode())["name"] == "ü"
