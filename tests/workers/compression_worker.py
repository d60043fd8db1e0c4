"""Checks gradient compression end to end (docs/guide/compression.md), run by
tests/integration/test_compression.py as N workers against real servers. Modes:

* ``sum``: every codec × dtype, tensors cut into several parts over the servers. For the
  deterministic codecs (fp16, bf16, onebit, top-k) each part of the result must equal
  the reference decompress(compress(Σ_r decompress(compress(x_r)))) computed here with
  the core's codecs on the same parts; random-k must return the exact sum on at most k
  indices per part, and dithering the sum within the rounding steps of both directions.
* ``wire``: the bytes each codec puts on this worker's sockets, against uncompressed.
* ``ef``: a fixed sequence of gradients with a common drift; with error feedback the
  accumulated result converges to the accumulated true sum (the relative error shrinks
  and ends small after 150 rounds) while top-k without it loses most of it.
* ``momentum``: top-k with momentum correction (Lin et al. 2018) over a fixed sequence
  equals a numpy reference of both ends round by round: each worker's velocity
  u = m u + x accumulated into its residual, the top k of that sent, both masked where
  sent; the server's sum with error feedback, its top k answered.
* ``warmup``: random-k with error feedback and a sparsity warm-up (Deep Gradient
  Compression's): round by round the answer holds exactly the k the stage keeps
  (k^((s+1)/5) of the part for stage s, then k) and equals a numpy reference of the
  workers' residuals at the round's indices (drawn from the core's seed), round by round.
* ``mismatch_server``: two workers push one tensor with different compressors past the
  scheduler's check (declare=False): the servers fail that op on both, naming both
  settings, and the next op works.
* ``mismatch_declared``: the same through the ordinary API: the scheduler's declaration
  check aborts the job naming both settings.

Prints ``rank R OK <mode>``."""

from __future__ import annotations

import sys
import time

import fastps
import numpy as np
from fastps import _core
from fastps.errors import FastPSAbort, FastPSError
from fastps.worker import api
from fastps.worker.buffers import raw_buffer
from fastps.worker.compression import Compression

DETERMINISTIC = {
    "fp16": Compression.fp16,
    "bf16": Compression.bf16,
    "onebit": Compression.onebit,
    "topk": Compression.topk(0.05),
}


def codec(spec: str, x: np.ndarray) -> np.ndarray:
    """decompress(compress(x)) with the core's codec, float32."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    data = _core.compress(spec, x.ctypes.data, x.size, 0)
    out = np.empty_like(x)
    _core.decompress(data, x.size, out.ctypes.data)
    return out


def codec_seeded(spec: str, x: np.ndarray, seed: int) -> np.ndarray:
    """decompress(compress(x)) with the core's codec and a given seed, float32."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    data = _core.compress(spec, x.ctypes.data, x.size, seed)
    out = np.empty_like(x)
    _core.decompress(data, x.size, out.ctypes.data)
    return out


def as_dtype(x: np.ndarray, dt: str) -> np.ndarray:
    return x.astype(
        np.float16 if dt == "float16" else np.float64 if dt == "float64" else np.float32
    )


def inputs(rank: int, n: int, dt: str, salt: int) -> np.ndarray:
    rng = np.random.default_rng(1000 * salt + rank)
    return as_dtype(rng.standard_normal(n).astype(np.float32) * (rank + 1), dt)


def layout(name: str, x: np.ndarray):
    return api._st().worker.part_layout(name, x.nbytes, x.itemsize)


def check_sum(rank: int, size: int) -> None:
    n = 50_000  # several 64 KiB parts over the servers
    salt = 0
    for dt in ("float32", "float16", "float64"):
        for label, comp in DETERMINISTIC.items():
            salt += 1
            name = f"sum.{label}.{dt}"
            x = inputs(rank, n, dt, salt)
            got = fastps.push_pull(x, average=False, name=name, compression=comp)
            assert got.dtype == x.dtype
            want = np.empty(n, dtype=np.float32)
            xs = [inputs(r, n, dt, salt).astype(np.float32) for r in range(size)]
            for off, nbytes, _server in layout(name, x):
                lo, hi = off // x.itemsize, (off + nbytes) // x.itemsize
                total = sum(codec(comp.spec, xr[lo:hi]) for xr in xs)
                want[lo:hi] = codec(comp.spec, total)
            want_dt = as_dtype(want, dt).astype(np.float64)
            # Only the last rounding to the tensor's dtype (done after the average) and
            # float32 summation order may differ.
            tol = 1e-2 if dt == "float16" else 1e-5
            err = np.max(np.abs(got.astype(np.float64) - want_dt) / (1 + np.abs(want_dt)))
            assert err <= tol, f"{name}: result differs from the reference by {err}"
            # Averaging scales the decoded sum.
            avg = fastps.push_pull(x, average=True, name=name, compression=comp)
            assert np.allclose(avg.astype(np.float64), want_dt / size, rtol=1e-2, atol=1e-2), name

    # random-k: the same indices on every worker, so the exact sum at k per part.
    x = inputs(rank, n, "float32", 99)
    total = sum(inputs(r, n, "float32", 99) for r in range(size))
    name = "sum.randomk"
    got = fastps.push_pull(x, average=False, name=name, compression=Compression.randomk(0.1))
    for off, nbytes, _server in layout(name, x):
        lo, hi = off // 4, (off + nbytes) // 4
        part, ref = got[lo:hi], total[lo:hi]
        nz = np.nonzero(part)[0]
        k = int(np.ceil(0.1 * (hi - lo)))
        assert 0 < len(nz) <= k, f"randomk part {lo}: {len(nz)} values, k = {k}"
        assert np.allclose(part[nz], ref[nz], rtol=1e-5, atol=1e-5), "randomk values"

    # dithering: unbiased rounding to levels of the max; each direction is off by at most
    # one step per value.
    levels = 16
    name = "sum.dithering"
    got = fastps.push_pull(x, average=False, name=name, compression=Compression.dithering(levels))
    xs = [inputs(r, n, "float32", 99) for r in range(size)]
    for off, nbytes, _server in layout(name, x):
        lo, hi = off // 4, (off + nbytes) // 4
        steps = sum(np.abs(xr[lo:hi]).max() / levels for xr in xs)
        server_step = (np.abs(total[lo:hi]).max() + steps) / levels
        err = np.abs(got[lo:hi] - total[lo:hi]).max()
        assert err <= steps + server_step + 1e-4, f"dithering part {lo}: error {err}"
        # and not the identity: values sit on the server's grid
        assert len(np.unique(np.round(got[lo:hi] / server_step))) <= 2 * levels + 1


def wire_bytes(x: np.ndarray, name: str, comp) -> int:
    """Bytes this worker sent on its sockets for one push_pull of x."""
    fastps.barrier()
    before = api.data_path_stats()["socket_bytes_sent"]
    fastps.push_pull(x, name=name, compression=comp)
    time.sleep(0.05)  # the writer adds its bytes just after the write returns
    return api.data_path_stats()["socket_bytes_sent"] - before


def check_wire(rank: int, size: int) -> None:
    """The bytes really shrink on the wire by each codec's ratio (headers aside)."""
    x = np.random.default_rng(rank).standard_normal(1 << 20).astype(np.float32)
    plain = wire_bytes(x, "wire.none", None)
    assert plain >= x.nbytes, plain
    for label, comp, ratio in (
        ("fp16", Compression.fp16, 2),
        ("onebit", Compression.onebit, 32),
        ("topk", Compression.topk(0.01), 12),
        ("randomk", Compression.randomk(0.01), 25),
        ("dithering", Compression.dithering(16), 4),
    ):
        sent = wire_bytes(x, f"wire.{label}", comp)
        print(f"rank {rank} wire {label}: {sent} bytes vs {plain}", flush=True)
        assert sent < plain / ratio * 1.1 + 64 * 64, f"{label}: {sent} bytes vs {plain}"


def check_ef(rank: int, size: int) -> None:
    n, rounds = 20_000, 150
    rng = np.random.default_rng(7)
    drift = rng.standard_normal(n).astype(np.float32)
    # Error feedback leaves only the current residuals out of the accumulated sum, so the
    # relative error falls like 1/rounds (it must at least shrink from half-way to the end).
    for label, comp, ef_tol in (
        ("topk", Compression.topk(0.1, error_feedback=True), 0.05),
        ("randomk", Compression.randomk(0.1, error_feedback=True), 0.12),
        ("onebit", Compression.onebit(error_feedback=True), 0.1),
        ("dithering", Compression.dithering(4, error_feedback=True), 0.02),
        ("topk-noef", Compression.topk(0.1), None),
    ):
        acc = np.zeros(n, dtype=np.float64)
        true = np.zeros(n, dtype=np.float64)
        half = 0.0
        for t in range(rounds):
            g = [
                drift + np.random.default_rng(t * 100 + r).standard_normal(n).astype(np.float32)
                for r in range(size)
            ]
            out = fastps.push_pull(g[rank], average=False, name=f"ef.{label}", compression=comp)
            acc += out
            true += sum(gi.astype(np.float64) for gi in g)
            if t == rounds // 2 - 1:
                half = np.linalg.norm(acc - true) / np.linalg.norm(true)
        rel = np.linalg.norm(acc - true) / np.linalg.norm(true)
        print(
            f"rank {rank} ef {label}: relative error {half:.4f} after {rounds // 2} rounds, "
            f"{rel:.4f} after {rounds}",
            flush=True,
        )
        if ef_tol is not None:
            assert rel < ef_tol and rel < 0.8 * half, f"{label} with error feedback: {half}, {rel}"
        else:
            assert rel > 0.5, f"top-k without error feedback kept too much ({rel})"


def topk_sent(spec: str, v: np.ndarray):
    """(decoded values, sent indices) of the core's top-k of v."""
    data = _core.compress(spec, v.ctypes.data, v.size, 0)
    out = np.empty_like(v)
    _core.decompress(data, v.size, out.ctypes.data)
    k = (len(data) - 24) // 8
    return out, np.frombuffer(data[24 : 24 + 4 * k], dtype=np.uint32)


def check_momentum(rank: int, size: int) -> None:
    n, rounds, m = 10_000, 12, np.float32(0.9)  # one part (FASTPS_PARTITION_BYTES=64K)
    comp = Compression.topk(0.05, error_feedback=True, momentum=0.9)
    assert comp.spec == "topk:0.05:ef:momentum=0.9", comp.spec
    u = [np.zeros(n, np.float32) for _ in range(size)]
    v = [np.zeros(n, np.float32) for _ in range(size)]
    server = np.zeros(n, np.float32)
    for t in range(rounds):
        xs = [
            np.random.default_rng(50 * t + r).standard_normal(n).astype(np.float32)
            for r in range(size)
        ]
        total = np.zeros(n, np.float32)
        for r in range(size):
            u[r] = m * u[r] + xs[r]
            v[r] = v[r] + u[r]
            sent, idx = topk_sent("topk:0.05", v[r])
            v[r][idx] = 0
            u[r][idx] = 0  # momentum factor masking
            total = total + sent
        server = server + total
        want, idx = topk_sent("topk:0.05", server)
        server[idx] = 0
        got = fastps.push_pull(xs[rank], average=False, name="momentum", compression=comp)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=f"round {t}")


MASK = (1 << 64) - 1


def random_at(seed: int, i: int) -> int:
    """The core's counter-based stream (compression/compressor.cc): splitmix64."""
    z = (seed + (i + 1) * 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def check_warmup(rank: int, size: int) -> None:
    n, frac, warmup, rounds = 10_000, 0.01, 8, 12  # one part (FASTPS_PARTITION_BYTES=64K)
    comp = Compression.randomk(frac, error_feedback=True, warmup=warmup)
    assert comp.spec == "randomk:0.01:ef:warmup=8", comp.spec
    assert Compression.from_spec(comp.spec).spec == comp.spec  # type: ignore[union-attr]
    ones = np.ones(n, dtype=np.float32)
    residual = [np.zeros(n, np.float32) for _ in range(size)]
    for t in range(rounds):
        # DGC's 4 stages of warmup / 4 rounds each: the kept fraction falls as frac^((s+1)/5).
        kept = np.float32(frac ** ((t * 4 // warmup + 1) / 5)) if t < warmup else np.float32(frac)
        # The round's indices, as every worker draws them (part 0's key is the tensor id).
        seed = random_at(_core.tensor_id("warmup"), t)
        idx = np.flatnonzero(codec_seeded(f"randomk:{kept}", ones, seed))
        want_k = {0: 3982, 2: 1585, 4: 631, 6: 252, 8: 100}.get(t)
        assert want_k is None or len(idx) == want_k, f"round {t}: k = {len(idx)}, want {want_k}"
        xs = [
            np.random.default_rng(70 * t + r).standard_normal(n).astype(np.float32)
            for r in range(size)
        ]
        want = np.zeros(n, np.float32)
        for r in range(size):  # each worker sends residual + x at the indices, keeps the rest
            e = residual[r] + xs[r]
            want[idx] += e[idx]
            e[idx] = 0
            residual[r] = e
        got = fastps.push_pull(xs[rank], average=False, name="warmup", compression=comp)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=f"round {t}")


def check_mismatch_server(rank: int, size: int) -> None:
    x = np.ones(30_000, dtype=np.float32)
    comp = Compression.topk(0.01) if rank == 0 else Compression.onebit(error_feedback=True)
    buf = raw_buffer(x, "x")
    out = np.empty_like(x)
    h = api.push_pull_raw(
        buf, raw_buffer(out, "out", writable=True), "mm", declare=False, out=out, compression=comp
    )
    try:
        h.synchronize()
    except FastPSError as exc:
        msg = str(exc)
        assert "topk:0.01" in msg and "onebit:ef" in msg and "mm" in msg, msg
    else:
        raise AssertionError("a compression mismatch went through")
    # The job goes on.
    y = fastps.push_pull(np.full(10, rank + 1.0, dtype=np.float32), average=False, name="after")
    assert np.allclose(y, size * (size + 1) / 2), y


def check_mismatch_declared(rank: int, size: int) -> None:
    comp = Compression.topk(0.01) if rank == 0 else Compression.fp16
    try:
        fastps.push_pull(np.ones(1000, dtype=np.float32), name="declared", compression=comp)
    except FastPSAbort as exc:
        msg = str(exc)
        assert "compression mismatch" in msg and "topk:0.01" in msg and "fp16" in msg, msg
        return
    raise AssertionError("a compression mismatch went through")


def main() -> None:
    mode = sys.argv[1]
    fastps.init()
    rank, size = fastps.rank(), fastps.size()
    {
        "sum": check_sum,
        "ef": check_ef,
        "momentum": check_momentum,
        "warmup": check_warmup,
        "mismatch_server": check_mismatch_server,
        "mismatch_declared": check_mismatch_declared,
        "wire": check_wire,
    }[mode](rank, size)
    print(f"rank {rank} OK {mode}", flush=True)
    if mode != "mismatch_declared":
        fastps.shutdown()


if __name__ == "__main__":
    main()
