"""The worker side of ``fastps.run()``: ``python -m fastps.launch.function_task``.

Each worker of the job fetches the caller's function from the caller's result store, runs
it, and stores what it returned or raised under its rank. Messages both ways are signed
with the run's secret (HMAC-SHA256), so nobody else who reaches the store's port can make
either side unpickle something of theirs. ``function_payload`` holds the format both sides
share.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import pickle
import sys
import traceback
from typing import Any, Tuple

from fastps.config import run_function_channel
from fastps.errors import FastPSError

__all__ = ["pack", "unpack", "FUNCTION_KEY", "result_key", "main"]

FUNCTION_KEY = "fastps-run/function"
STORE_TIMEOUT = 60.0  # seconds to reach the caller's store and to fetch the function


def result_key(rank: int) -> str:
    return f"fastps-run/result/{rank}"


def dumps(obj: Any) -> bytes:
    """cloudpickle where installed (functions from ``__main__`` or a notebook travel by
    value); the standard pickle otherwise."""
    try:
        import cloudpickle
    except ImportError:
        return pickle.dumps(obj)
    return bytes(cloudpickle.dumps(obj))


def pack(obj: Any, secret: str) -> str:
    body = dumps(obj)
    tag = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return tag + ":" + base64.b64encode(body).decode()


def unpack(text: str, secret: str, what: str) -> Any:
    tag, _, encoded = text.partition(":")
    body = base64.b64decode(encoded.encode())
    expected = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(tag, expected):
        raise FastPSError(f"{what}: signature does not match this run's secret; not loaded")
    return pickle.loads(body)


def _outcome(fn: Any, args: Tuple[Any, ...], kwargs: Any) -> Tuple[bool, Any, str]:
    """(True, value, "") or (False, exception, formatted traceback)."""
    try:
        return True, fn(*args, **kwargs), ""
    except BaseException as exc:  # noqa: BLE001 - reported to the caller, named by rank
        return False, exc, traceback.format_exc()


def main() -> int:
    from fastps.launch.kv_store import StoreClient

    host, port, secret, rank = run_function_channel()
    store = StoreClient(host, port, STORE_TIMEOUT)
    fn, args, kwargs = unpack(store.get(FUNCTION_KEY).decode(), secret, "the function")
    ok, value, trace = _outcome(fn, args, kwargs)
    try:
        message = pack((ok, value, trace), secret)
    except Exception as exc:  # the value (or exception) cannot be pickled
        what = "returned" if ok else "raised"
        text = f"rank {rank}: what the function {what} cannot be sent back: {exc}"
        message = pack((False, FastPSError(text), trace), secret)
        ok = False
    store.set(result_key(rank), message)
    if not ok:
        sys.stderr.write(trace)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
