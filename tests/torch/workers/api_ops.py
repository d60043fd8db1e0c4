"""Worker: every collective of fastps.torch on CPU tensors of every supported dtype.

Each rank contributes values it can compute for every other rank (``base + rank``), so
every rank checks the exact expected result. Prints ``<check> OK`` lines; any failure
raises (non-zero exit).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, List

import fastps.torch as hvd
import torch

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8]
UNSUPPORTED = [torch.complex64, torch.complex128, torch.uint16, torch.uint32, torch.uint64]


def short(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def value(dtype: torch.dtype, rank: int, shape: Any = (2, 3)) -> torch.Tensor:
    """Small integers (exact in every dtype), different on every rank."""
    n = 1
    for d in shape:
        n *= d
    base = torch.arange(n).reshape(shape) % 5 + rank
    if dtype == torch.bool:
        return (base % 2) == 0
    return base.to(dtype)


def expected_sum(dtype: torch.dtype, size: int, shape: Any = (2, 3)) -> torch.Tensor:
    if dtype == torch.bool:
        out = value(dtype, 0, shape)
        for r in range(1, size):
            out = out | value(dtype, r, shape)
        return out
    total = sum(value(torch.int64, r, shape) for r in range(size))
    return total.to(dtype)


@contextlib.contextmanager
def raises(fragment: str) -> Iterator[None]:
    try:
        yield
    except hvd.FastPSError as exc:
        assert fragment in str(exc), f"expected {fragment!r} in: {exc}"
        return
    raise AssertionError(f"expected a FastPSError mentioning {fragment!r}")


def check_basics() -> None:
    assert hvd.is_initialized()
    size, rank = hvd.size(), hvd.rank()
    assert 0 <= rank < size
    assert 0 <= hvd.local_rank() < hvd.local_size() <= size
    assert 0 <= hvd.cross_rank() < hvd.cross_size()
    ranks = hvd.allgather_object(rank, name="ranks")
    assert ranks == list(range(size)), ranks
    print("basics OK")


def check_allreduce(dtype: torch.dtype) -> None:
    size, rank = hvd.size(), hvd.rank()
    tag = short(dtype)
    mine = value(dtype, rank)
    total = expected_sum(dtype, size)

    out = hvd.allreduce(mine, name=f"ar.sum.{tag}", op=hvd.Sum)
    assert out.dtype == dtype and torch.equal(out, total), (tag, out, total)
    assert torch.equal(mine, value(dtype, rank)), "out-of-place allreduce changed its input"

    h = hvd.allreduce_async(mine, name=f"ar.async.{tag}", op=hvd.Sum)
    while not hvd.poll(h):
        pass
    assert torch.equal(hvd.synchronize(h), total)

    t = mine.clone()
    assert hvd.allreduce_(t, name=f"ar.inplace.{tag}", op=hvd.Sum) is t
    assert torch.equal(t, total)
    t = mine.clone()
    h = hvd.allreduce_async_(t, name=f"ar.async_.{tag}", op=hvd.Sum)
    assert hvd.synchronize(h) is t and torch.equal(t, total)

    # BytePS spelling
    assert torch.equal(hvd.push_pull(mine, name=f"pp.{tag}", op=hvd.Sum), total)

    if dtype != torch.bool:
        avg = hvd.allreduce(mine, name=f"ar.avg.{tag}")
        if dtype.is_floating_point:
            want = (total.double() / size).to(dtype)
        else:
            want = torch.div(total, size, rounding_mode="floor")
        assert torch.equal(avg, want), (tag, avg, want)
        # average= (deprecated Horovod argument) and scale factors
        avg2 = hvd.allreduce(mine, average=True, name=f"ar.avg2.{tag}")
        assert torch.equal(avg2, want)
        scaled = hvd.allreduce(
            mine, name=f"ar.scaled.{tag}", op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5
        )
        assert torch.equal(scaled, total), (tag, scaled, total)

    # min / max / product (gather-based)
    stacked = torch.stack([value(dtype, r) for r in range(size)])
    if dtype == torch.bool:
        want_min, want_max = stacked.all(0), stacked.any(0)
    else:
        want_min, want_max = stacked.amin(0), stacked.amax(0)
    assert torch.equal(hvd.allreduce(mine, op=hvd.Min, name=f"ar.min.{tag}"), want_min)
    assert torch.equal(hvd.allreduce(mine, op=hvd.Max, name=f"ar.max.{tag}"), want_max)
    if dtype != torch.bool:
        prod = hvd.allreduce(mine, op=hvd.Product, name=f"ar.prod.{tag}")
        assert torch.equal(prod, stacked.prod(0).to(dtype)), (tag, prod)

    # grouped
    outs = hvd.grouped_allreduce([mine, mine.flatten()], name=f"grp.{tag}", op=hvd.Sum)
    assert torch.equal(outs[0], total) and torch.equal(outs[1], total.flatten())

    # non-contiguous input, in place and out of place
    nc = value(dtype, rank, (3, 2)).t()
    assert not nc.is_contiguous()
    want_nc = expected_sum(dtype, size, (3, 2)).t()
    assert torch.equal(hvd.allreduce(nc, op=hvd.Sum, name=f"ar.nc.{tag}"), want_nc)
    hvd.allreduce_(nc, op=hvd.Sum, name=f"ar.nc_.{tag}")
    assert torch.equal(nc, want_nc)

    # zero-dimensional and empty tensors
    scalar = value(dtype, rank, (1,)).reshape(())
    out = hvd.allreduce(scalar, op=hvd.Sum, name=f"ar.scalar.{tag}")
    assert out.shape == () and torch.equal(out, expected_sum(dtype, size, (1,)).reshape(()))
    empty = torch.empty(0, 4, dtype=dtype)
    assert hvd.allreduce(empty, op=hvd.Sum, name=f"ar.empty.{tag}").shape == (0, 4)


def check_allgather(dtype: torch.dtype) -> None:
    size, rank = hvd.size(), hvd.rank()
    tag = short(dtype)
    # Ranks contribute different numbers of rows (rank r: r + 1 rows).
    mine = value(dtype, rank, (rank + 1, 3))
    want = torch.cat([value(dtype, r, (r + 1, 3)) for r in range(size)])
    out = hvd.allgather(mine, name=f"ag.{tag}")
    assert out.dtype == dtype and torch.equal(out, want), (tag, out, want)
    h = hvd.allgather_async(mine, name=f"ag.async.{tag}")
    assert torch.equal(hvd.synchronize(h), want)
    # the same name with another total size works too
    mine2 = value(dtype, rank, (2, 3))
    out2 = hvd.allgather(mine2, name=f"ag.{tag}")
    assert torch.equal(out2, torch.cat([value(dtype, r, (2, 3)) for r in range(size)]))
    # a rank may contribute no rows
    rows = 0 if rank == 0 else 2
    out3 = hvd.allgather(value(dtype, rank, (rows, 3)), name=f"ag.zero.{tag}")
    assert out3.shape == (2 * (size - 1), 3)


def check_sparse_allreduce() -> None:
    """Indices and values gathered, averaged (floats: exactly the gathered values over the
    size, duplicates summed; integers: true division's floats) or summed; the caller's
    tensor is untouched."""
    size, rank = hvd.size(), hvd.rank()

    def mine(dtype: torch.dtype, r: int) -> torch.Tensor:
        # rows r and r + 1 of a 6 x 2 table: neighbouring ranks share a row
        idx = torch.tensor([[r, r + 1]])
        vals = torch.tensor([[1.0 + r, 2.0], [3.0, 4.0 + r]]).to(dtype)
        return torch.sparse_coo_tensor(idx, vals, (6, 2))

    for dtype in (torch.float32, torch.float64, torch.int64):
        tag = short(dtype)
        grad = mine(dtype, rank)
        before = grad.coalesce().values().clone()
        want_sum = sum(mine(dtype, r).to_dense() for r in range(size))
        out = hvd.sparse_allreduce_async(grad, name=f"sp.sum.{tag}", op=hvd.Sum).synchronize()
        assert out.is_sparse and out.is_coalesced(), tag
        assert torch.equal(out.to_dense(), want_sum), (tag, out.to_dense(), want_sum)
        avg = hvd.sparse_allreduce_async(grad, name=f"sp.avg.{tag}").synchronize()
        if dtype.is_floating_point:
            want = sum(mine(dtype, r).to_dense() / size for r in range(size))
            assert avg.dtype == dtype and torch.equal(avg.to_dense(), want), (tag, avg)
        else:
            assert avg.dtype.is_floating_point, (tag, avg.dtype)
            assert torch.allclose(avg.to_dense().double(), want_sum.double() / size), (tag, avg)
        assert torch.equal(grad.coalesce().values(), before), tag  # the input is untouched
    print("sparse allreduce OK")


def check_sparse_optimizer() -> None:
    """DistributedOptimizer hands a sparse embedding's sum back uncoalesced, as Horovod does
    (a row two ranks used appears twice), and SGD applies exactly the averaged gradient."""
    size, rank = hvd.size(), hvd.rank()
    emb = torch.nn.Embedding(6, 2, sparse=True)
    with torch.no_grad():
        emb.weight.zero_()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(emb.parameters(), lr=0.5), named_parameters=emb.named_parameters()
    )
    emb(torch.tensor([rank, rank + 1])).sum().backward()  # neighbouring ranks share a row
    opt.synchronize()
    grad = emb.weight.grad
    assert grad is not None and grad.is_sparse and not grad.is_coalesced(), grad
    want = torch.zeros(6, 2)
    for r in range(size):
        want[r] += 1.0 / size
        want[r + 1] += 1.0 / size
    assert torch.equal(grad.coalesce().to_dense(), want), (grad, want)
    with opt.skip_synchronize():
        opt.step()
    opt.wait_for_updates()
    assert torch.equal(emb.weight.detach(), -0.5 * want), emb.weight
    print("sparse optimizer OK")


def check_broadcast(dtype: torch.dtype) -> None:
    size, rank = hvd.size(), hvd.rank()
    tag = short(dtype)
    for root in range(size):
        mine = value(dtype, rank)
        want = value(dtype, root)
        out = hvd.broadcast(mine, root, name=f"bc.{tag}.{root}")
        assert torch.equal(out, want), (tag, root, out)
        assert torch.equal(mine, value(dtype, rank))
        t = mine.clone()
        assert hvd.broadcast_(t, root, name=f"bc_.{tag}.{root}") is t
        assert torch.equal(t, want)
        t = mine.clone()
        h = hvd.broadcast_async_(t, root, name=f"bca_.{tag}.{root}")
        assert hvd.synchronize(h) is t and torch.equal(t, want)
        h = hvd.broadcast_async(mine, root, name=f"bca.{tag}.{root}")
        assert torch.equal(hvd.synchronize(h), want)


def check_compression() -> None:
    size, rank = hvd.size(), hvd.rank()
    x = torch.linspace(-1, 1, 100) * (rank + 1)
    want = sum(torch.linspace(-1, 1, 100) * (r + 1) for r in range(size)) / size
    out = hvd.allreduce(x, name="fp16.avg", compression=hvd.Compression.fp16)
    assert out.dtype == torch.float32
    assert torch.allclose(out, want, atol=2e-3), (out - want).abs().max()
    y = x.double()
    hvd.allreduce_(y, name="fp16.inplace", compression=hvd.Compression.fp16, op=hvd.Sum)
    assert y.dtype == torch.float64 and torch.allclose(y, want.double() * size, atol=5e-3)
    ints = torch.arange(4) + rank
    out = hvd.allreduce(ints, name="fp16.ints", compression=hvd.Compression.fp16, op=hvd.Sum)
    assert torch.equal(out, sum(torch.arange(4) + r for r in range(size)))
    compressed, ctx = hvd.Compression.fp16.compress(torch.ones(3))
    assert compressed.dtype == torch.float16
    assert hvd.Compression.fp16.decompress(compressed, ctx).dtype == torch.float32
    print("compression OK")


def check_objects() -> None:
    size, rank = hvd.size(), hvd.rank()
    for root in range(size):
        obj = {
            "root": root,
            "rank": rank,
            "data": list(range(rank * 50)),
            "tensor": torch.full((2,), float(rank)),
        }
        got = hvd.broadcast_object(obj if rank == root else None, root_rank=root)
        assert got["rank"] == root and got["data"] == list(range(root * 50))
        assert torch.equal(got["tensor"], torch.full((2,), float(root)))
    # named, and objects of different sizes under the same name
    for n in (1, 1000, 10):
        got = hvd.broadcast_object("x" * n if rank == 0 else None, 0, name="bo.named")
        assert got == "x" * n
    everyone = hvd.allgather_object({"rank": rank, "pad": "y" * (rank * 300)})
    assert [o["rank"] for o in everyone] == list(range(size))
    assert [len(o["pad"]) for o in everyone] == [r * 300 for r in range(size)]
    print("objects OK")


def check_autograd() -> None:
    size, rank = hvd.size(), hvd.rank()
    w = torch.ones(3, requires_grad=True)
    hvd.allreduce(w * (rank + 1), name="grad.ar").sum().backward()
    # d/dw of sum(avg_r (w*(r+1))) through the averaged gradient: (rank+1) * 1
    assert torch.allclose(w.grad, torch.full((3,), float(rank + 1))), w.grad
    w = torch.ones(2, 2, requires_grad=True)
    g = hvd.allgather(w * (rank + 1), name="grad.ag")
    assert g.shape == (2 * size, 2)
    g.sum().backward()
    # Horovod's allgather gradient: this rank's rows of the gradient averaged over ranks
    assert torch.allclose(w.grad, torch.full((2, 2), float(rank + 1))), w.grad
    w = torch.ones(2, requires_grad=True)
    hvd.broadcast(w, 0, name="grad.bc").sum().backward()
    want = 1.0 if rank == 0 else 0.0  # Horovod's: the averaged gradient, at the root only
    assert torch.allclose(w.grad, torch.full((2,), want)), w.grad
    print("autograd OK")


def check_errors() -> None:
    for dtype in UNSUPPORTED:
        t = torch.zeros(2, dtype=dtype)
        for fn in (
            lambda t=t: hvd.allreduce(t, name="bad.tensor"),
            lambda t=t: hvd.allreduce_async_(t, name="bad.tensor"),
            lambda t=t: hvd.allgather(t, name="bad.tensor"),
            lambda t=t: hvd.broadcast(t, 0, name="bad.tensor"),
            lambda t=t: hvd.broadcast_(t, 0, name="bad.tensor"),
        ):
            with raises("'bad.tensor'"):
                fn()
    with raises(short(torch.complex64)):
        hvd.allreduce(torch.zeros(2, dtype=torch.complex64), name="bad.c")
    with raises("'bad.params.w'"):
        hvd.broadcast_parameters({"bad.params.w": torch.zeros(2, dtype=torch.uint32)}, 0)
    with raises("Adasum"):  # floating-point gradients only (core/collectives/adasum.py)
        hvd.allreduce(torch.zeros(2, dtype=torch.int32), name="adasum", op=hvd.Adasum)
    with raises("Adasum"):  # the delta optimizer combines real floating-point updates
        hvd.DistributedOptimizer(
            torch.optim.SGD([torch.zeros(1, dtype=torch.complex64, requires_grad=True)], lr=1),
            op=hvd.Adasum,
        )
    with raises("root_rank"):
        hvd.broadcast(torch.zeros(2), hvd.size(), name="bad.root")
    with raises("boolean"):
        hvd.allreduce(torch.zeros(2, dtype=torch.bool), name="bad.bool.avg")
    with raises("sparse"):
        hvd.allreduce(torch.zeros(3, 3).to_sparse(), name="bad.sparse")
    print("errors OK")


def check_join_barrier() -> None:
    hvd.barrier()
    last = hvd.join()
    assert 0 <= last < hvd.size()
    everyone = hvd.allgather_object(last, name="join.result")
    assert len(set(everyone)) == 1, everyone
    print("join/barrier OK")


def check_parameters() -> None:
    rank = hvd.rank()
    torch.manual_seed(rank)  # different weights on every rank
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 5), torch.nn.BatchNorm1d(5), torch.nn.Linear(5, 2)
    )
    model(torch.randn(8, 4))  # BN running stats and num_batches_tracked (int64) differ too
    with torch.no_grad():
        model[1].num_batches_tracked.fill_(rank + 7)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    flat = torch.cat([t.double().reshape(-1) for t in model.state_dict().values()])
    everyone = hvd.allgather(flat.unsqueeze(0), name="params.after")
    for r in range(1, hvd.size()):
        assert torch.equal(everyone[0], everyone[r])
    assert int(model[1].num_batches_tracked) == 7
    # named_parameters form, from another root
    root = hvd.size() - 1
    torch.manual_seed(100 + rank)
    lin = torch.nn.Linear(3, 3)
    hvd.broadcast_parameters(list(lin.named_parameters()), root_rank=root)
    torch.manual_seed(100 + root)
    want = torch.nn.Linear(3, 3)
    assert torch.equal(lin.weight, want.weight) and torch.equal(lin.bias, want.bias)
    assert lin.weight.requires_grad
    print("broadcast_parameters OK")


def check_optimizer_api() -> None:
    """Clipping with synchronize/skip_synchronize, zero_grad, LR scheduler, isinstance."""
    size, rank = hvd.size(), hvd.rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    base = torch.optim.SGD(model.parameters(), lr=0.5)
    opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
    assert isinstance(opt, torch.optim.SGD) and isinstance(opt, torch.optim.Optimizer)
    assert opt.state is base.state and opt.param_groups is base.param_groups
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    x = torch.ones(2, 4) * (rank + 1)
    grads: List[torch.Tensor] = []
    for _ in range(2):
        opt.zero_grad()
        model(x).sum().backward()
        opt.synchronize()
        grads.append(model.weight.grad.clone())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
        with opt.skip_synchronize():
            opt.step()
        sched.step()
    want = sum(2.0 * (r + 1) for r in range(size)) / size
    assert torch.allclose(grads[0], torch.full((2, 4), want)), grads[0]
    assert abs(opt.param_groups[0]["lr"] - 0.125) < 1e-12
    # zero_grad while gradients are in flight is refused with a clear message
    opt.zero_grad()
    model(x).sum().backward()
    with raises("zero_grad"):
        opt.zero_grad()
    opt.step()
    opt.zero_grad(set_to_none=False)
    assert model.weight.grad is not None and float(model.weight.grad.abs().sum()) == 0.0
    # step hooks run once per step
    calls: List[int] = []
    opt.register_step_post_hook(lambda *a: calls.append(1))
    model(x).sum().backward()
    opt.step()
    assert calls == [1], calls
    # a parameter without gradient on this rank: zeros are sent, nobody hangs
    extra = torch.nn.Linear(2, 2)
    opt2 = hvd.DistributedOptimizer(
        torch.optim.SGD(list(model.parameters()) + list(extra.parameters()), lr=0.1),
        named_parameters=list(model.named_parameters())
        + [("extra." + n, p) for n, p in extra.named_parameters()],
    )
    out = model(x)
    if rank == 0:
        out = extra(out)
    out.sum().backward()
    opt2.step()
    assert extra.weight.grad is not None
    # backward more often than backward_passes_per_step: clear error
    opt2.zero_grad()
    model(x).sum().backward(retain_graph=False)
    try:
        model(x).sum().backward()
    except hvd.FastPSError as exc:
        assert "backward_passes_per_step" in str(exc), exc
    else:
        raise AssertionError("a second backward before step() was accepted")
    opt2.synchronize()
    print("optimizer api OK")


def main() -> None:
    hvd.init()
    check_basics()
    for dtype in FLOATS + INTS + [torch.bool]:
        check_allreduce(dtype)
        check_allgather(dtype)
        check_broadcast(dtype)
        print(f"dtype {short(dtype)} OK")
    check_sparse_allreduce()
    check_sparse_optimizer()
    check_compression()
    check_objects()
    check_autograd()
    check_errors()
    check_join_barrier()
    check_parameters()
    check_optimizer_api()
    print("ALL OK")
    hvd.shutdown()


if __name__ == "__main__":
    main()
