"""Checks the routed data-plane modes behind allgather, broadcast, alltoall, reducescatter
and Min/Max allreduce (forward / want-only pushes, docs/design/architecture.md "Bytes on the
wire"): exact results with uneven sizes, the bytes each op moves on this worker's sockets
against the minimum, and the core's refusals. Run by tests/integration/test_routed.py as N workers.
Prints ``rank R OK routed`` and a ``STATS`` line."""

from __future__ import annotations

import json
import sys
import time

import fastps
import numpy as np
from fastps.collectives import ops as C
from fastps.worker import api

HEADER = 64
# A routed part costs one header each way besides its bytes; parts are 64 KiB here.
SLACK = 1.1


def counters() -> tuple:
    """The socket counters once they stop moving: the thread that wrote a part's last bytes
    adds them after its write returns, which can be just after the op completed."""
    now = None
    for _ in range(100):
        s = api.data_path_stats()
        read = (s["socket_bytes_sent"], s["socket_bytes_received"])
        if read == now:
            break
        now = read
        time.sleep(0.01)
    return now


def measured(fn):
    """Runs fn once every rank is ready; returns (result, bytes sent, bytes received)."""
    C.barrier()
    s0, r0 = counters()
    out = fn()
    s1, r1 = counters()
    return out, s1 - s0, r1 - r0


def within(what: str, got: int, minimum: int, parts: int) -> None:
    """At least the minimum (the payload must really travel on the sockets) and at most
    10% more plus a header per part each way."""
    ceiling = SLACK * minimum + 2 * HEADER * (parts + 1)
    if not minimum <= got <= ceiling:
        raise AssertionError(f"{what}: {got} bytes, minimum {minimum}, allowed up to {ceiling:.0f}")


def parts_of(nbytes: int) -> int:
    return max(1, -(-nbytes // (64 << 10)))


def check_allgather(r: int, n: int) -> None:
    for dt in ("float32", "int64", "uint8"):
        rows = [k for k in range(n)]  # rank 0 contributes no rows
        mine = (np.arange(rows[r] * 3) + 100 * r).reshape(rows[r], 3).astype(C.DTYPES[dt])
        got, counts = C.allgather_async(mine, dt).synchronize()
        want = np.concatenate(
            [(np.arange(rows[k] * 3) + 100 * k).reshape(rows[k], 3) for k in range(n)]
        ).astype(C.DTYPES[dt])
        assert counts == rows and np.array_equal(got, want), (dt, got, want)
    # 1 MiB per rank (many parts): each rank sends its block once, receives the others'.
    block = np.full((1 << 18,), r + 1, np.float32)
    (got, _), sent, recv = measured(lambda: C.allgather_async(block, "float32").synchronize())
    assert np.array_equal(got, np.repeat(np.arange(1, n + 1, dtype=np.float32), 1 << 18))
    within("allgather sent", sent, block.nbytes, parts_of(block.nbytes))
    within("allgather received", recv, (n - 1) * block.nbytes, (n - 1) * parts_of(block.nbytes))


def check_broadcast(r: int, n: int) -> None:
    for root in sorted({0, n - 1}):
        a = np.arange(35, dtype=np.float64).reshape(5, 7) * (r + 1)
        out = np.zeros_like(a)
        got = C.broadcast_async(a, "float64", root, out=out).synchronize()
        assert got is out and np.array_equal(out, np.arange(35.0).reshape(5, 7) * (root + 1))
    big = np.full(1 << 18, float(r), np.float32)
    got, sent, recv = measured(lambda: C.broadcast_async(big, "float32", 1).synchronize())
    assert np.all(got == 1.0), got[:4]
    k = parts_of(big.nbytes)
    if r == 1:  # the root sends once and gets nothing back but empty answers
        within("broadcast root sent", sent, big.nbytes, k)
        within("broadcast root received", recv, 0, k)
    else:
        within("broadcast receiver sent", sent, 0, k)
        within("broadcast receiver received", recv, big.nbytes, k)


def check_alltoall(r: int, n: int) -> None:
    splits = [[(i + 2 * j) % 3 for j in range(n)] for i in range(n)]  # zeros included

    def rows_from(i: int, j: int) -> np.ndarray:
        rows = [[1000 * i + 100 * j + t, -t] for t in range(splits[i][j])]
        return np.array(rows, np.int32).reshape(-1, 2)

    a = np.concatenate([rows_from(r, j) for j in range(n)]).reshape(-1, 2)
    got, received = C.alltoall_async(a, "int32", splits[r]).synchronize()
    want = np.concatenate([rows_from(i, r) for i in range(n)]).reshape(-1, 2)
    assert received == [splits[i][r] for i in range(n)], received
    assert np.array_equal(got, want), (got, want)
    # Even blocks of 256 KiB: each block crosses once; the own block stays here.
    per = 1 << 16
    big = np.repeat(np.arange(n, dtype=np.float32) + 10 * r, per)
    (got, _), sent, recv = measured(lambda: C.alltoall_async(big, "float32").synchronize())
    assert np.array_equal(got, np.repeat(np.arange(n, dtype=np.float32) * 10 + r, per))
    k = (n - 1) * parts_of(per * 4)
    within("alltoall sent", sent, (n - 1) * per * 4, k)
    within("alltoall received", recv, (n - 1) * per * 4, k)


def check_reducescatter(r: int, n: int) -> None:
    rows = 2 * n + 1  # uneven shares: the first rank gets one more row
    shares = C.reducescatter_rows(rows, n)
    begin = sum(shares[:r])
    base = np.arange(rows * 3, dtype=np.float64).reshape(rows, 3)
    total = sum(base + k for k in range(n))
    got = C.reducescatter_async((base + r).astype(np.float32), "float32", op=C.ReduceOp.SUM)
    assert np.array_equal(got.synchronize(), total[begin : begin + shares[r]].astype(np.float32))
    got = C.reducescatter_async((base + r).astype(np.int32), "int32").synchronize()  # Average
    assert np.array_equal(got, np.trunc(total / n)[begin : begin + shares[r]].astype(np.int32))
    big = np.full((n * (1 << 16), 4), r + 1, np.float32)  # 1 MiB per rank
    got, sent, recv = measured(
        lambda: C.reducescatter_async(big, "float32", op=C.ReduceOp.SUM).synchronize()
    )
    assert got.shape == (1 << 16, 4) and np.all(got == n * (n + 1) / 2), got[:2]
    within("reducescatter sent", sent, big.nbytes, n * parts_of(big.nbytes // n))
    within("reducescatter received", recv, big.nbytes // n, n * parts_of(big.nbytes // n))


def check_min_max(r: int, n: int) -> None:
    a = np.array([[r, -r, 5 - r]], np.float32).repeat(40000, axis=0)  # several parts
    lo = C.allreduce_async(a, "float32", op=C.ReduceOp.MIN).synchronize()
    hi = C.allreduce_async(a, "float32", op=C.ReduceOp.MAX).synchronize()
    assert np.all(lo[:, 0] == 0) and np.all(lo[:, 1] == -(n - 1)) and np.all(lo[:, 2] == 6 - n)
    assert np.all(hi[:, 0] == n - 1) and np.all(hi[:, 1] == 0) and np.all(hi[:, 2] == 5)
    # A scalar: each rank's row of the gathered stack is a view, not a copy.
    top = C.allreduce_async(np.array(float(r), np.float64), "float64", op=C.ReduceOp.MAX)
    assert top.synchronize() == n - 1


def check_process_set(r: int, n: int) -> None:
    """A set that leaves rank 0 out (both ranks when n == 2) routes every op on the data
    plane: only its members push, so the servers count them alone; 12 MiB per op is
    beyond what a scheduler relay would carry."""
    members = list(range(1, n)) if n > 2 else [0, 1]
    ps = C.add_process_set(members)
    if r in members:
        m, k = members.index(r), len(members)
        big = np.full(3 << 20, r + 1, np.float32)
        got = C.allreduce_async(big, "float32", op=C.ReduceOp.SUM, process_set=ps).synchronize()
        assert np.all(got == sum(x + 1 for x in members)), got[:4]
        lo = C.allreduce_async(
            np.array([r, -r], np.int64), "int64", op=C.ReduceOp.MIN, process_set=ps
        ).synchronize()
        assert lo.tolist() == [min(members), -max(members)], lo
        rows = np.full((m + 1, 2), r, np.int32)
        (got, counts), sent, _ = measured_set(
            ps, lambda: C.allgather_async(rows, "int32", process_set=ps).synchronize()
        )
        assert counts == list(range(1, k + 1)), counts
        assert np.array_equal(got[:, 0], np.repeat(members, range(1, k + 1))), got
        within("set allgather sent", sent, rows.nbytes, 1)
        b = C.broadcast_async(np.full(5, r, np.float64), "float64", members[-1], process_set=ps)
        assert np.all(b.synchronize() == members[-1])
        a2a, received = C.alltoall_async(
            np.full((k, 3), r, np.float32), "float32", process_set=ps
        ).synchronize()
        assert received == [1] * k and np.array_equal(a2a[:, 0], members), a2a
        rs = C.reducescatter_async(
            np.ones((2 * k, 2), np.float32), "float32", op=C.ReduceOp.SUM, process_set=ps
        ).synchronize()
        assert rs.shape == (2, 2) and np.all(rs == k), rs
    else:
        try:
            C.allgather_async(np.zeros(1, np.int32), "int32", process_set=ps)
        except ValueError as exc:
            assert "not a member" in str(exc), str(exc)
        else:
            raise AssertionError("a rank outside the set called its allgather")
    C.barrier()
    assert C.remove_process_set(ps)


def measured_set(ps, fn):
    C.barrier(ps)
    s0, r0 = counters()
    out = fn()
    s1, r1 = counters()
    return out, s1 - s0, r1 - r0


def check_refusals(r: int, n: int) -> None:
    """The core refuses bad routing at once (naming the tensor), and a server refuses a
    part nobody carries data for; the job goes on after both."""
    from fastps.worker.buffers import raw_buffer

    x = np.ones(16, np.float32)
    buf = raw_buffer(x, "x", writable=True)
    for kwargs, word in (
        (dict(send=False, receive=False, pushers=n), "must send its input or receive"),
        (dict(send=False, receive=True, pushers=0), "pushers > 0"),
        (dict(send=True, receive=False, pushers=n + 1), f"exceeds the job's {n} workers"),
    ):
        try:
            api.push_pull_raw(buf, buf, "refused.x", declare=False, **kwargs).synchronize()
        except (ValueError, fastps.FastPSError) as exc:
            assert "refused.x" in str(exc) and word in str(exc), (kwargs, str(exc))
        else:
            raise AssertionError(f"{kwargs} was not refused")
    # Every rank only asks for the result: the server fails that part on every rank.
    try:
        api.push_pull_raw(
            buf, buf, "nobody.sends", declare=False, send=False, receive=True, pushers=n
        ).synchronize()
    except fastps.FastPSError as exc:
        assert "none carried data" in str(exc), str(exc)
    else:
        raise AssertionError("a part with no data was not refused")
    C.barrier()
    got, _ = C.allgather_async(np.full(3, r, np.int64), "int64").synchronize()
    assert np.array_equal(got, np.repeat(np.arange(n), 3)), got


def main() -> None:
    fastps.init()
    C.start_session()
    r, n = fastps.rank(), fastps.size()
    check_allgather(r, n)
    check_broadcast(r, n)
    check_alltoall(r, n)
    check_reducescatter(r, n)
    check_min_max(r, n)
    check_process_set(r, n)
    if len(sys.argv) > 1 and sys.argv[1] == "refusals":
        check_refusals(r, n)
    stats = api.data_path_stats()
    assert stats["pushed_routed"] > 0, stats
    print(f"rank {r} OK routed", flush=True)
    print("STATS " + json.dumps(stats), flush=True)
    C.end_session()
    fastps.shutdown()


if __name__ == "__main__":
    main()
