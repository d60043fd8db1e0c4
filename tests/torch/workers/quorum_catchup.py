"""Worker: quorum rounds with a worker that is slower for good (docs/guide/async.md, "Catch-up").

Every rank trains the same small model with DistributedOptimizer (SGD with momentum, so
optimizer state advances with every round applied) on data of its own; rank ``slow``
spends ``slow_s`` per step, the others ``fast_s``. The loop counts rounds applied, not its
own steps: the slow rank catches up on the rounds that closed without it, several per
step. Prints one ``QUORUM`` JSON line: its steps, the time each took, the rounds applied,
and a digest of the parameters and momentum buffers (identical on every rank).

Usage: quorum_catchup.py ROUNDS SLOW_RANK FAST_S SLOW_S
"""

from __future__ import annotations

import hashlib
import json
import sys
import time

import fastps.torch as hvd
import torch


def main() -> None:
    rounds, slow = int(sys.argv[1]), int(sys.argv[2])
    fast_s, slow_s = float(sys.argv[3]), float(sys.argv[4])
    hvd.init()
    rank = hvd.rank()
    torch.manual_seed(1234)
    # The middle weight (256 KiB) travels alone, the small tensors fused in a bucket.
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 256),
        torch.nn.Tanh(),
        torch.nn.Linear(256, 256),
        torch.nn.Tanh(),
        torch.nn.Linear(256, 4),
    )
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
        named_parameters=model.named_parameters(),
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    data = torch.Generator().manual_seed(100 + rank)
    pause = slow_s if rank == slow else fast_s
    took = []
    while opt.applied_rounds < rounds:
        start = time.perf_counter()
        x = torch.randn(16, 32, generator=data)
        y = torch.randn(16, 4, generator=data)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        time.sleep(pause)  # this worker's compute
        opt.step()
        took.append(time.perf_counter() - start)
    digest = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        digest.update(name.encode())
        digest.update(p.detach().numpy().tobytes())
        digest.update(opt.state[p]["momentum_buffer"].numpy().tobytes())
    record = {
        "rank": rank,
        "rounds": opt.applied_rounds,
        "took": took,
        "digest": digest.hexdigest(),
    }
    print("QUORUM " + json.dumps(record), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
