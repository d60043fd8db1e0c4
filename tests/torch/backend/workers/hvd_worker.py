"""``hvd.init()`` under torchrun (no fastpsrun): the job forms through torch's store.

``hvd_worker.py torch``: fastps.torch: rank/size/local_rank, sums, and a few training steps
with ``hvd.DistributedOptimizer`` matching single-process training on every rank's batch.
``hvd_worker.py both``: ``hvd.init()`` and then ``init_process_group("fastps")`` in the same
process: one job (same rank, same job), both APIs work, interleaved.
``hvd_worker.py pg-first``: the other order.
``hvd_worker.py tf``: fastps.tensorflow: ``hvd.init()`` and a tiny allreduce.

Each rank prints ``HVD OK rank R`` last; any mismatch raises (non-zero exit).
"""

from __future__ import annotations

import datetime
import os
import sys

from common import apply_data_path


def check_torch_basics() -> None:
    import fastps.torch as hvd
    import torch

    r, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    assert hvd.rank() == r and hvd.size() == n, (hvd.rank(), hvd.size(), r, n)
    assert hvd.local_rank() == int(os.environ["LOCAL_RANK"]), hvd.local_rank()
    assert hvd.local_size() == int(os.environ["LOCAL_WORLD_SIZE"]), hvd.local_size()
    got = hvd.allreduce(torch.arange(6.0) + r, op=hvd.Sum, name="sum")
    assert torch.equal(got, n * torch.arange(6.0) + n * (n - 1) / 2), got
    got = hvd.allreduce(torch.tensor([r, 1], dtype=torch.int64), op=hvd.Sum, name="isum")
    assert got.tolist() == [n * (n - 1) // 2, n], got
    avg = hvd.allreduce(torch.full((3,), float(r)), name="avg")  # Average by default
    assert torch.allclose(avg, torch.full((3,), (n - 1) / 2)), avg
    gathered = hvd.allgather(torch.full((r + 1, 2), float(r)), name="gather")
    assert gathered.shape == (n * (n + 1) // 2, 2), gathered.shape
    print(f"rank {r}: rank/size/local_rank and sums OK", flush=True)


def check_training(steps: int = 4) -> None:
    """DistributedOptimizer: parameters after ``steps`` equal single-process training on
    the union of the ranks' batches (equal batch sizes: the mean of the ranks' mean
    gradients), and are the same on every rank."""
    import fastps.torch as hvd
    import torch

    r, n = hvd.rank(), hvd.size()
    torch.manual_seed(100 + r)  # different initial weights: broadcast_parameters must fix
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    torch.manual_seed(7)
    ref = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    if r == 0:
        model.load_state_dict(ref.state_dict())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.equal(p, q), "broadcast_parameters did not give rank 0's weights"
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
    )
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(11)
    for _ in range(steps):
        xs = [torch.randn(5, 4, generator=g) for _ in range(n)]
        ys = [torch.randn(5, 1, generator=g) for _ in range(n)]
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(xs[r]), ys[r]).backward()
        opt.step()
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(ref(torch.cat(xs)), torch.cat(ys)).backward()
        ref_opt.step()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert torch.allclose(p, q, atol=1e-6), f"{name}: {p} != reference {q}"
        every = hvd.allgather(p.detach().reshape(1, -1), name=f"final.{name}")
        assert all(torch.equal(row, every[0]) for row in every), f"{name} differs across ranks"
    print(f"rank {r}: {steps} DistributedOptimizer steps match the reference", flush=True)


def check_both() -> None:
    """hvd.init() first, then init_process_group("fastps"): the same job."""
    import fastps.torch as hvd
    import torch
    import torch.distributed as dist
    from fastps.launch import store_rendezvous

    hvd.init()
    job = store_rendezvous.started()
    assert job is not None
    check_torch_basics()
    dist.init_process_group("fastps", timeout=datetime.timedelta(seconds=60))
    r, n = dist.get_rank(), dist.get_world_size()
    assert (r, n) == (hvd.rank(), hvd.size()), (r, n, hvd.rank(), hvd.size())
    assert store_rendezvous.started() == job, "init_process_group started a second job"
    for i in range(3):  # the two APIs interleaved
        x = torch.full((4,), float(r + i))
        dist.all_reduce(x)
        assert torch.all(x == n * (n - 1) / 2 + n * i), x
        y = hvd.allreduce(torch.full((4,), float(r)), op=hvd.Sum, name=f"mix.{i}")
        assert torch.all(y == n * (n - 1) / 2), y
    dist.destroy_process_group()
    print(f"rank {r}: hvd.init() + init_process_group: one job, both work", flush=True)


def check_pg_first() -> None:
    """init_process_group("fastps") first, then hvd.init(): still one job."""
    import fastps.torch as hvd
    import torch
    import torch.distributed as dist
    from fastps.launch import store_rendezvous

    dist.init_process_group("fastps", timeout=datetime.timedelta(seconds=60))
    job = store_rendezvous.started()
    hvd.init()
    assert store_rendezvous.started() == job, "hvd.init() started a second job"
    check_torch_basics()
    x = torch.ones(3)
    dist.all_reduce(x)
    assert torch.all(x == dist.get_world_size()), x
    dist.destroy_process_group()
    print(f"rank {hvd.rank()}: init_process_group + hvd.init(): one job, both work", flush=True)


def check_tf() -> None:
    import fastps.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    r, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    assert hvd.rank() == r and hvd.size() == n, (hvd.rank(), hvd.size())
    assert hvd.local_rank() == int(os.environ["LOCAL_RANK"]), hvd.local_rank()
    got = hvd.allreduce(tf.constant([1.0, 2.0, 3.0]) * (r + 1), op=hvd.Sum)
    want = [k * n * (n + 1) / 2 for k in (1.0, 2.0, 3.0)]
    assert got.numpy().tolist() == want, (got, want)
    print(f"rank {r}: tensorflow hvd.init() and allreduce OK", flush=True)


def main() -> int:
    apply_data_path()
    mode = sys.argv[1]
    if mode == "torch":
        import fastps.torch as hvd

        hvd.init()
        check_torch_basics()
        check_training()
    elif mode == "both":
        check_both()
    elif mode == "pg-first":
        check_pg_first()
    elif mode == "tf":
        check_tf()
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    print(f"HVD OK rank {os.environ['RANK']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
