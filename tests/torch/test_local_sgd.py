"""Local SGD and DiLoCo in torch (plugins/torch/algorithms/local_sgd.py, docs/guide/local-sgd.md):
the digits task on 2 workers trained with ``LocalSGD(H=4)`` and ``DiLoCo(H=4)`` /
``DiLoCo(H=8)`` ends close to synchronous training's accuracy while the bytes the workers
send during training (the core's socket byte counters, shared memory off so every byte
crosses a socket) drop about H-fold; every replica ends with the same parameters; bad
settings are refused naming the culprit.

This file is also the training worker: ``python test_local_sgd.py train ALGO H EPOCHS``
(ALGO: sync, local, diloco or overlap: ``LocalSGD(H, overlap=True)``), run by ``fastpsrun -np 2``.
"""

from __future__ import annotations

import hashlib
import math
import re
import sys
from pathlib import Path
from typing import Any, Dict, Tuple

REPO = Path(__file__).resolve().parents[2]
EPOCHS = 30


def train(algo: str, h: int, epochs: int) -> int:
    import fastps.torch as hvd
    import torch
    import torch.nn.functional as F
    from fastps.torch.algorithms.local_sgd import DiLoCo, LocalSGD
    from fastps.worker import api

    sys.path.insert(0, str(REPO / "examples" / "torch"))
    from train_digits import build_model, load_data

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.manual_seed(42)
    x_train, y_train, x_test, y_test = load_data()
    model = build_model("mlp")
    # The example's setting: Adam at lr 1e-3 * size. Local SGD averages models that each
    # stepped at that rate, which for small steps is the synchronous step.
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3 * size)
    algorithm = None
    if algo == "local":
        algorithm = LocalSGD(H=h)
    elif algo == "diloco":
        algorithm = DiLoCo(H=h)
    elif algo == "overlap":
        algorithm = LocalSGD(H=h, overlap=True)
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(), algorithm=algorithm
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    sent0 = api.data_path_stats()["socket_bytes_sent"]
    batch = 16
    for epoch in range(epochs):
        order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(epoch))
        shard = order[rank::size]
        for step in range(len(order) // size // batch):
            idx = shard[step * batch : (step + 1) * batch]
            optimizer.zero_grad()
            F.cross_entropy(model(x_train[idx]), y_train[idx]).backward()
            optimizer.step()
    if isinstance(algorithm, LocalSGD) and not algorithm.synced:
        algorithm.outer_step()  # the last local steps, so every replica is the same model
    sent = api.data_path_stats()["socket_bytes_sent"] - sent0
    with torch.no_grad():
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        digest = hashlib.sha256(flat.numpy().tobytes()).hexdigest()
        xs, ys = x_test[rank::size], y_test[rank::size]
        correct = (model(xs).argmax(dim=1) == ys).sum()
        counts = torch.stack([correct, torch.tensor(len(ys))]).to(torch.int64)
    counts = hvd.allreduce(counts, name="test.counts", op=hvd.Sum)
    outer = algorithm.outer_steps if isinstance(algorithm, LocalSGD) else 0
    print(f"RANK {rank} BYTES {sent} OUTER {outer} DIGEST {digest}", flush=True)
    if rank == 0:
        print(f"ACCURACY {float(counts[0]) / float(counts[1]):.4f}", flush=True)
    hvd.shutdown()
    return 0


def elastic(steps: int, overlap: bool = False) -> int:
    """LocalSGD(H=2) under elastic training: the worker on slot localhost:0 SIGKILLs itself
    in step 5, after the commit of step 4's outer step; the survivors roll back to it and
    go on in a generation with new servers, which the next outer step starts again.
    ``overlap``: LocalSGD(H=2, overlap=True), whose round in flight dies with the worker."""
    import os
    import signal

    import fastps.torch as hvd
    import torch
    from fastps.torch.algorithms.local_sgd import LocalSGD

    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1).double()
    algo = LocalSGD(H=2, overlap=overlap)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05),
        named_parameters=model.named_parameters(),
        algorithm=algo,
    )
    state = hvd.elastic.TorchState(model, opt, step=0)
    state.register_reset_callbacks([algo.on_reset])
    me = os.environ.get("FASTPS_ELASTIC_ID", "")

    @hvd.elastic.run
    def loop(state: Any) -> None:
        while state.step < steps:
            g = torch.Generator().manual_seed(1000 + state.step + 17 * hvd.rank())
            x = torch.randn(6, 8, generator=g, dtype=torch.float64)
            opt.zero_grad()
            ((model(x) - x.sum(1, keepdim=True)) ** 2).mean().backward()
            if me == "localhost:0" and state.step == 5:
                os.kill(os.getpid(), signal.SIGKILL)
            opt.step()
            state.step += 1
            print(f"STEP {state.step} size={hvd.size()} local={algo.local_steps}", flush=True)
            if algo.local_steps == 0:  # every replica holds the outer step's parameters
                state.commit()

    loop(state)
    if not algo.synced:
        algo.outer_step()  # overlap: the last round's answer
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    digest = hashlib.sha256(flat.numpy().tobytes()).hexdigest()
    print(f"DONE size={hvd.size()} outer={algo.outer_steps} DIGEST {digest}", flush=True)
    hvd.shutdown()
    return 0


def overlap(algo_name: str, h: int, steps: int, warmup: int = 0) -> int:
    """``LocalSGD``/``DiLoCo(H=h, overlap=True)`` on a float64 linear model, checked after
    every step against the algorithm simulated here for every rank (the outer rule is the
    servers' own ``OuterOptimizer``); a last ``outer_step()`` must leave one model."""
    import fastps.torch as hvd
    import numpy as np
    import torch
    from fastps import _core
    from fastps.torch.algorithms.local_sgd import DiLoCo, LocalSGD

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    cls = LocalSGD if algo_name == "local" else DiLoCo
    algo = cls(H=h, overlap=True, overlap_warmup=warmup)
    lr, mom, nest = algo.config.lr, algo.config.momentum, algo.config.nesterov

    def build() -> Any:
        torch.manual_seed(0)
        m = torch.nn.Linear(8, 1).double()
        return m, torch.optim.SGD(m.parameters(), lr=0.05)

    def sgd_step(m: Any, o: Any, r: int, step: int) -> None:
        g = torch.Generator().manual_seed(1000 + step + 17 * r)
        x = torch.randn(6, 8, generator=g, dtype=torch.float64)
        o.zero_grad()
        ((m(x) - x.sum(1, keepdim=True)) ** 2).mean().backward()
        o.step()

    def flat(m: Any) -> Any:
        return torch.cat([p.detach().reshape(-1) for p in m.parameters()]).numpy().copy()

    def put(m: Any, v: Any) -> None:
        at = 0
        with torch.no_grad():
            for p in m.parameters():
                p.copy_(torch.from_numpy(v[at : at + p.numel()]).reshape(p.shape))
                at += p.numel()

    model, inner = build()
    opt = hvd.DistributedOptimizer(inner, named_parameters=model.named_parameters(), algorithm=algo)
    # The reference: every rank's replica, the servers' parameters g and their outer rule.
    refs = [build() for _ in range(size)]
    g = flat(refs[0][0]).astype(np.float64)
    rule = _core.OuterOptimizer(lr, mom, nest)
    anchor = [g.copy() for _ in range(size)]
    pushed: Any = None  # each replica when the round in flight began
    answer: Any = None  # that round's result
    local = 0

    def outer(deltas: Any) -> Any:
        mean = np.mean(np.stack(deltas), axis=0)
        rule.step(g.ctypes.data, mean.ctypes.data, g.size)
        return g.copy()

    def land() -> None:
        for r in range(size):
            put(refs[r][0], answer + flat(refs[r][0]) - pushed[r])
            anchor[r] = answer.copy()

    worst = spread = 0.0  # spread: how far the replicas drifted apart between rounds
    rounds = 0
    for step in range(steps):
        sgd_step(model, opt, rank, step)
        for r in range(size):
            sgd_step(*refs[r], r, step)
        local += 1
        if local == h and rounds < warmup:  # a synchronous round: every replica takes g
            g_now = outer([flat(refs[r][0]) - anchor[r] for r in range(size)])
            for r in range(size):
                put(refs[r][0], g_now)
            anchor = [g_now.copy() for _ in range(size)]
            local, rounds = 0, rounds + 1
            assert algo.synced, "a warm-up round is synchronous"
        elif local == h:
            if answer is not None:
                land()
            answer = outer([flat(refs[r][0]) - anchor[r] for r in range(size)])
            pushed = [flat(refs[r][0]) for r in range(size)]
            anchor = [v.copy() for v in pushed]
            local, rounds = 0, rounds + 1
            assert not algo.synced, "an overlapped round must leave its exchange in flight"
        worst = max(worst, float(np.abs(flat(model) - flat(refs[rank][0])).max()))
        spread = max(
            [spread]
            + [float(np.abs(flat(refs[0][0]) - flat(refs[r][0])).max()) for r in range(size)]
        )
    algo.outer_step()
    assert algo.synced
    if answer is not None:
        land()
    if local:
        g_end = outer([flat(refs[r][0]) - anchor[r] for r in range(size)])
        for r in range(size):
            put(refs[r][0], g_end)
    worst = max(worst, float(np.abs(flat(model) - flat(refs[rank][0])).max()))
    final_spread = max(
        float(np.abs(flat(refs[0][0]) - flat(refs[r][0])).max()) for r in range(size)
    )
    assert final_spread == 0.0, final_spread
    digest = hashlib.sha256(flat(model).tobytes()).hexdigest()
    print(
        f"RANK {rank} WORST {worst:.3e} OUTER {algo.outer_steps} SPREAD {spread:.3e} "
        f"DIGEST {digest}",
        flush=True,
    )
    hvd.shutdown()
    return 0


if __name__ != "__main__":
    import pytest
    from torchjobs import fastpsrun

    _runs: Dict[Tuple[str, int], Tuple[float, int]] = {}

    def run(env: Dict[str, str], algo: str, h: int) -> Tuple[float, int]:
        """(test accuracy, bytes rank 0 sent while training), once per setting."""
        if (algo, h) in _runs:
            return _runs[(algo, h)]
        run_env = dict(env, FASTPS_SHM="0", FASTPS_OP_TIMEOUT="60")
        res = fastpsrun(
            Path(__file__), "train", algo, str(h), str(EPOCHS), np=2, env=run_env, timeout=300
        )
        assert res.returncode == 0, res.stdout[-4000:]
        acc = re.search(r"ACCURACY ([0-9.]+)", res.stdout)
        ranks = re.findall(r"RANK (\d) BYTES (\d+) OUTER (\d+) DIGEST (\w+)", res.stdout)
        assert acc and len(ranks) == 2, res.stdout[-4000:]
        assert len({d for _r, _b, _o, d in ranks}) == 1, f"replicas differ: {ranks}"
        if algo != "sync":
            steps = 1347 // 2 // 16 * EPOCHS  # the training set's 1347 samples
            assert {int(o) for _r, _b, o, _d in ranks} == {math.ceil(steps / h)}, ranks
        sent = int(next(b for r, b, _o, _d in ranks if r == "0"))
        print(f"{algo} H={h}: accuracy {acc.group(1)}, rank 0 sent {sent} bytes")
        _runs[(algo, h)] = (float(acc.group(1)), sent)
        return _runs[(algo, h)]

    @pytest.mark.slow
    @pytest.mark.parametrize(
        ("algo", "h"), [("local", 4), ("diloco", 4), ("diloco", 8), ("overlap", 8)]
    )
    def test_digits_close_to_sync_with_h_fold_fewer_bytes(
        subprocess_env: Dict[str, str], algo: str, h: int
    ) -> None:
        sync_acc, sync_bytes = run(subprocess_env, "sync", 1)
        acc, sent = run(subprocess_env, algo, h)
        assert acc >= sync_acc - 0.02, (sync_acc, acc)
        # About H-fold: every step's gradients against every H-th step's parameters (plus
        # the same few small sums in both runs and 64 header bytes per part).
        assert sync_bytes / sent >= 0.8 * h, (sync_bytes, sent)
        assert sync_bytes / sent <= 1.2 * h, (sync_bytes, sent)

    @pytest.mark.slow
    @pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
    def test_elastic_generation_restarts_the_outer_optimizer(
        subprocess_env: Dict[str, str], tmp_path: Path, overlap: bool
    ) -> None:
        discover = tmp_path / "discover.sh"
        discover.write_text("#!/bin/sh\necho localhost:3\n")
        discover.chmod(0o755)
        launcher = ["--min-np", "2", "--max-np", "3", "--host-discovery-script", str(discover)]
        launcher += ["--elastic-timeout", "60", "--num-servers", "1", "--reset-limit", "3"]
        res = fastpsrun(
            Path(__file__),
            "elastic",
            "16",
            *(["overlap"] if overlap else []),
            np=3,
            env=dict(subprocess_env, FASTPS_OP_TIMEOUT="60"),
            timeout=300,
            launcher_args=launcher,
        )
        assert res.returncode == 0, res.stdout[-4000:]
        assert "generation 1: 2 workers" in res.stdout, res.stdout[-4000:]
        done = re.findall(r"DONE size=(\d) outer=(\d+) DIGEST (\w+)", res.stdout)
        # 16 steps at H = 2: the outer steps of the rolled-back step 5 never completed, so
        # the survivors count 8; their replicas are the same model.
        assert [(s, o) for s, o, _d in done] == [("2", "8")] * 2, res.stdout[-4000:]
        assert len({d for _s, _o, d in done}) == 1, done
        # The local step count restarted with the rollback: outer steps stay on even steps.
        if not overlap:
            assert re.search(r"STEP 6 size=2 local=0", res.stdout), res.stdout[-4000:]
        else:
            # Step 6's round starts without waiting, so the survivors finish step 6 in
            # generation 0 and commit; the dead worker shows when they land that round at
            # step 8, and they roll back to step 6.
            assert re.search(r"STEP 6 size=3 local=0", res.stdout), res.stdout[-4000:]
            assert re.search(r"STEP 7 size=2 local=1", res.stdout), res.stdout[-4000:]
            assert not re.search(r"STEP 6 size=2", res.stdout), res.stdout[-4000:]

    @pytest.mark.parametrize(
        ("algo", "h", "steps", "warmup"),
        [("local", 3, 11, 0), ("diloco", 2, 9, 0), ("local", 2, 9, 2)],
    )
    def test_overlap_applies_each_round_one_round_late(
        subprocess_env: Dict[str, str], algo: str, h: int, steps: int, warmup: int
    ) -> None:
        # warmup: the first rounds synchronous (overlap_warmup), the later ones overlapped.
        res = fastpsrun(
            Path(__file__),
            "overlap",
            algo,
            str(h),
            str(steps),
            str(warmup),
            np=2,
            env=dict(subprocess_env, FASTPS_OP_TIMEOUT="60"),
            timeout=180,
        )
        assert res.returncode == 0, res.stdout[-4000:]
        got = re.findall(r"RANK (\d) WORST (\S+) OUTER (\d+) SPREAD (\S+) DIGEST (\w+)", res.stdout)
        assert len(got) == 2, res.stdout[-4000:]
        for _rank, worst, outer, _spread, _digest in got:
            # Every step's parameters are the simulated algorithm's (float64; the servers
            # sum in another order than numpy's mean).
            assert float(worst) < 1e-12, got
            # The rounds of the loop plus the final sync's (none if it had no step left).
            assert int(outer) == steps // h + (1 if steps % h else 0), got
        # The replicas did differ between rounds (the exchange really overlapped), and the
        # final outer_step() made them one model.
        assert float(got[0][3]) > 1e-6, got
        assert len({d for *_x, d in got}) == 1, got

    def test_bad_settings_name_the_culprit() -> None:
        from algorithm_refusals import assert_local_sgd_refusals, assert_overlap_refusals
        from fastps.torch.algorithms.local_sgd import DiLoCo, LocalSGD

        assert_local_sgd_refusals(LocalSGD, DiLoCo)
        assert_overlap_refusals(LocalSGD, DiLoCo)

    def test_server_rule_is_registered_and_checked() -> None:
        from fastps.torch.algorithms.base import ServerRule, check_server_rule
        from fastps.torch.algorithms.local_sgd import DiLoCo

        rule = DiLoCo(H=8).server_rule()
        assert rule.kind == "outer"
        assert dict(rule.options) == {"lr": 0.7, "momentum": 0.9, "nesterov": True}
        check_server_rule(rule, "DiLoCo")
        with pytest.raises(ValueError, match="outer momentum 2"):
            check_server_rule(
                ServerRule("outer", {"lr": 0.7, "momentum": 2.0, "nesterov": True}), "x"
            )


if __name__ == "__main__" and sys.argv[1:2] == ["train"]:
    sys.exit(train(sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
if __name__ == "__main__" and sys.argv[1:2] == ["elastic"]:
    sys.exit(elastic(int(sys.argv[2]), sys.argv[3:4] == ["overlap"]))
if __name__ == "__main__" and sys.argv[1:2] == ["overlap"]:
    sys.exit(overlap(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])))
