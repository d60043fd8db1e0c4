"""Training under fastpsrun with FASTPS_ELASTIC_SERVERS=1 while servers die and join
(tests/integration/elastic/test_elastic_servers.py). Rank 0 acts on the servers at given
steps, right after the step's push_pulls started, so each change lands while parts are in
flight:

  KILL="10:1,25:2"  SIGKILL server 1 at step 10 and server 2 at step 25 (ids; "8:1+2"
                    kills two at once)
  ADD="35:7"        start `python -m fastps.server` with FASTPS_SERVER_ID=7 at step 35,
                    with the settings fastpsrun wrote for it in $TMPDIR

MODE=numpy sums numpy gradients through fastps.api (the Handle path); MODE=torch trains a
small model with fastps.torch.DistributedOptimizer (its in-place id path). The final
parameters go to RESULT as JSON with each change's recovery time (from the kill or start
to the end of that step on rank 0) and the servers the last core pushes to.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Dict, List

import numpy as np

SIZES = [100_000, 3_000, 17, 250_000]
LR = 0.1


def _actions(text: str) -> Dict[int, List[int]]:
    """``"10:1,25:2+3"`` -> {10: [1], 25: [2, 3]} (server ids by step)."""
    out: Dict[int, List[int]] = {}
    for item in filter(None, (text or "").split(",")):
        step, sids = item.split(":")
        out[int(step)] = [int(x) for x in sids.split("+")]
    return out


def numpy_grads(step: int, rank: int, params: List[np.ndarray]) -> List[np.ndarray]:
    g = np.random.default_rng(1000 * step + rank)
    return [g.standard_normal(p.size).astype(np.float32) * 0.01 + 0.001 * p for p in params]


def numpy_init() -> List[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal(n).astype(np.float32) for n in SIZES]


def numpy_reference(steps: int, size: int) -> List[np.ndarray]:
    """The same training in one process: the average of every rank's gradient each step."""
    params = numpy_init()
    for step in range(steps):
        per_rank = [numpy_grads(step, r, params) for r in range(size)]
        for i, p in enumerate(params):
            avg = sum(g[i] for g in per_rank) / np.float32(size)
            p -= np.float32(LR) * avg.astype(np.float32)
    return params


def torch_model():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 300), torch.nn.Tanh()
    )


def torch_batch(step: int, rank: int):
    import torch

    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 64, generator=g), torch.randn(16, 300, generator=g)


def torch_reference(steps: int, size: int) -> List[np.ndarray]:
    import torch

    model = torch_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(steps):
        opt.zero_grad()
        loss = sum(
            torch.nn.functional.mse_loss(model(x), y)
            for x, y in (torch_batch(step, r) for r in range(size))
        )
        (loss / size).backward()
        opt.step()
    return [p.detach().numpy().copy() for p in model.parameters()]


def main() -> None:
    import fastps.worker.api as api

    mode = os.environ.get("MODE", "numpy")
    steps = int(os.environ.get("STEPS", "50"))
    kills, adds = _actions(os.environ.get("KILL", "")), _actions(os.environ.get("ADD", ""))
    if mode == "torch":
        import fastps.torch as hvd
        import torch

        hvd.init()
        model = torch_model()
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=LR), named_parameters=model.named_parameters()
        )
    else:
        api.init()
        params = numpy_init()
    rank = api.rank()
    st = api._st()
    started: List[subprocess.Popen] = []
    changes = []
    step_times = []
    worker = st.worker
    for step in range(steps):
        if step - 1 in adds:
            # Every rank waits (bounded) for the new server to be in, so the steps after
            # this one run on it whatever its start-up takes on a loaded machine.
            want = sum(len(v) for s, v in (*kills.items(), *adds.items()) if s < step)
            worker.server_epoch(want, timeout=120.0)
        t0 = time.monotonic()
        act = None
        if mode == "torch":
            x, y = torch_batch(step, rank)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()  # hooks start the pushes
        else:
            grads = numpy_grads(step, rank, params)
            hs = [
                api.push_pull_async(g, average=True, name=f"w{i}", out=g)
                for i, g in enumerate(grads)
            ]
        if rank == 0 and step in kills:
            act = ("kill", kills[step], time.monotonic())
            for sid in kills[step]:
                os.kill(next(s.pid for s in st.membership.servers if s.id == sid), signal.SIGKILL)
        if rank == 0 and step in adds:
            env = {}
            # fastpsrun's settings for servers started by hand (docs/guide/elastic.md)
            path = os.path.join(
                os.environ.get("TMPDIR", "/tmp"),
                f"fastps-{os.environ['FASTPS_JOB_ID']}-servers.env",
            )
            for line in open(path):
                k, _, v = line.removeprefix("export ").strip().partition("=")
                env[k] = v
            env = {**os.environ, **env, "FASTPS_SERVER_ID": str(adds[step][0])}
            env.pop("FASTPS_RANK", None)
            act = ("add", adds[step], time.monotonic())
            started.append(subprocess.Popen([sys.executable, "-m", "fastps.server"], env=env))
        if mode == "torch":
            opt.step()
        else:
            for h in hs:
                h.synchronize()
            for p, g in zip(params, grads):
                p -= np.float32(LR) * g
        if act is not None:
            changes.append(
                {
                    "what": act[0],
                    "server": act[1],
                    "step": step,
                    "seconds": time.monotonic() - act[2],
                }
            )
        else:
            step_times.append(time.monotonic() - t0)
        time.sleep(0.01)
    worker.server_epoch(sum(map(len, (*kills.values(), *adds.values()))), timeout=120.0)
    used = sorted(
        {
            s
            for name, n in (("w3", 1_000_000), ("big", 4_000_000))
            for _, _, s in worker.part_layout(name, n, 4)
        }
    )
    final = [p.detach().numpy() for p in model.parameters()] if mode == "torch" else params
    if rank == 0:
        with open(os.environ["RESULT"], "w") as f:
            json.dump(
                {
                    "params": [p.tolist() for p in final],
                    "changes": changes,
                    "epoch": worker.stats().get("server_epoch"),
                    "core_servers": len(used),
                    "redone": worker.changes,
                    "step_median": float(np.median(step_times)),
                },
                f,
            )
    api.shutdown()
    for p in started:
        p.wait(timeout=60)


if __name__ == "__main__":
    main()
