"""Outer rounds (local SGD / DiLoCo, docs/guide/local-sgd.md "Composition") under quorum rounds
and with compressed deltas, with real servers; every worker checks its parameters after
every round against a float64 numpy reference of what the servers should compute.

- ``quorum``: 3 workers, FASTPS_ROUND_QUORUM=2. Round 0: every worker pushes the same delta
  (so the round's mean is the same whichever two count). Rounds 1-3: worker 2 sleeps first;
  each round closes with workers 0 and 1 (the mean of their two deltas), and worker 2's late
  deltas are dropped and answered with those rounds' parameters. Round 4: worker 0 sleeps;
  it closes with workers 1 and 2. The fast workers must not have waited for the sleeper.
- ``fp16`` / ``onebit``: 3 workers, deltas compressed; the reference applies the codec's
  quantisation (fp16: numpy's float16 rounding; onebit with error feedback: the core's codec
  on each part, the residual kept as the worker keeps it). The bytes the worker's sockets
  sent per step against the uncompressed step of the same parameters.

This file is also the worker: ``python test_outer_rounds.py worker MODE``.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from typing import Any, Dict, List, Tuple

import numpy as np

N, SERVERS, ROUNDS = 3, 2, 5
ELEMS = 50000  # float64: 400 KB, sliced over both servers in 64 KiB parts
SMALL = 3000  # float32: 12 KB, one part
LR, MOMENTUM = 0.7, 0.9
DELAY = 1.5  # seconds the straggler sleeps


def delta_of(rank: int, rnd: int, n: int, dtype: Any, same: bool = False) -> np.ndarray:
    """Worker ``rank``'s delta in outer round ``rnd`` (``same``: one for every rank, in
    multiples of 2^-12, so that a mean over 2 or 3 copies is exact)."""
    idx = np.arange(n, dtype=np.float64)
    if same:
        return (np.round(np.cos(idx * 0.01) * 256) / 4096).astype(dtype)
    # |delta| >= 0.005: no float16 subnormals in the fp16 reference.
    return ((rank + 1) * 0.01 * (rnd + 1) * (1.5 + np.cos(idx * 0.001 + rank))).astype(dtype)


def start_value(n: int, dtype: Any) -> np.ndarray:
    return (np.linspace(-1.0, 1.0, n) + 0.5).astype(dtype)


class Reference:
    """The servers' outer step in float64: Nesterov momentum (or plain averaging)."""

    def __init__(self, start: np.ndarray, lr: float, momentum: float) -> None:
        self.p = start.astype(np.float64)
        self.m = np.zeros_like(self.p)
        self.lr, self.mu = lr, momentum

    def step(self, deltas: List[np.ndarray]) -> None:
        acc = np.zeros_like(self.p)
        for d in deltas:
            acc = acc + d.astype(np.float64)
        g = -(acc / len(deltas))
        if self.mu:
            self.m = self.mu * self.m + g
            self.p = self.p - self.lr * (g + self.mu * self.m)
        else:
            self.p = self.p - self.lr * g


# ---------------------------------------------------------------- the worker


def quorum_worker() -> None:
    import fastps
    from fastps.worker.outer_mode import OuterConfig, OuterExchange

    fastps.init()
    rank = fastps.rank()
    dilo = OuterExchange("test diloco", OuterConfig(LR, MOMENTUM, True))
    avg = OuterExchange("test averaging", OuterConfig(1.0, 0.0, False))
    w = start_value(ELEMS, np.float64) if rank == 0 else np.zeros(ELEMS)
    v = start_value(SMALL, np.float32) if rank == 0 else np.zeros(SMALL, np.float32)
    dilo.init([("w", w)])
    avg.init([("v", v)])
    # Every init answered before any delta: under a quorum, round 0 may close with two
    # deltas before a slow worker's init is in, and that worker then starts at round 1
    # (its init is answered with the parameters after round 0), not at this loop's round 0.
    fastps.barrier()
    ref_w = Reference(start_value(ELEMS, np.float64), LR, MOMENTUM)
    ref_v = Reference(start_value(SMALL, np.float32), 1.0, 0.0)
    # Who sleeps before pushing, and whose deltas the servers count, per round.
    sleeper = {1: 2, 4: 0}
    counted = {1: (0, 1), 2: (0, 1), 3: (0, 1), 4: (1, 2)}
    fast_time = 0.0
    for rnd in range(ROUNDS):
        if rnd == 4:
            fastps.barrier()  # everyone caught up: worker 2 counts again
        same = rnd == 0
        if sleeper.get(rnd) == rank:
            time.sleep(DELAY)
        t0 = time.monotonic()
        dilo.step([("w", delta_of(rank, rnd, ELEMS, np.float64, same), w)])
        avg.step([("v", delta_of(rank, rnd, SMALL, np.float32, same), v)])
        if rank != 2 and rnd in (1, 2, 3):
            fast_time += time.monotonic() - t0
        ranks = counted.get(rnd, (0, 1, 2))
        ref_w.step([delta_of(r, rnd, ELEMS, np.float64, same) for r in ranks])
        ref_v.step([delta_of(r, rnd, SMALL, np.float32, same) for r in ranks])
        np.testing.assert_allclose(w, ref_w.p, rtol=1e-12, atol=1e-14, err_msg=f"round {rnd}")
        np.testing.assert_array_equal(v, ref_v.p.astype(np.float32), err_msg=f"round {rnd}")
        if rnd in counted:
            # The mean over all three would be far off: the rule really dropped one.
            wrong = (
                ref_v.p
                - np.mean([delta_of(r, rnd, SMALL, np.float64) for r in ranks], axis=0)
                + np.mean([delta_of(r, rnd, SMALL, np.float64) for r in range(3)], axis=0)
            )
            assert float(np.abs(wrong - v).max()) > 1e-3, f"round {rnd}: counted every delta"
        print(f"ROUND {rnd} OK", flush=True)
    if rank != 2:
        # Rounds 1-3 closed without the sleeper: the fast workers did not wait for it.
        assert fast_time < DELAY / 2, f"the fast workers waited {fast_time:.2f} s"
        print(f"FAST {fast_time:.3f}", flush=True)
    fastps.barrier()
    back = np.zeros(ELEMS)
    dilo.read([("w", back)])
    assert np.array_equal(back, w), "a read differs from the last answer"
    print("DIGEST " + hashlib.sha256(w.tobytes() + v.tobytes()).hexdigest(), flush=True)
    fastps.barrier()
    print(f"rank {rank} OK outer", flush=True)
    fastps.shutdown()


def _onebit_ef(
    x: np.ndarray, slices: List[Tuple[int, int]], res: Dict[int, np.ndarray]
) -> np.ndarray:
    """What the servers decode of one worker's onebit delta with error feedback: per part
    (element ranges ``slices``), c = residual + x in float32, sent as the core's onebit
    code of c, the residual left is c minus what was sent."""
    from fastps import _core

    out = np.zeros(x.size, dtype=np.float64)
    for i, (lo, hi) in enumerate(slices):
        c = res.get(i, np.zeros(hi - lo, np.float32)) + x[lo:hi].astype(np.float32)
        c = np.ascontiguousarray(c, dtype=np.float32)
        q = np.zeros_like(c)
        _core.decompress(_core.compress("onebit", c.ctypes.data, c.size), c.size, q.ctypes.data)
        res[i] = c - q
        out[lo:hi] = q
    return out


def compressed_worker(codec: str) -> None:
    import fastps
    from fastps.worker import api
    from fastps.worker.outer_mode import OuterConfig, OuterExchange

    fastps.init()
    rank, n = fastps.rank(), fastps.size()
    comp = (
        fastps.Compression.fp16
        if codec == "fp16"
        else fastps.Compression.onebit(error_feedback=True)
    )
    dilo = OuterExchange("test diloco", OuterConfig(LR, MOMENTUM, True), compression=comp)
    avg = OuterExchange("test averaging", OuterConfig(1.0, 0.0, False), compression=comp)
    plain = OuterExchange("test plain", OuterConfig(1.0, 0.0, False))
    w = start_value(ELEMS, np.float64) if rank == 0 else np.zeros(ELEMS)
    v = start_value(SMALL, np.float32) if rank == 0 else np.zeros(SMALL, np.float32)
    u = start_value(ELEMS, np.float32) if rank == 0 else np.zeros(ELEMS, np.float32)
    dilo.init([("w", w)])
    avg.init([("v", v)])
    plain.init([("u", u)])
    ref_w = Reference(start_value(ELEMS, np.float64), LR, MOMENTUM)
    ref_v = Reference(start_value(SMALL, np.float32), 1.0, 0.0)

    def element_slices(ex: OuterExchange, name: str) -> List[Tuple[int, int]]:
        f = ex._frames[name]
        return [(lo // f.dtype.itemsize, hi // f.dtype.itemsize) for _i, _d, lo, hi in f.slices]

    sw, sv = element_slices(dilo, "w"), element_slices(avg, "v")
    res: Dict[Tuple[int, str], Dict[int, np.ndarray]] = {}

    def quantised(r: int, name: str, x: np.ndarray, slices: List[Tuple[int, int]]) -> np.ndarray:
        if codec == "fp16":
            return x.astype(np.float32).astype(np.float16).astype(np.float64)
        return _onebit_ef(x, slices, res.setdefault((r, name), {}))

    stats = api.session().worker.stats
    sent_compressed = sent_plain = 0
    for rnd in range(ROUNDS):
        fastps.barrier()
        before = stats()["socket_bytes_sent"]
        dilo.step([("w", delta_of(rank, rnd, ELEMS, np.float64), w)])
        middle = stats()["socket_bytes_sent"]
        plain.step([("u", delta_of(rank, rnd, ELEMS, np.float32), u)])
        sent_compressed += middle - before
        sent_plain += stats()["socket_bytes_sent"] - middle
        avg.step([("v", delta_of(rank, rnd, SMALL, np.float32), v)])
        ref_w.step([quantised(r, "w", delta_of(r, rnd, ELEMS, np.float64), sw) for r in range(n)])
        ref_v.step([quantised(r, "v", delta_of(r, rnd, SMALL, np.float32), sv) for r in range(n)])
        np.testing.assert_allclose(w, ref_w.p, rtol=1e-12, atol=1e-14, err_msg=f"round {rnd}")
        np.testing.assert_allclose(
            v, ref_v.p.astype(np.float32), rtol=1e-6, atol=1e-7, err_msg=f"round {rnd}"
        )
        if codec == "fp16":  # exact to the fp16 rounding
            np.testing.assert_array_equal(v, ref_v.p.astype(np.float32), err_msg=f"round {rnd}")
        print(f"ROUND {rnd} OK", flush=True)
    # The float64 parameter's delta against an uncompressed float32 one of as many values:
    # fp16 sends 2 bytes per value against 4, onebit 1 bit.
    expected = plain.delta_bytes() / dilo.delta_bytes()
    measured = sent_plain / sent_compressed
    print(
        f"BYTES {codec} plain {sent_plain} compressed {sent_compressed} ratio {measured:.2f} "
        f"expected {expected:.2f}",
        flush=True,
    )
    # Frame headers are not in delta_bytes: a few percent of the small onebit parts.
    assert abs(measured / expected - 1) < 0.1, (measured, expected)
    assert measured > (1.9 if codec == "fp16" else 20), measured
    fastps.barrier()
    print("DIGEST " + hashlib.sha256(w.tobytes() + v.tobytes()).hexdigest(), flush=True)
    fastps.barrier()
    print(f"rank {rank} OK outer", flush=True)
    fastps.shutdown()


# ---------------------------------------------------------------- the tests

if __name__ != "__main__":
    import pytest
    from jobs import DATA_PATHS, Job

    def run_job(path: str, mode: str, env: Dict[str, str]) -> List[str]:
        shm, worker_hosts, server_hosts = DATA_PATHS[path](N, SERVERS)
        full = {"FASTPS_SHM": shm, "FASTPS_PARTITION_BYTES": "64K", "FASTPS_OP_TIMEOUT": "60"}
        full.update(env)
        argv = [os.path.abspath(__file__), "worker", mode]
        with Job(
            N, SERVERS, argv, worker_hosts=worker_hosts, server_hosts=server_hosts, env=full
        ) as job:
            job.wait(120, job.workers())
            outputs = []
            for wk in job.workers():
                assert wk.popen.returncode == 0, job.dump()
                assert f"rank {wk.index} OK outer" in wk.output, job.dump()
                outputs.append(wk.output)
            job.wait(30)
        for out in outputs:
            assert sum(line.startswith("ROUND ") for line in out.splitlines()) == ROUNDS, out
        digests = {
            line.split()[1]
            for out in outputs
            for line in out.splitlines()
            if line.startswith("DIGEST ")
        }
        assert len(digests) == 1, "workers hold different parameters"
        return outputs

    @pytest.mark.parametrize("path", ["tcp", "shm"])
    def test_quorum_outer_rounds_match_the_mean_of_the_deltas_in(path: str) -> None:
        outputs = run_job(path, "quorum", {"FASTPS_ROUND_QUORUM": "2"})
        assert sum("FAST " in out for out in outputs) == 2
        print([line for out in outputs for line in out.splitlines() if "FAST" in line])

    @pytest.mark.parametrize("path,codec", [("tcp", "fp16"), ("tcp", "onebit"), ("shm", "fp16")])
    def test_compressed_deltas_match_the_quantised_reference(path: str, codec: str) -> None:
        outputs = run_job(path, codec, {})
        lines = [line for out in outputs for line in out.splitlines() if "BYTES" in line]
        assert len(lines) == N, outputs
        print(lines)


if __name__ == "__main__" and sys.argv[1:2] == ["worker"]:
    if sys.argv[2] == "quorum":
        quorum_worker()
    else:
        compressed_worker(sys.argv[2])
