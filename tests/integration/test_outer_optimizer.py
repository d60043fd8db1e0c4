"""The servers' outer optimizer (local SGD / DiLoCo, docs/guide/local-sgd.md) with real
servers: n workers push known deltas for several rounds, and every answer equals a float64
reference of the outer step computed here (Nesterov momentum for a float64 parameter cut
into parts over both servers, plain averaging for a float32 one); every worker gets the
same parameters and a read returns them; bad settings and out-of-step pushes are refused
naming the culprit. Over TCP and with shared memory on.

This file is also the worker: ``python test_outer_optimizer.py worker ROUNDS [refusals]``.
"""

from __future__ import annotations

import hashlib
import math
import os
import sys
from typing import Any, List

import numpy as np

N, SERVERS, ROUNDS = 3, 2, 4
ELEMS = 50000  # float64: 400 KB, sliced over both servers in 64 KiB parts
SMALL = 300  # float32: one part
LR, MOMENTUM = 0.7, 0.9


def delta_of(rank: int, rnd: int, n: int, dtype: Any) -> np.ndarray:
    """Worker ``rank``'s delta in outer round ``rnd``: known to every worker."""
    idx = np.arange(n, dtype=np.float64)
    return ((rank + 1) * 0.01 * (rnd + 1) * np.cos(idx * 0.001 + rank)).astype(dtype)


def start_value(n: int, dtype: Any) -> np.ndarray:
    return (np.linspace(-1.0, 1.0, n) + 0.5).astype(dtype)


# ---------------------------------------------------------------- the worker


def worker(rounds: int, refusals: bool) -> None:
    import fastps
    from fastps.worker import api
    from fastps.worker.async_mode import MODE_UPDATE
    from fastps.worker.buffers import raw_buffer
    from fastps.worker.outer_mode import OuterConfig, OuterExchange

    fastps.init()
    rank, n = fastps.rank(), fastps.size()
    dilo = OuterExchange("test diloco", OuterConfig(LR, MOMENTUM, True))
    avg = OuterExchange("test averaging", OuterConfig(1.0, 0.0, False))
    w = start_value(ELEMS, np.float64) if rank == 0 else np.zeros(ELEMS)
    v = start_value(SMALL, np.float32) if rank == 0 else np.zeros(SMALL, np.float32)
    dilo.init([("w", w)])
    avg.init([("v", v)])
    assert np.array_equal(w, start_value(ELEMS, np.float64)), (rank, w[:4])
    assert np.array_equal(v, start_value(SMALL, np.float32)), (rank, v[:4])

    # float64 references, computed here without the core.
    theta = start_value(ELEMS, np.float64)
    mom = np.zeros(ELEMS)
    master = start_value(SMALL, np.float32).astype(np.float64)
    for rnd in range(rounds):
        dw = delta_of(rank, rnd, ELEMS, np.float64)
        dv = delta_of(rank, rnd, SMALL, np.float32)
        dilo.step([("w", dw, w)])
        avg.step([("v", dv, v)])
        mean = np.mean([delta_of(r, rnd, ELEMS, np.float64) for r in range(n)], axis=0)
        g = -mean
        mom = MOMENTUM * mom + g
        theta = theta - LR * (g + MOMENTUM * mom)
        np.testing.assert_allclose(w, theta, rtol=1e-12, atol=1e-14, err_msg=f"round {rnd}")
        master = master + np.mean(
            [delta_of(r, rnd, SMALL, np.float32).astype(np.float64) for r in range(n)], axis=0
        )
        np.testing.assert_allclose(v, master.astype(np.float32), rtol=1e-6, atol=1e-7)
        assert dilo.round == avg.round == rnd + 1
        print(f"ROUND {rnd} OK max err {float(np.abs(w - theta).max()):.3g}", flush=True)
    # The momentum moved the parameters beyond plain averaging: the rule was not a sum.
    plain = start_value(ELEMS, np.float64) + sum(
        np.mean([delta_of(r, k, ELEMS, np.float64) for r in range(n)], axis=0)
        for k in range(rounds)
    )
    assert float(np.abs(w - plain).max()) > 1e-3, "outer momentum had no effect"
    fastps.barrier()
    back = np.zeros(ELEMS)
    dilo.read([("w", back)])
    assert np.array_equal(back, w), "a read differs from the last answer"
    print("DIGEST " + hashlib.sha256(w.tobytes() + v.tobytes()).hexdigest(), flush=True)

    if refusals:
        errors: List[str] = []
        # Out of step: every rank pushes round 5 while the server is in round 0.
        bad = OuterExchange("test out of step", OuterConfig(1.0, 0.0, False))
        x = np.ones(64) if rank == 0 else np.zeros(64)
        bad.init([("x", x)])
        bad.round = 5
        try:
            bad.step([("x", np.zeros(64), x)])
        except fastps.FastPSError as exc:
            errors.append(str(exc))
            assert "outer round 5" in str(exc) and "in round 0" in str(exc), exc
            assert f"worker {rank}" in str(exc), exc
        else:
            raise AssertionError("a delta of the wrong outer round was accepted")

        # A NaN outer learning rate that got past the Python checks: the servers refuse
        # rank 0's init, and the other workers' inits waiting for it, by name.
        class Raw:
            lr, momentum, nesterov = math.nan, 0.9, True

        nan = OuterExchange("test nan", Raw())  # type: ignore[arg-type]
        y = np.ones(64)
        try:
            nan.init([("y", y)])
        except fastps.FastPSError as exc:
            errors.append(str(exc))
            assert "outer learning rate nan" in str(exc), exc
        else:
            raise AssertionError("an init with a NaN outer learning rate was accepted")

        # A plain async update of an outer part (no delta header). A tensor of its own: the
        # worker core keeps a tensor's failure for its later ops.
        plain = OuterExchange("test plain update", OuterConfig(1.0, 0.0, False))
        q = np.ones(64)
        plain.init([("q", q)])
        z = np.zeros_like(plain._frames["q"].buf)  # the framed size, but no header
        try:
            src = raw_buffer(z, "z")
            api.push_pull_raw(src, src, "outer.q", mode=MODE_UPDATE).synchronize()
        except fastps.FastPSError as exc:
            errors.append(str(exc))
            assert "carries no outer delta header" in str(exc), exc
        else:
            raise AssertionError("a plain update of an outer part was accepted")
        print(f"REFUSED {len(errors)}", flush=True)
    fastps.barrier()
    print(f"rank {rank} OK outer", flush=True)
    fastps.shutdown()


# ---------------------------------------------------------------- the tests

if __name__ != "__main__":
    import pytest
    from jobs import DATA_PATHS, Job

    def run_job(path: str, *extra: str) -> List[str]:
        shm, worker_hosts, server_hosts = DATA_PATHS[path](N, SERVERS)
        env = {"FASTPS_SHM": shm, "FASTPS_PARTITION_BYTES": "64K", "FASTPS_OP_TIMEOUT": "60"}
        argv = [os.path.abspath(__file__), "worker", str(ROUNDS), *extra]
        with Job(
            N, SERVERS, argv, worker_hosts=worker_hosts, server_hosts=server_hosts, env=env
        ) as job:
            job.wait(240, job.workers())
            outputs = []
            for wk in job.workers():
                assert wk.popen.returncode == 0, job.dump()
                assert f"rank {wk.index} OK outer" in wk.output, job.dump()
                outputs.append(wk.output)
            job.wait(30)
        return outputs

    def digests(outputs: List[str]) -> set:
        return {
            line.split()[1]
            for out in outputs
            for line in out.splitlines()
            if line.startswith("DIGEST ")
        }

    @pytest.mark.parametrize("path", ["tcp", "shm"])
    def test_outer_steps_match_a_float64_reference(path: str) -> None:
        outputs = run_job(path)
        for out in outputs:
            assert sum(line.startswith("ROUND ") for line in out.splitlines()) == ROUNDS, out
        assert len(digests(outputs)) == 1, "workers hold different parameters"

    def test_out_of_step_and_bad_settings_are_refused_by_name() -> None:
        outputs = run_job("tcp", "refusals")
        for out in outputs:
            assert "REFUSED 3" in out, out

    def test_python_checks_name_the_setting() -> None:
        from fastps.worker.outer_mode import OuterConfig

        with pytest.raises(ValueError, match="outer learning rate nan"):
            OuterConfig(math.nan, 0.9, True)
        with pytest.raises(ValueError, match="outer learning rate -1"):
            OuterConfig(-1.0, 0.0, False)
        with pytest.raises(ValueError, match=r"outer momentum 1 is not in \[0, 1\)"):
            OuterConfig(0.7, 1.0, True)
        with pytest.raises(TypeError, match="nesterov"):
            OuterConfig(0.7, 0.9, 1)  # type: ignore[arg-type]

    def test_core_rule_matches_the_reference() -> None:
        from fastps import _core

        opt = _core.OuterOptimizer(LR, MOMENTUM, True)
        p = start_value(1000, np.float64)
        ref, mom = p.copy(), np.zeros(1000)
        for rnd in range(3):
            d = delta_of(0, rnd, 1000, np.float64)
            opt.step(p.ctypes.data, d.ctypes.data, p.size)
            mom = MOMENTUM * mom - d
            ref = ref - LR * (-d + MOMENTUM * mom)
            np.testing.assert_allclose(p, ref, rtol=1e-14, atol=1e-15)
        assert opt.steps() == 3


if __name__ == "__main__" and sys.argv[1:2] == ["worker"]:
    worker(int(sys.argv[2]), "refusals" in sys.argv[3:])
