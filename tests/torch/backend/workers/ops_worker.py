"""Every op of the ``fastps`` torch.distributed backend against a local reference.

``ops_worker.py SUITE``: ``full`` (every dtype torch has, every reduce op, contiguous and
strided tensors, every collective, object collectives, coalescing, subgroups, async work),
``essential`` (the same ops on a few dtypes), ``mismatch`` (ranks disagree on a shape: every
rank gets an error naming the op, and the next op works).

All ranks draw every rank's input from one seed, so each computes the expected result
itself. A wrong value is recorded (the ranks stay in step) and the worker exits 1 listing
every mismatch; an unexpected exception ends the worker (and, through the dead rank, the
job). The last line a rank prints is ``OPS OK rank R checks N``.
"""

from __future__ import annotations

import datetime
import functools
import os
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist
from common import apply_data_path

R = dist.ReduceOp
OPS: Dict[str, Any] = {
    "SUM": R.SUM,
    "AVG": R.AVG,
    "MIN": R.MIN,
    "MAX": R.MAX,
    "PRODUCT": R.PRODUCT,
    "BAND": R.BAND,
    "BOR": R.BOR,
    "BXOR": R.BXOR,
}
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
SIGNED = [torch.int8, torch.int16, torch.int32, torch.int64]
UNSIGNED = [torch.uint8, torch.uint16, torch.uint32, torch.uint64]
COMPLEX = [torch.complex64, torch.complex128]
REDUCIBLE = FLOATS + SIGNED + UNSIGNED + [torch.bool] + COMPLEX
FLOAT8 = [
    getattr(torch, n)
    for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
    if hasattr(torch, n)
]
EVERY_DTYPE = REDUCIBLE + FLOAT8
ESSENTIAL = [torch.float32, torch.bfloat16, torch.int8, torch.uint16, torch.bool, torch.complex64]
SHAPE = (5, 3)
SIGNED_TWIN = {
    torch.uint8: torch.int8,
    torch.uint16: torch.int16,
    torch.uint32: torch.int32,
    torch.uint64: torch.int64,
}


def name_of(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


class Checker:
    """Counts checks and records mismatches (so that every rank keeps calling every op)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.checks = 0
        self.failures: List[str] = []

    def ok(self, what: str, cond: bool, detail: str = "") -> None:
        self.checks += 1
        if not cond:
            self.failures.append(f"{what}: {detail}")

    def tensor(self, what: str, got: torch.Tensor, want: torch.Tensor) -> None:
        """``got`` equals ``want`` (same dtype and shape; exact except float16/bfloat16,
        which allow a rounding of the last bit)."""
        self.checks += 1
        problem = mismatch(got, want)
        if problem:
            self.failures.append(f"{what}: {problem}")

    def raises(
        self,
        what: str,
        exc: type,
        needles: Sequence[str],
        fn: Callable[..., Any],
        *args: Any,
        **kw: Any,
    ) -> None:
        """``fn(*args, **kw)`` raises ``exc`` whose message names every one of ``needles``
        (any of the alternatives a needle lists with ``|``)."""
        self.checks += 1
        try:
            fn(*args, **kw)
        except exc as e:
            msg = str(e)
            missing = [n for n in needles if not any(a in msg for a in n.split("|"))]
            if missing:
                self.failures.append(f"{what}: error message lacks {missing}: {msg!r}")
            return
        except Exception as e:  # noqa: BLE001 - recorded as the wrong kind of error
            self.failures.append(f"{what}: raised {type(e).__name__} ({e}), not {exc.__name__}")
            return
        self.failures.append(f"{what}: did not raise {exc.__name__}")


def mismatch(got: torch.Tensor, want: torch.Tensor) -> str:
    if got.dtype != want.dtype or tuple(got.shape) != tuple(want.shape):
        return f"got {got.dtype}{list(got.shape)}, want {want.dtype}{list(want.shape)}"
    if got.dtype in (torch.float16, torch.bfloat16):
        tol = 2.0**-7 if got.dtype == torch.bfloat16 else 2.0**-10
        same = torch.allclose(got.double(), want.double(), rtol=tol, atol=tol)
    else:
        same = torch.equal(got, want)
    if same:
        return ""
    return f"got {got.tolist()}, want {want.tolist()}"


def raw(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bytes (data movement is checked bit for bit: float8 NaNs included)."""
    return t.contiguous().reshape(-1).view(torch.uint8)


# --------------------------------------------------------------------------- inputs


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def reduce_inputs(dtype: torch.dtype, op: str, n: int, seed: int) -> List[torch.Tensor]:
    """Every rank's input for ``op``: values whose exact result the dtype holds (sums and
    products in range, quarters exact in bfloat16); MIN/MAX/bitwise of unsigned integers
    span the whole range (the upper half is what a signed comparison gets wrong)."""
    g = gen(seed)

    def ints(lo: int, hi: int) -> torch.Tensor:
        return torch.randint(lo, hi, (n, *SHAPE), generator=g, dtype=torch.int64)

    def pick(choices: Sequence[float]) -> torch.Tensor:
        idx = torch.randint(0, len(choices), (n, *SHAPE), generator=g)
        return torch.tensor(choices, dtype=torch.float64)[idx]

    if dtype == torch.bool:
        stack = ints(0, 2).bool()
        stack[:, 0, 0] = True  # one element true everywhere, one false everywhere
        stack[:, 0, 1] = False
    elif dtype in FLOATS:
        stack = (pick([-1, 0.5, 1, 2]) if op == "PRODUCT" else ints(-12, 13) / 4).to(dtype)
    elif dtype in COMPLEX:
        stack = torch.complex(ints(-12, 13) / 4, ints(-12, 13) / 4).to(dtype)
    elif dtype in SIGNED:
        info = torch.iinfo(dtype)
        if op == "PRODUCT":
            stack = pick([-1, 1, 2]).to(dtype)
        elif op in ("BAND", "BOR", "BXOR", "MIN", "MAX"):
            stack = full_range(g, dtype, n)
        else:
            stack = ints(-30, 31).to(dtype)
        assert info.bits >= 8
    else:  # unsigned
        if op == "PRODUCT":
            stack = pick([1, 2, 3]).to(torch.int64).to(dtype)
        elif op in ("BAND", "BOR", "BXOR", "MIN", "MAX"):
            stack = full_range(g, SIGNED_TWIN[dtype], n).view(dtype)
        else:
            stack = ints(0, 60).to(dtype)
    return [stack[i].clone() for i in range(n)]


def full_range(g: torch.Generator, dtype: torch.dtype, n: int) -> torch.Tensor:
    """Random bits of a signed integer dtype (both halves of its range)."""
    words = torch.randint(-(2**31), 2**31, (n, *SHAPE, 2), generator=g, dtype=torch.int64)
    bits = (words[..., 0] << 32) ^ (words[..., 1] & 0xFFFFFFFF)
    return bits.to(dtype)  # narrower dtypes keep the low bits


def reference(stack: Sequence[torch.Tensor], dtype: torch.dtype, op: str) -> torch.Tensor:
    """The reduction of the ranks' inputs, computed here (numpy, exact)."""
    n = len(stack)
    if dtype == torch.bool:
        a = np.stack([t.numpy() for t in stack])
        if op in ("SUM", "MAX", "BOR"):  # a sum of bools is their logical OR
            r = a.any(0)
        elif op in ("MIN", "PRODUCT", "BAND"):
            r = a.all(0)
        else:
            r = np.logical_xor.reduce(a, 0)
        return torch.from_numpy(np.ascontiguousarray(r))
    if dtype == torch.bfloat16:
        a = np.stack([t.float().numpy() for t in stack])
    else:
        a = np.stack([t.numpy() for t in stack])
    if op == "SUM":
        r = a.sum(0, dtype=a.dtype)
    elif op == "AVG":
        if dtype.is_floating_point or dtype.is_complex:
            r = a.sum(0, dtype=a.dtype) / n
        else:  # integer average: rounded toward zero
            r = np.trunc(a.astype(np.float64).sum(0) / n).astype(a.dtype)
    elif op == "MIN":
        r = a.min(0)
    elif op == "MAX":
        r = a.max(0)
    elif op == "PRODUCT":
        r = a.prod(0, dtype=a.dtype)
    else:
        fn = {"BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}[op]
        r = fn.reduce(a, 0)
    out = torch.from_numpy(np.ascontiguousarray(r).astype(a.dtype, copy=False))
    return out.to(dtype)


def unsupported(dtype: torch.dtype, op: str) -> Optional[List[str]]:
    """For a combination the backend must refuse: what the ValueError's message names."""
    if op in ("BAND", "BOR", "BXOR") and dtype in FLOATS:
        return [op, name_of(dtype)]
    if dtype in COMPLEX and op not in ("SUM", "AVG"):
        return [op, "complex"]
    if op == "AVG" and dtype in (torch.uint64, torch.bool):
        return [op, name_of(dtype)]
    return None


def strided(value: torch.Tensor, sentinel: torch.Tensor) -> torch.Tensor:
    """``value`` in a non-contiguous view (every other column of a wider buffer whose other
    columns hold ``sentinel``)."""
    rows, cols = value.shape
    buf = sentinel.expand(rows, 2 * cols).clone()
    view = buf[:, ::2]
    view.copy_(value)
    assert not view.is_contiguous()
    return view


def untouched(buf_view: torch.Tensor, sentinel: torch.Tensor) -> bool:
    """The columns between a strided view's columns still hold the sentinel."""
    base = buf_view._base if buf_view._base is not None else buf_view
    return bool(torch.equal(raw(base[:, 1::2]), raw(sentinel.expand_as(base[:, 1::2]))))


def sentinel_of(dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.tensor(True)
    if dtype in FLOAT8:
        return torch.tensor(0x5A, dtype=torch.uint8).view(dtype)
    return torch.tensor(77).to(dtype)


# --------------------------------------------------------------------------- reductions


def check_all_reduce(c: Checker, dtypes: Sequence[torch.dtype], layouts: Sequence[str]) -> None:
    """all_reduce: every dtype x every op, contiguous and strided (and the refusals)."""
    r, n = dist.get_rank(), dist.get_world_size()
    for di, dtype in enumerate(dtypes):
        for oi, (op, rop) in enumerate(OPS.items()):
            vals = reduce_inputs(dtype, op, n, seed=1000 + 10 * di + oi)
            what = f"all_reduce {name_of(dtype)} {op}"
            refusal = unsupported(dtype, op)
            if refusal is not None:
                x = vals[r].clone()
                c.raises(what, ValueError, refusal, dist.all_reduce, x, op=rop)
                continue
            want = reference(vals, dtype, op)
            for layout in layouts:
                if layout == "contiguous":
                    x = vals[r].clone()
                    dist.all_reduce(x, op=rop)
                    c.tensor(what, x, want)
                else:
                    s = sentinel_of(dtype)
                    x = strided(vals[r], s)
                    dist.all_reduce(x, op=rop)
                    c.tensor(f"{what} strided", x.contiguous(), want)
                    c.ok(f"{what} strided", untouched(x, s), "wrote outside the view")
    # float8 and other dtypes the servers do not reduce: refused, naming op and dtype
    for dtype in FLOAT8[:1]:
        x = torch.zeros(4).to(dtype)
        needles = ["allreduce|all_reduce", "SUM", name_of(dtype)]
        c.raises(f"all_reduce {name_of(dtype)}", ValueError, needles, dist.all_reduce, x)


def check_reduce(c: Checker, dtypes: Sequence[torch.dtype], ops: Sequence[str]) -> None:
    """reduce to a root (which rotates): only the root's tensor holds the result."""
    r, n = dist.get_rank(), dist.get_world_size()
    for di, dtype in enumerate(dtypes):
        for oi, op in enumerate(ops):
            vals = reduce_inputs(dtype, op, n, seed=2000 + 10 * di + oi)
            dst = (di + oi) % n
            what = f"reduce {name_of(dtype)} {op} dst={dst}"
            refusal = unsupported(dtype, op)
            x = vals[r].clone()
            if refusal is not None:
                c.raises(what, ValueError, refusal, dist.reduce, x, dst=dst, op=OPS[op])
                continue
            dist.reduce(x, dst=dst, op=OPS[op])
            if r == dst:
                c.tensor(what, x, reference(vals, dtype, op))


def check_reduce_scatter(c: Checker, dtypes: Sequence[torch.dtype], ops: Sequence[str]) -> None:
    """reduce_scatter_tensor (every op) and reduce_scatter of a list: rank j gets the
    reduction of every rank's j-th slice."""
    r, n = dist.get_rank(), dist.get_world_size()
    for di, dtype in enumerate(dtypes):
        for oi, op in enumerate(ops):
            # every rank's input: n slices of SHAPE (one per destination rank)
            slices = [
                reduce_inputs(dtype, op, n, seed=3000 + 100 * di + 10 * oi + j) for j in range(n)
            ]
            mine = torch.stack([slices[j][r] for j in range(n)])  # (n, *SHAPE)
            what = f"reduce_scatter_tensor {name_of(dtype)} {op}"
            refusal = unsupported(dtype, op)
            out = torch.empty(SHAPE, dtype=dtype)
            if refusal is not None:
                rows = mine.reshape(-1, 3)
                c.raises(
                    what, ValueError, refusal, dist.reduce_scatter_tensor, out, rows, op=OPS[op]
                )
                continue
            want = reference([slices[r][i] for i in range(n)], dtype, op)
            dist.reduce_scatter_tensor(out, mine.reshape(-1, 3), op=OPS[op])
            c.tensor(what, out, want)
            if op in ("SUM", "MAX"):
                out2 = torch.empty(SHAPE, dtype=dtype)
                dist.reduce_scatter(out2, [mine[j].clone() for j in range(n)], op=OPS[op])
                c.tensor(f"reduce_scatter(list) {name_of(dtype)} {op}", out2, want)


# --------------------------------------------------------------------------- data movement


def movement_inputs(dtype: torch.dtype, n: int, seed: int, rows: int = 4) -> List[torch.Tensor]:
    """Random bits of ``dtype`` (0/1 for bool) for every rank."""
    g = gen(seed)
    if dtype == torch.bool:
        return [torch.randint(0, 2, (rows, 3), generator=g).bool() for _ in range(n)]
    size = torch.tensor([], dtype=dtype).element_size()
    out = []
    for _ in range(n):
        b = torch.randint(0, 256, (rows, 3 * size), generator=g, dtype=torch.int64)
        out.append(b.to(torch.uint8).view(dtype))
    return out


def check_movement(c: Checker, dtypes: Sequence[torch.dtype]) -> None:
    """broadcast, all_gather (+ into_tensor), all_to_all(_single, even and uneven), gather,
    scatter: bit for bit, every dtype (float8 included), strided inputs and outputs."""
    r, n = dist.get_rank(), dist.get_world_size()
    for di, dtype in enumerate(dtypes):
        dn = name_of(dtype)
        vals = movement_inputs(dtype, n, seed=4000 + di)
        src = (di + 1) % n
        s = sentinel_of(dtype)
        # broadcast, contiguous and strided
        x = vals[r].clone()
        dist.broadcast(x, src=src)
        c.ok(f"broadcast {dn} src={src}", torch.equal(raw(x), raw(vals[src])), f"rank {r}")
        x = strided(vals[r], s)
        dist.broadcast(x, src=src)
        c.ok(f"broadcast {dn} strided", torch.equal(raw(x), raw(vals[src])), f"rank {r}")
        c.ok(f"broadcast {dn} strided", untouched(x, s), "wrote outside the view")
        # all_gather into a list (of strided outputs) and into one tensor
        outs = [strided(torch.zeros_like(vals[0]), s) for _ in range(n)]
        dist.all_gather(outs, strided(vals[r], s))
        for j, o in enumerate(outs):
            c.ok(f"all_gather {dn} [{j}]", torch.equal(raw(o), raw(vals[j])), f"rank {r}")
            c.ok(f"all_gather {dn} [{j}]", untouched(o, s), "wrote outside the view")
        big = torch.empty((n * vals[0].shape[0], 3), dtype=dtype)
        dist.all_gather_into_tensor(big, vals[r])
        c.ok(f"all_gather_into_tensor {dn}", torch.equal(raw(big), raw(torch.cat(vals))), "")
        # all_to_all_single, even: rank r's block j goes to rank j
        blocks = [movement_inputs(dtype, n, seed=5000 + 10 * di + j, rows=2) for j in range(n)]
        inp = torch.cat([blocks[j][r] for j in range(n)])
        out = torch.empty_like(inp)
        dist.all_to_all_single(out, inp)
        want = torch.cat([blocks[r][i] for i in range(n)])
        c.ok(f"all_to_all_single {dn}", torch.equal(raw(out), raw(want)), f"rank {r}")
        # uneven: rank i sends j+i+1 rows to rank j (one rank sends nothing to rank 0)
        rows_ij = [[(j + i + 1) % (n + 1) for j in range(n)] for i in range(n)]
        parts = [
            [
                movement_inputs(dtype, 1, seed=6000 + 100 * di + 10 * i + j, rows=rows_ij[i][j])[0]
                for j in range(n)
            ]
            for i in range(n)
        ]
        inp = torch.cat(parts[r])
        out = torch.empty((sum(rows_ij[i][r] for i in range(n)), 3), dtype=dtype)
        dist.all_to_all_single(
            out, inp, [rows_ij[i][r] for i in range(n)], [rows_ij[r][j] for j in range(n)]
        )
        want = torch.cat([parts[i][r] for i in range(n)])
        c.ok(f"all_to_all_single uneven {dn}", torch.equal(raw(out), raw(want)), f"rank {r}")
        # all_to_all of lists
        outs = [torch.empty_like(blocks[0][0]) for _ in range(n)]
        dist.all_to_all(outs, [blocks[j][r].clone() for j in range(n)])
        for i, o in enumerate(outs):
            c.ok(f"all_to_all {dn} from {i}", torch.equal(raw(o), raw(blocks[r][i])), "")
        # gather to one rank, scatter from another
        dst = di % n
        g = [torch.empty_like(vals[0]) for _ in range(n)] if r == dst else None
        dist.gather(vals[r], g, dst=dst)
        if g is not None:
            for j, o in enumerate(g):
                c.ok(f"gather {dn} dst={dst} [{j}]", torch.equal(raw(o), raw(vals[j])), "")
        out = torch.empty_like(vals[0])
        dist.scatter(out, [v.clone() for v in vals] if r == src else None, src=src)
        c.ok(f"scatter {dn} src={src}", torch.equal(raw(out), raw(vals[r])), f"rank {r}")


def check_objects(c: Checker) -> None:
    """Object collectives, objects of different sizes per rank."""
    r, n = dist.get_rank(), dist.get_world_size()

    def obj(i: int) -> Dict[str, Any]:
        return {"rank": i, "blob": "x" * (10 + 1000 * i), "t": torch.arange(i + 1)}

    def same(a: Any, b: Any) -> bool:
        return a["rank"] == b["rank"] and a["blob"] == b["blob"] and torch.equal(a["t"], b["t"])

    got: List[Any] = [None] * n
    dist.all_gather_object(got, obj(r))
    c.ok("all_gather_object", all(same(got[i], obj(i)) for i in range(n)), str(got)[:200])
    src = n - 1
    lst: List[Any] = [obj(src), [1, 2, 3], "end"] if r == src else [None, None, None]
    dist.broadcast_object_list(lst, src=src)
    c.ok("broadcast_object_list", same(lst[0], obj(src)) and lst[1:] == [[1, 2, 3], "end"], "")
    dst = n - 1
    gl: Optional[List[Any]] = [None] * n if r == dst else None
    dist.gather_object(obj(r), gl, dst=dst)
    if gl is not None:
        c.ok("gather_object", all(same(gl[i], obj(i)) for i in range(n)), str(gl)[:200])
    out: List[Any] = [None]
    dist.scatter_object_list(out, [obj(i) for i in range(n)] if r == 0 else None, src=0)
    c.ok("scatter_object_list", same(out[0], obj(r)), str(out)[:200])


# --------------------------------------------------------------------------- async, coalesced


def check_async(c: Checker) -> None:
    """async_op=True: work.wait(), get_future().then(...), several in flight waited for in
    reverse order, and an async error surfacing on the future."""
    r, n = dist.get_rank(), dist.get_world_size()
    total = n * (n - 1) / 2
    xs = [torch.full((1000 + k,), float(r + k)) for k in range(4)]
    works = [dist.all_reduce(x, async_op=True) for x in xs]
    chained = works[0].get_future().then(lambda f: f.value()[0].sum().item())
    for w in reversed(works):
        w.wait()
    for k, x in enumerate(xs):
        c.ok(f"async all_reduce {k}", bool(torch.all(x == total + n * k)), str(x[:3]))
    c.ok("get_future().then", chained.wait() == total * 1000, f"got {chained.wait()}")
    c.ok("is_completed", all(w.is_completed() for w in works), "")
    b = torch.full((3,), float(r))
    w = dist.broadcast(b, src=n - 1, async_op=True)
    fut = w.get_future()
    c.ok("async broadcast future", bool(torch.all(fut.wait()[0] == n - 1)), str(b))
    outs = [torch.empty(2) for _ in range(n)]
    w = dist.all_gather(outs, torch.full((2,), float(r)), async_op=True)
    w.wait()
    c.ok("async all_gather", all(bool(torch.all(o == i)) for i, o in enumerate(outs)), "")
    w = dist.barrier(async_op=True)
    w.wait()
    c.ok("async barrier", w.is_completed(), "")


def check_coalesced(c: Checker) -> None:
    """all_reduce_coalesced and dist._coalescing_manager (all_reduce, all_gather_into_tensor,
    reduce_scatter_tensor; sync and async)."""
    r, n = dist.get_rank(), dist.get_world_size()
    ts = [torch.full((k + 1,), float(r + k)) for k in range(3)]
    dist.all_reduce_coalesced(ts)
    total = n * (n - 1) / 2
    c.ok(
        "all_reduce_coalesced",
        all(bool(torch.all(t == total + n * k)) for k, t in enumerate(ts)),
        str(ts),
    )
    xs = [torch.full((10 * (k + 1),), float(r * k)) for k in range(3)]
    with dist._coalescing_manager():
        for x in xs:
            dist.all_reduce(x)
    c.ok(
        "_coalescing_manager all_reduce",
        all(bool(torch.all(x == total * k)) for k, x in enumerate(xs)),
        "",
    )
    xs = [torch.full((7,), float(r + k)) for k in range(3)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for x in xs:
            dist.all_reduce(x, op=R.MAX)
    cm.wait()
    c.ok(
        "_coalescing_manager async MAX",
        all(bool(torch.all(x == n - 1 + k)) for k, x in enumerate(xs)),
        "",
    )
    ins = [torch.full((2,), float(r * 10 + k)) for k in range(2)]
    outs = [torch.empty(2 * n) for _ in range(2)]
    with dist._coalescing_manager():
        for o, i in zip(outs, ins):
            dist.all_gather_into_tensor(o, i)
    want = [torch.tensor([float(j * 10 + k) for j in range(n) for _ in range(2)]) for k in range(2)]
    c.ok(
        "_coalescing_manager all_gather_into_tensor",
        all(torch.equal(o, w) for o, w in zip(outs, want)),
        str(outs),
    )
    ins = [torch.arange(3 * n, dtype=torch.float64) + r + k for k in range(2)]
    outs = [torch.empty(3, dtype=torch.float64) for _ in range(2)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for o, i in zip(outs, ins):
            dist.reduce_scatter_tensor(o, i)
    cm.wait()
    want = [n * (torch.arange(3 * r, 3 * r + 3, dtype=torch.float64) + k) + total for k in range(2)]
    c.ok(
        "_coalescing_manager reduce_scatter_tensor",
        all(torch.equal(o, w) for o, w in zip(outs, want)),
        str(outs),
    )


# --------------------------------------------------------------------------- subgroups


def check_subgroups(c: Checker) -> None:
    """new_group: a pair, a group without rank 0, overlapping groups used in turns, and
    every member set running its ops alone while the others run theirs."""
    r, n = dist.get_rank(), dist.get_world_size()
    specs = {
        "ends": sorted({0, n - 1}),
        "without0": list(range(1, n)),
        "lower": list(range(0, (n + 1) // 2 + 1)),  # overlaps 'upper' in the middle
        "upper": list(range(n // 2, n)),
        "evens": list(range(0, n, 2)),
    }
    groups = {k: dist.new_group(v) for k, v in specs.items()}
    for round_ in range(2):
        for key, ranks in specs.items():
            if r not in ranks:
                continue
            g = groups[key]
            gr = dist.get_rank(g)
            c.ok(
                f"group {key} rank",
                gr == ranks.index(r) and dist.get_world_size(g) == len(ranks),
                "",
            )
            x = torch.full((3,), float(r + round_))
            dist.all_reduce(x, group=g)
            want = sum(ranks) + len(ranks) * round_
            c.ok(f"group {key} all_reduce", bool(torch.all(x == want)), f"{x} != {want}")
            y = torch.full((2,), float(r))
            dist.broadcast(y, src=ranks[-1], group=g)
            c.ok(f"group {key} broadcast", bool(torch.all(y == ranks[-1])), str(y))
            outs = [torch.empty(1, dtype=torch.int64) for _ in ranks]
            dist.all_gather(outs, torch.tensor([r]), group=g)
            c.ok(f"group {key} all_gather", [int(o) for o in outs] == ranks, str(outs))
            o = torch.empty(2)
            dist.reduce_scatter_tensor(o, torch.arange(2.0 * len(ranks)) + r, group=g)
            want_rs = len(ranks) * torch.arange(2.0 * gr, 2.0 * gr + 2) + sum(ranks)
            c.ok(f"group {key} reduce_scatter_tensor", torch.equal(o, want_rs), f"{o} != {want_rs}")
            w = dist.all_reduce(torch.ones(1), group=g, async_op=True)
            w.wait()
            dist.barrier(group=g)
        x = torch.ones(2)
        dist.all_reduce(x)  # the world group keeps working between the subgroups' ops
        c.ok("world between subgroups", bool(torch.all(x == n)), str(x))
    for g in groups.values():
        dist.destroy_process_group(g)


# --------------------------------------------------------------------------- the rest


def check_misc(c: Checker) -> None:
    """barrier, the backend's name, the data path, point-to-point refused."""
    r, n = dist.get_rank(), dist.get_world_size()
    c.ok("backend name", dist.get_backend() == "fastps", dist.get_backend())
    from fastps.launch import store_rendezvous

    job = store_rendezvous.started()
    assert job is not None
    hosts = n if os.environ.get("FASTPS_TEST_DISTINCT_HOSTS") == "1" else 1
    c.ok("job's hosts", len(job["hosts"]) == hosts, f"{job['hosts']} (want {hosts})")
    dist.barrier()
    peer = (r + 1) % n
    p2p = ["point-to-point"]
    c.raises("send", RuntimeError, ["send", *p2p], dist.send, torch.ones(1), dst=peer)
    c.raises("recv", RuntimeError, ["recv", *p2p], dist.recv, torch.ones(1), src=peer)
    # a scalar (0-d) tensor and an empty one
    z = torch.tensor(float(r + 1))
    dist.all_reduce(z)
    c.ok("0-d all_reduce", float(z) == n * (n + 1) / 2, str(z))
    e = torch.empty(0)
    dist.all_reduce(e)
    c.ok("empty all_reduce", e.numel() == 0, "")


def check_mismatch(c: Checker) -> None:
    """Ranks pass different shapes to all_reduce: every rank gets an error naming the op
    (no hang), and the next op works."""
    r, n = dist.get_rank(), dist.get_world_size()
    t0 = time.monotonic()
    x = torch.ones(4 if r == 0 else 5)
    try:
        dist.all_reduce(x)
    except Exception as e:  # noqa: BLE001 - inspected below
        msg = str(e)
        print(f"rank {r}: mismatch error: {type(e).__name__}: {msg[:300]}", flush=True)
        # the op by its name in the group (c10d.<group>.<n>), what differs, and both values
        c.ok("mismatch names the op", "'c10d.0.0'" in msg, msg)
        c.ok("mismatch names the shapes", "shape" in msg and "[4]" in msg and "[5]" in msg, msg)
    else:
        c.ok("mismatch raised", False, f"all_reduce of {list(x.shape)} returned {x.tolist()}")
    c.ok("mismatch error quick", time.monotonic() - t0 < 30, f"{time.monotonic() - t0:.1f} s")
    y = torch.full((3,), float(r))
    dist.all_reduce(y)
    c.ok("all_reduce after the mismatch", bool(torch.all(y == n * (n - 1) / 2)), str(y))
    w = dist.all_reduce(torch.ones(2 + r), async_op=True)  # and an async one
    try:
        w.wait()
    except Exception as e:  # noqa: BLE001
        print(f"rank {r}: async mismatch error: {type(e).__name__}: {str(e)[:300]}", flush=True)
        c.ok("async mismatch names the op", "'c10d.0.2'" in str(e) and "shape" in str(e), str(e))
    else:
        c.ok("async mismatch raised", False, "wait() returned")
    # the work's future fails too (what DDP and .then() callbacks see)
    w = dist.all_reduce(torch.ones(3 + r), async_op=True)
    chained = w.get_future().then(lambda f: f.value())
    for what, fut in (("get_future()", w.get_future()), ("then()", chained)):
        try:
            fut.wait()
        except Exception as e:  # noqa: BLE001
            c.ok(f"{what} of a failed op", "'c10d.0.3'" in str(e) and "shape" in str(e), str(e))
        else:
            c.ok(f"{what} of a failed op raised", False, "wait() returned")
    c.ok("is_success of a failed op", not w.is_success(), "")
    outs = [torch.empty(2) for _ in range(n)]
    dist.all_gather(outs, torch.full((2,), float(r)))
    c.ok("all_gather after", all(bool(torch.all(o == i)) for i, o in enumerate(outs)), str(outs))


def main() -> int:
    apply_data_path()
    suite = sys.argv[1] if len(sys.argv) > 1 else "full"
    t_init = time.monotonic()
    dist.init_process_group("fastps", timeout=datetime.timedelta(seconds=60))
    r = dist.get_rank()
    print(f"rank {r}: joined in {time.monotonic() - t_init:.1f} s at {time.time():.2f}", flush=True)
    c = Checker(r)
    t0 = time.monotonic()
    steps: List[Callable[[], None]]
    if suite == "mismatch":
        steps = [functools.partial(check_mismatch, c)]
    else:
        full = suite == "full"
        dtypes = REDUCIBLE if full else ESSENTIAL
        ops = list(OPS) if full else ["SUM", "AVG", "MAX", "BXOR"]
        steps = [
            functools.partial(check_misc, c),
            functools.partial(check_all_reduce, c, dtypes, ["contiguous", "strided"]),
            functools.partial(check_reduce, c, dtypes, ops),
            functools.partial(check_reduce_scatter, c, dtypes, ops),
            functools.partial(check_movement, c, EVERY_DTYPE if full else ESSENTIAL + FLOAT8[:1]),
            functools.partial(check_objects, c),
            functools.partial(check_async, c),
            functools.partial(check_coalesced, c),
            functools.partial(check_subgroups, c),
        ]
    for step in steps:
        s0 = time.monotonic()
        step()
        if r == 0:
            name = getattr(step, "func", step).__name__
            print(f"{name}: {time.monotonic() - s0:.2f} s", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {r}: done at {time.time():.2f}", flush=True)
    if c.failures:
        for f in c.failures:
            print(f"FAIL rank {r}: {f}", flush=True)
        print(f"OPS FAILED rank {r}: {len(c.failures)} of {c.checks} checks", flush=True)
        return 1
    print(f"OPS OK rank {r} checks {c.checks} in {time.monotonic() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
