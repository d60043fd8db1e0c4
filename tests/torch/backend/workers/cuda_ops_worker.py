"""The ``fastps`` backend's collectives on CUDA tensors (staged through host memory).

Each rank works on ``cuda:LOCAL_RANK % device_count`` and builds its inputs with kernels
queued on a side stream (so a staging copy that did not wait for the producer would read
garbage), calls every collective, and checks the results (on the device they were given on)
against a reference computed on the CPU from every rank's inputs, which all ranks draw from
one seed. Async work is checked through ``wait()`` and through ``get_future().then``; the
object collectives run with CUDA as the group's device. The last line a rank prints is
``CUDA OPS OK rank R checks N``; a mismatch prints ``FAIL rank R: ...`` and exits 1.
"""

from __future__ import annotations

import datetime
import os
import sys
from typing import List

import torch
import torch.distributed as dist
from common import apply_data_path

DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
    torch.complex64,
]
SHAPE = (257, 3)  # odd sizes: no part boundary lines up by chance


class Checker:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.checks = 0
        self.failures: List[str] = []

    def tensor(
        self, what: str, got: torch.Tensor, want: torch.Tensor, device: torch.device
    ) -> None:
        self.checks += 1
        if got.device != device:
            self.failures.append(f"{what}: result on {got.device}, not {device}")
            return
        g, w = got.cpu(), want.cpu()
        if g.dtype != w.dtype or g.shape != w.shape:
            self.failures.append(
                f"{what}: got {g.dtype}{list(g.shape)}, want {w.dtype}{list(w.shape)}"
            )
            return
        if g.dtype in (torch.float16, torch.bfloat16):
            ok = torch.allclose(g.double(), w.double(), rtol=2e-2, atol=0.0)
        else:
            ok = torch.equal(g, w)
        if not ok:
            first_got, first_want = g.reshape(-1)[:4].tolist(), w.reshape(-1)[:4].tolist()
            self.failures.append(f"{what}: values differ (got {first_got}, want {first_want})")


def inputs(dtype: torch.dtype, n: int, seed: int) -> List[torch.Tensor]:
    """Every rank's input (CPU): small integers, so sums are exact in every dtype."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        v = torch.randint(0, 4, SHAPE, generator=g)
        if dtype == torch.bool:
            out.append(v > 1)
        elif dtype.is_complex:
            out.append(torch.complex(v.float(), (v + 1).float()).to(dtype))
        else:
            out.append(v.to(dtype))
    return out


def on_side_stream(
    cpu: torch.Tensor, device: torch.device, side: torch.cuda.Stream
) -> torch.Tensor:
    """``cpu``'s values, produced by kernels queued on ``side`` (a long one first)."""
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # ~tens of ms: a copy that does not wait reads zeros
        t = torch.zeros(SHAPE, dtype=cpu.dtype, device=device)
        t.copy_(cpu.to(device, non_blocking=False))
    torch.cuda.current_stream(device).wait_stream(side)
    return t


def main() -> int:
    apply_data_path()
    dist.init_process_group("fastps", timeout=datetime.timedelta(seconds=90))
    rank, n = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(device)
    side = torch.cuda.Stream(device)
    c = Checker(rank)

    for k, dtype in enumerate(DTYPES):
        tag = str(dtype).replace("torch.", "")
        vals = inputs(dtype, n, seed=10 + k)
        stack = torch.stack([v.to(torch.int64) if dtype == torch.bool else v for v in vals])
        ops = [("SUM", dist.ReduceOp.SUM), ("MAX", dist.ReduceOp.MAX)]
        if dtype.is_complex:
            ops = ops[:1]
        for op_name, op in ops:
            if dtype == torch.bool:
                want = stack.amax(0).bool() if op_name == "MAX" else stack.sum(0).bool()
            elif op_name == "MAX":
                want = stack.amax(0)
            else:
                want = stack.sum(0).to(dtype)
            t = on_side_stream(vals[rank], device, side)
            dist.all_reduce(t, op=op)
            c.tensor(f"all_reduce {op_name} {tag}", t, want, device)
        # strided (a column of a wider tensor), async, read through the future
        wide = torch.zeros((SHAPE[0], 6), dtype=dtype, device=device)
        wide[:, ::2] = vals[rank].to(device)
        col = wide[:, ::2]
        work = dist.all_reduce(col, op=dist.ReduceOp.SUM, async_op=True)
        fut = work.get_future().then(
            lambda f: f.value()[0] if isinstance(f.value(), list) else f.value()
        )
        got = fut.wait()
        want_sum = stack.sum(0).bool() if dtype == torch.bool else stack.sum(0).to(dtype)
        if dtype.is_complex:  # torch hands a backend complex tensors as real views
            c.tensor(f"future value {tag}", got, torch.view_as_real(want_sum), device)
        else:
            c.tensor(f"future value {tag}", got, want_sum, device)
        c.tensor(f"all_reduce strided async {tag}", col, want_sum, device)
        c.tensor(
            f"all_reduce strided leaves other columns {tag}",
            wide[:, 1::2],
            torch.zeros((SHAPE[0], 3), dtype=dtype),
            device,
        )

        b = on_side_stream(vals[rank], device, side)
        dist.broadcast(b, src=n - 1)
        c.tensor(f"broadcast {tag}", b, vals[n - 1], device)

        big = torch.empty((n * SHAPE[0], SHAPE[1]), dtype=dtype, device=device)
        dist.all_gather_into_tensor(big, on_side_stream(vals[rank], device, side))
        c.tensor(f"all_gather_into_tensor {tag}", big, torch.cat(vals), device)
        outs = [torch.empty(SHAPE, dtype=dtype, device=device) for _ in range(n)]
        w = dist.all_gather(outs, on_side_stream(vals[rank], device, side), async_op=True)
        w.wait()
        for j in range(n):
            c.tensor(f"all_gather[{j}] async {tag}", outs[j], vals[j], device)

        a2a_in = on_side_stream(vals[rank], device, side)  # rows split evenly... 257 is not
        rows = SHAPE[0] - SHAPE[0] % n
        out = torch.empty((rows, SHAPE[1]), dtype=dtype, device=device)
        dist.all_to_all_single(out, a2a_in[:rows].contiguous())
        per = rows // n
        want_a2a = torch.cat([vals[j][rank * per : (rank + 1) * per] for j in range(n)])
        c.tensor(f"all_to_all_single {tag}", out, want_a2a, device)

        if dtype not in (torch.bool, torch.uint8):
            rs_in = torch.cat([v for v in vals]).to(device)  # every rank: n rows of blocks
            rs_in = rs_in * (rank + 1) if not dtype.is_complex else rs_in
            rs_out = torch.empty(SHAPE, dtype=dtype, device=device)
            dist.reduce_scatter_tensor(rs_out, rs_in)
            factor = sum(r + 1 for r in range(n)) if not dtype.is_complex else n
            c.tensor(
                f"reduce_scatter_tensor {tag}", rs_out, (vals[rank] * factor).to(dtype), device
            )

    # AVG of floats, and a gradient-sized float32 tensor (several parts on the wire).
    g = torch.full((3_000_000,), float(rank + 1), device=device)
    dist.all_reduce(g, op=dist.ReduceOp.AVG)
    c.tensor("all_reduce AVG 12 MB", g, torch.full((3_000_000,), (n + 1) / 2.0), device)

    objs: List[object] = [None] * n
    dist.all_gather_object(objs, {"rank": rank, "t": torch.arange(rank + 1)})
    c.checks += 1
    if [o["rank"] for o in objs] != list(range(n)):  # type: ignore[index]
        c.failures.append(f"all_gather_object: {objs}")
    box: List[object] = [f"from rank {rank}"]
    dist.broadcast_object_list(box, src=0)
    c.checks += 1
    if box != ["from rank 0"]:
        c.failures.append(f"broadcast_object_list: {box}")
    dist.barrier(device_ids=[device.index])
    torch.cuda.synchronize(device)

    for f in c.failures:
        print(f"FAIL rank {rank}: {f}", flush=True)
    dist.destroy_process_group()
    if c.failures:
        return 1
    print(f"CUDA OPS OK rank {rank} checks {c.checks}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
