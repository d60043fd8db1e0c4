"""Whether an error means this elastic generation is broken (a peer died, the job was
aborted), so the run loop rolls back or a spare takes the lost peer's place."""

from __future__ import annotations

import time

from fastps.errors import FastPSAbort, FastPSError, HorovodInternalError
from fastps.worker import api

# Errors that mean "this generation is broken": a peer died or the job was aborted.
FAILURES = (HorovodInternalError, FastPSAbort)

# How long an error waits for the scheduler's abort that explains it (the core may notice
# a dead peer a moment before the scheduler says so).
ABORT_WAIT = 2.0


def generation_failed(exc: BaseException) -> bool:
    """Whether ``exc`` came from this generation being aborted: a HorovodInternalError or
    FastPSAbort, or any other fastps error (a collective's, a timeout) while the
    generation's scheduler has aborted it."""
    if isinstance(exc, FAILURES):
        return True
    return isinstance(exc, FastPSError) and generation_aborted()


def generation_aborted() -> bool:
    """Whether the generation's scheduler aborted it, waiting up to ``ABORT_WAIT`` for an
    abort that an error seen first may be the sign of."""
    st = api._state
    client = st.client if st is not None else None
    if client is None:
        return False
    deadline = time.monotonic() + ABORT_WAIT
    while client.abort_reason is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return client.abort_reason is not None
