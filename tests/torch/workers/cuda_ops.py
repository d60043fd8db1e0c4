"""Worker: the CUDA path (pinned host staging on a side stream) on each rank's GPU.

Checks collectives on CUDA tensors of the floating and integer dtypes, work queued on a
non-default stream, fp16 compression, and that DistributedOptimizer training on the GPU
matches one process training on the concatenated batches.
"""

from __future__ import annotations

import fastps.torch as hvd
import torch
import torch.nn.functional as F


def main() -> None:
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    device = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
    torch.cuda.set_device(device)

    for dtype in (
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
        torch.int32,
        torch.int64,
        torch.uint8,
        torch.bool,
    ):
        tag = str(dtype).replace("torch.", "")
        base = torch.arange(1000, device=device) % 7
        mine = ((base + rank) % 2 == 0) if dtype == torch.bool else (base + rank).to(dtype)
        if dtype == torch.bool:
            want = torch.zeros_like(mine)
            for r in range(size):
                want |= (base + r) % 2 == 0
        else:
            want = sum((base + r) for r in range(size)).to(dtype)
        out = hvd.allreduce(mine, op=hvd.Sum, name=f"cuda.sum.{tag}")
        assert out.device == device and torch.equal(out, want), tag
        t = mine.clone()
        hvd.allreduce_(t, op=hvd.Sum, name=f"cuda.inplace.{tag}")
        assert torch.equal(t, want), tag
        got = hvd.broadcast(mine, 0, name=f"cuda.bc.{tag}")
        assert got.device == device
        gathered = hvd.allgather(mine[: rank + 1], name=f"cuda.ag.{tag}")
        assert gathered.device == device and gathered.shape[0] == size * (size + 1) // 2
        print(f"cuda {tag} OK", flush=True)

    # A producer on a side stream: the staging copy must wait for its kernels.
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        big = torch.full((1 << 20,), float(rank + 1), device=device)
        big = big * 2  # queued on `side`
        out = hvd.allreduce(big, op=hvd.Sum, name="cuda.side")
    torch.cuda.synchronize()
    assert torch.all(out == float(sum(2 * (r + 1) for r in range(size))))

    x = torch.randn(4096, device=device) * (rank + 1)
    out = hvd.allreduce(x, name="cuda.fp16", compression=hvd.Compression.fp16)
    assert out.dtype == torch.float32 and out.device == device

    # Training equivalence on the GPU (float64).
    torch.manual_seed(0)
    model = (
        torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3))
        .double()
        .to(device)
    )
    ref = (
        torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3))
        .double()
        .to(device)
    )
    ref.load_state_dict(model.state_dict())
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=model.named_parameters(),
    )
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(5)
    for _ in range(5):
        xb = torch.randn(8, 10, generator=g, dtype=torch.float64).to(device)
        yb = torch.randint(0, 3, (8,), generator=g).to(device)
        share = 8 // size
        opt.zero_grad()
        F.cross_entropy(
            model(xb[rank * share : (rank + 1) * share]), yb[rank * share : (rank + 1) * share]
        ).backward()
        opt.step()
        ref_opt.zero_grad()
        F.cross_entropy(ref(xb), yb).backward()
        ref_opt.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert float((p - q).abs().max()) < 1e-9
    print("CUDA OK", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
