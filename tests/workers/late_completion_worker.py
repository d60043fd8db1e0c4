"""A worker for tests/integration/test_late_completion.py: a rank gives up on an op just as its
gather completes (the scheduler sent the completion, the rank had not read it yet), as a
loaded machine makes happen when an op timeout or a test's timeout fires.

Rank 1 announces ``late`` (a reducescatter) first; then both ranks meet on an allreduce;
then rank 0 announces ``late``, which completes the gather at once, but rank 0's control
receiver reads the completion only DELAY_S later (the hook below stands in for a
descheduled thread), so rank 0's 0.3 s wait runs out and it withdraws. Rank 1, which got
the completion, moves its data: it must finish (rank 0 still contributes its rows) instead
of waiting for parts rank 0 never sends. Afterwards both ranks run more ops, so the job
stays usable. Prints ``rank R LATE OK``; then ``rank R ABANDON OK`` once a push_pull
dropped unfinished was released without blocking the thread that dropped it; then
``rank R GIVE UP OK`` once a group given up part-way left nothing in flight or waiting."""

from __future__ import annotations

import os
import time
from typing import Any, Dict

import fastps
import numpy as np
from fastps.collectives import ops as C
from fastps.errors import FastPSTimeoutError
from fastps.worker import api

DELAY_S = float(os.environ.get("LATE_DELAY_S", "1.5"))
ROUNDS = int(os.environ.get("LATE_ROUNDS", "3"))

fastps.init()
C.start_session()
rank, size = fastps.rank(), fastps.size()
assert size == 2, size
client = api._st().client
assert client is not None

if rank == 0:
    dispatch = client._dispatch

    def slow_dispatch(msg: Dict[str, Any]) -> None:
        if msg.get("type") == "coord_done" and str(msg.get("name", "")).startswith("late"):
            time.sleep(DELAY_S)  # the receiver thread reads it late
        dispatch(msg)

    client._dispatch = slow_dispatch  # type: ignore[method-assign]

rows = 5  # uneven over 2 ranks: rank 0 gets 3 rows, rank 1 gets 2
for i in range(ROUNDS):
    name = f"late.{i}"
    x = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4) * (rank + 1) + i
    if rank == 1:
        op = C.reducescatter_async(x, "float32", name, C.ReduceOp.SUM)
        C.allreduce_async(np.ones(1, np.float32), "float32", f"meet.{i}").synchronize()
        got = op.synchronize(timeout=10 + DELAY_S)
        base = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)
        want = (base * 1 + i) + (base * 2 + i)
        assert np.array_equal(got, want[3:]), (got, want[3:])
    else:
        C.allreduce_async(np.ones(1, np.float32), "float32", f"meet.{i}").synchronize()
        op = C.reducescatter_async(x, "float32", name, C.ReduceOp.SUM)
        try:
            op.synchronize(timeout=0.3)
            # Only if the machine held this thread longer than the hook held the receiver.
            print(f"rank 0 round {i}: the completion was read in time", flush=True)
        except FastPSTimeoutError as exc:
            assert "did not start" in str(exc), exc
    # The job stays usable: anonymous and named ops of both kinds still work.
    y = C.allreduce_async(
        np.full(3, rank + 1.0, np.float32), "float32", None, C.ReduceOp.SUM
    ).synchronize()
    assert np.all(y == 3.0), y
    z = C.reducescatter_async(np.ones((4, 2), np.int32), "int32", None, C.ReduceOp.SUM)
    assert np.all(z.synchronize() == 2)

print(f"rank {rank} LATE OK", flush=True)

# A push_pull dropped unfinished (its op gave up) must not block the thread that drops it:
# rank 1 drops one that rank 0 pushes only later; the sweep releases it once it finished.
x = np.full(1000, rank + 1.0, np.float32)
if rank == 1:
    h = api.push_pull_async(x, average=False, name="orphan")
    t0 = time.monotonic()
    del h
    dropped_in = time.monotonic() - t0
    assert dropped_in < 1.0, f"dropping an unfinished push_pull blocked for {dropped_in:.1f} s"
    assert api.sweep_abandoned() == 1
C.allreduce_async(np.ones(1, np.float32), "float32", "meet.orphan").synchronize()
if rank == 0:
    assert np.all(api.push_pull(x, average=False, name="orphan") == 3.0)
C.allreduce_async(np.ones(1, np.float32), "float32", "meet.orphan.done").synchronize()
deadline = time.monotonic() + 10
while api.sweep_abandoned() and time.monotonic() < deadline:
    time.sleep(0.01)
assert api.sweep_abandoned() == 0
print(f"rank {rank} ABANDON OK", flush=True)

# A group whose wait failed part-way (a plugin's group handle) gives up its members: they
# leave the names in flight, their data still moves for the peers, and once the core is
# done nothing stays "waiting" for the stall inspector (unpolled members of such groups were
# its "waited N s although every rank submitted it" reports in Horovod's test files under load).
xs = [np.full(4, float(rank + 1 + k), np.float32) for k in range(3)]
if rank == 1:
    ops = C.grouped_allreduce_async(xs, ["float32"] * 3, "grp", C.ReduceOp.SUM)
    C.allreduce_async(np.ones(1, np.float32), "float32", "meet.grp").synchronize()
    for k, o in enumerate(ops):
        assert np.all(o.synchronize(timeout=10 + DELAY_S) == 3.0 + 2 * k)
else:
    C.allreduce_async(np.ones(1, np.float32), "float32", "meet.grp").synchronize()
    ops = C.grouped_allreduce_async(xs, ["float32"] * 3, "grp", C.ReduceOp.SUM)
    C.give_up(ops)
    assert not [key for key in C._sess().inflight if key[1].startswith("grp")]
C.allreduce_async(np.ones(1, np.float32), "float32", "meet.grp.done").synchronize()
stall = api._st().stall
deadline = time.monotonic() + 10
while time.monotonic() < deadline and (
    api.sweep_abandoned() or (stall is not None and any("grp" in n for n in stall.in_flight()))
):
    time.sleep(0.01)
assert api.sweep_abandoned() == 0
assert stall is None or not [n for n in stall.in_flight() if "grp" in n], stall.in_flight()
print(f"rank {rank} GIVE UP OK", flush=True)
C.end_session()
fastps.shutdown()
