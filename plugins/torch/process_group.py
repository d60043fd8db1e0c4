"""The ``fastps`` torch.distributed backend: ``dist.init_process_group("fastps")``.

A :class:`FastPSProcessGroup` is a ``torch.distributed.ProcessGroup`` whose collectives run
on fastps's collective layer (``fastps.collectives.ops``: the summation servers, routed
blocks for data movement), so DDP, FSDP2, Lightning, Hugging Face, Ray Train and Spark's
TorchDistributor train on fastps unchanged. How the pieces map:

* the job forms through the store the creator receives (``fastps.launch.store_rendezvous``):
  no fastpsrun, no separate scheduler; the default group is fastps's global process set and
  every ``new_group`` a process set its members register (ids agreed through the store);
* tensors of every dtype torch has travel: data movement (broadcast, gathers, scatters,
  all-to-all) moves bytes; reductions run in a dtype the servers sum (complex as pairs of
  reals, unsigned integers in their signed twins) or refuse the dtype naming the op;
* each op is named ``c10d.<group>.<n>`` in call order (the names repeat after ``WINDOW``
  ops, so the servers' key tables stay bounded however long the job runs);
* a work object is a ``torch.futures.Future`` the group's completion thread fulfils in
  call order (collectives of one group complete in order on every member); an error
  (a mismatch, a dead rank: the scheduler names it) is set on the future;
* CUDA tensors are copied to host memory when the op is called (after the caller's
  stream's work on them) and back on the completion thread; the work's future names their
  devices, so a waiter's stream waits for the copies back;
* ``allreduce`` priorities follow DDP's bucket order, first issued first: within a burst of
  allreduces (issued while earlier ones are in flight, as DDP's backward does) each later
  one is one lower. DDP's next forward pass waits for every bucket, so putting a later
  bucket first (it holds the layers the forward pass needs first) cannot start it sooner;
  it only lets the workers' orders diverge when the bucket reaches them at different times,
  which cost 2% of ResNet-50's DDP iteration on the rack
  (docs/results/ddp-fastps-2026-11-30/README.md).
"""

from __future__ import annotations

import datetime
import logging
import queue
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple, Union

import numpy as np
import torch
import torch.distributed as dist
from fastps.collectives import ops as C
from fastps.collectives.ops import ProcessSet, ReduceOp
from fastps.config import scheduler_given, torch_launched
from fastps.errors import FastPSError
from fastps.worker import api as _api
from torch.futures import Future

__all__ = ["FastPSProcessGroup", "create_process_group", "register", "BACKEND"]

log = logging.getLogger("fastps.torch.process_group")

BACKEND = "fastps"
# CUDA tensors are staged through host memory (a GPU job with CPU servers needs no second
# backend for its GPU tensors).
DEVICES = ("cpu", "cuda")
WINDOW = 4096  # op names repeat after this many ops of a group
SET_SEQ_KEY = "fastps/member_set_seq"
SET_ID_KEY = "fastps/process_set_id"

_Work = Any  # torch._C._distributed_c10d.Work


def _value(fut: Future) -> Any:
    return fut.value()  # raises the op's error (Future.set_exception)


class _FastPSWork(dist.Work):
    """The work of one op. torch's future-wrapping work
    (``_create_work_from_future``) returns True from ``wait()`` even when its future
    failed (``Future.set_exception`` stores the error as the value), so an op's error
    never reached the caller. Here ``wait()`` raises the op's own error, and
    ``get_future()`` is a future failed with it (for torch's C++ side too: DDP)."""

    def __init__(self, fut: Future) -> None:
        super().__init__()
        self._fut = fut
        self._out = fut.then(_value)

    def wait(self, timeout: Any = None) -> bool:
        self._fut.wait()
        return True

    def get_future(self) -> Future:
        return self._out

    def is_completed(self) -> bool:
        return self._fut.done()

    def is_success(self) -> bool:
        return self.exception() is None if self._fut.done() else False

    def exception(self) -> Optional[BaseException]:
        if not self._fut.done():
            return None
        try:
            self._fut.wait()
        except BaseException as exc:  # noqa: BLE001 - the op's error, handed back
            return exc
        return None

    def result(self) -> Any:
        return self._fut.wait()


_create_work = _FastPSWork


def _cuda_devices(obj: Any, found: Set[torch.device]) -> None:
    if isinstance(obj, torch.Tensor):
        if obj.device.type == "cuda":
            found.add(obj.device)
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            _cuda_devices(item, found)


def _future(result: Any) -> Future:
    """The future of an op whose value will be ``result``. CUDA tensors are staged through
    host memory (copied out at the call on the caller's stream, back on the completion
    thread); a future that holds them must name their devices (torch refuses the value
    otherwise), and then makes a waiter's current stream wait for the copies back."""
    found: Set[torch.device] = set()
    _cuda_devices(result, found)
    if not found:
        return Future()  # CPU ops never touch CUDA
    devices: List[Union[int, str, torch.device]] = sorted(found, key=str)
    return Future(devices=devices)


# torch dtypes the servers reduce as they are (bfloat16 as its bits, summed as bfloat16).
_CORE = {
    torch.float32: "float32",
    torch.float64: "float64",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.int8: "int8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.uint8: "uint8",
    torch.bool: "bool",
}
# Unsigned integers reduce as their signed twins: sums and products are the same bits modulo
# 2^k; min and max compare correctly once the sign bit is flipped.
_UNSIGNED = {
    getattr(torch, "uint16", None): (torch.int16, "int16"),
    getattr(torch, "uint32", None): (torch.int32, "int32"),
    getattr(torch, "uint64", None): (torch.int64, "int64"),
}
_UNSIGNED.pop(None, None)
_COMPLEX = {torch.complex64: torch.float32, torch.complex128: torch.float64}
_BITWISE = ("band", "bor", "bxor")


def _op_of(reduce_op: Any, what: str) -> Any:
    """A c10d ReduceOp as fastps's ReduceOp, or "band"/"bor"/"bxor"."""
    R = dist.ReduceOp
    table = [
        (R.SUM, ReduceOp.SUM),
        (R.AVG, ReduceOp.AVERAGE),
        (R.MIN, ReduceOp.MIN),
        (R.MAX, ReduceOp.MAX),
        (R.PRODUCT, ReduceOp.PRODUCT),
        (R.BAND, "band"),
        (R.BOR, "bor"),
        (R.BXOR, "bxor"),
    ]
    for theirs, ours in table:
        if reduce_op == theirs:
            return ours
    raise ValueError(
        f"fastps backend: {what}: reduce op {getattr(reduce_op, 'op', reduce_op)} is not "
        "supported (supported: SUM, AVG, MIN, MAX, PRODUCT, BAND, BOR, BXOR; PREMUL_SUM in "
        "all_reduce and reduce_scatter)"
    )


def _premul_factor(reduce_op: Any, tensors: Sequence[torch.Tensor], what: str) -> Optional[float]:
    """The factor of a ``PREMUL_SUM`` (``dist._make_nccl_premul_sum(f)``: every input times f,
    then summed; FSDP2 asks for it after ``set_gradient_divide_factor`` on float32/bfloat16
    gradients), else None."""
    if getattr(reduce_op, "op", None) != dist.ReduceOp.PREMUL_SUM:
        return None
    for t in tensors:
        if not (t.is_floating_point() or t.is_complex()):
            raise ValueError(
                f"fastps backend: {what}: PREMUL_SUM of {_describe(t)} is not supported: it "
                "scales floating-point tensors only"
            )
    factor = reduce_op.__getstate__()[1]
    return float(factor.item() if isinstance(factor, torch.Tensor) else factor)


def _describe(t: torch.Tensor) -> str:
    return f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}"


def _op_name(op: Any) -> str:
    """A reduce op as torch users spell it (SUM, AVG, ..., BXOR)."""
    if isinstance(op, str):
        return op.upper()
    return {ReduceOp.AVERAGE: "AVG"}.get(op, getattr(op, "name", str(op)).upper())


# --------------------------------------------------------------------------- tensor <-> host


def _contiguous_host(t: torch.Tensor) -> torch.Tensor:
    base = t.detach()
    if base.device.type != "cpu":
        base = base.cpu()
    return base.contiguous()


def _bytes(t: torch.Tensor) -> np.ndarray:
    """``t``'s bytes (a view when ``t`` is a contiguous CPU tensor)."""
    return _contiguous_host(t).reshape(-1).view(torch.uint8).numpy()


def _store_bytes(t: torch.Tensor, data: np.ndarray) -> None:
    """Writes ``data`` (``t``'s size in bytes) into ``t``, whatever its layout or device."""
    src = torch.from_numpy(np.ascontiguousarray(data).reshape(-1)).view(t.dtype).view(t.shape)
    if src.data_ptr() != t.data_ptr():
        t.detach().copy_(src)


class _Reduction:
    """One tensor prepared for a reduction: ``wire`` is what the servers reduce (``dtype``,
    ``op``); :meth:`restore` writes a reduced ``wire`` back into the tensor."""

    def __init__(self, t: torch.Tensor, op: Any, what: str) -> None:
        self.tensor = t
        self.op = op
        base = _contiguous_host(t)
        self.flip: Optional[torch.Tensor] = None
        self.widened = False
        dtype = base.dtype
        if dtype in _CORE:
            wire = base
            self.dtype = _CORE[dtype]
            if op in _BITWISE and (dtype.is_floating_point or dtype == torch.bfloat16):
                raise ValueError(
                    f"fastps backend: {what}: bitwise {op.upper()} needs an integer or bool "
                    f"tensor, got {_describe(t)}"
                )
            if dtype == torch.bool and op == ReduceOp.AVERAGE:
                raise ValueError(
                    f"fastps backend: {what}: AVG of {_describe(t)} is not defined; use SUM "
                    "(logical OR), MIN or MAX"
                )
        elif dtype in _COMPLEX:
            if op not in (ReduceOp.SUM, ReduceOp.AVERAGE):
                raise ValueError(
                    f"fastps backend: {what}: {_op_name(op)} of {_describe(t)} is not "
                    "supported: complex tensors reduce with SUM and AVG only"
                )
            wire = torch.view_as_real(base)
            self.dtype = "float32" if dtype == torch.complex64 else "float64"
        elif dtype in _UNSIGNED:
            signed, self.dtype = _UNSIGNED[dtype]
            wire = base.view(signed)
            if op == ReduceOp.AVERAGE:
                if dtype == getattr(torch, "uint64", None):
                    raise ValueError(
                        f"fastps backend: {what}: AVG of {_describe(t)} could overflow any "
                        "integer the servers sum; use SUM and divide"
                    )
                wire = base.to(torch.int64)  # the sum of unsigned values fits
                self.dtype = "int64"
                self.widened = True
            elif op in (ReduceOp.MIN, ReduceOp.MAX):
                self.flip = torch.tensor(torch.iinfo(signed).min, dtype=signed)
                wire = wire ^ self.flip
        else:
            raise ValueError(
                f"fastps backend: {what}: {_op_name(op)} of {_describe(t)} is not supported: "
                "this dtype does not reduce (data movement ops take every dtype)"
            )
        self.wire = wire.contiguous()
        self.base = base

    def array(self) -> np.ndarray:
        w = self.wire
        if self.dtype == "bfloat16":
            return w.view(torch.int16).numpy().view(np.uint16)
        return w.numpy()

    def restore(self, result: np.ndarray) -> None:
        r = torch.from_numpy(np.ascontiguousarray(result))
        if self.dtype == "bfloat16":
            r = r.view(torch.int16).view(torch.bfloat16)
        r = r.reshape(self.wire.shape)
        if self.flip is not None:
            r = r ^ self.flip
        t = self.tensor
        if self.widened:
            out = r.to(t.dtype)
        elif t.dtype in _COMPLEX:
            out = torch.view_as_complex(r)
        else:
            out = r.view(t.dtype) if r.dtype != t.dtype else r
        out = out.view(t.shape)
        if out.data_ptr() != t.data_ptr():
            t.detach().copy_(out)


def _check_like(tensors: Sequence[torch.Tensor], like: torch.Tensor, what: str, other: str) -> None:
    """Each of ``tensors`` holds as many elements of the same dtype as ``like``."""
    for t in tensors:
        if t.numel() != like.numel() or t.dtype != like.dtype:
            raise ValueError(
                f"fastps backend: {what} {_describe(t)} does not match {other} {_describe(like)}"
            )


def _bitwise(stack: np.ndarray, op: str) -> np.ndarray:
    fn = {"band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}[op]
    return fn.reduce(stack, axis=0)


# --------------------------------------------------------------------------- the group


class FastPSProcessGroup(dist.ProcessGroup):
    """A torch.distributed process group on fastps (see the module's docstring)."""

    def __init__(
        self,
        rank: int,
        size: int,
        process_set: ProcessSet,
        group_id: str,
        timeout: float,
    ) -> None:
        super().__init__(rank, size)  # type: ignore[call-arg]  # the stubs know only (store, ...)
        self._ps = process_set
        self._gid = group_id
        self._group_name = group_id
        self._group_desc = ""
        self._timeout = timeout
        self._seq = 0
        self._lock = threading.Lock()
        self._names: Dict[str, Future] = {}
        self._queue: queue.Queue[Optional[Tuple[Callable[[], Any], Future]]] = queue.Queue()
        self._thread: Optional[threading.Thread] = None
        self._closed = False
        self._allreduces_in_flight = 0
        self._burst = 0

    # ------------------------------------------------------------------ identity

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND

    # A ProcessGroup subclass has no backend to keep its name: without these, ``group_name``
    # (destroy_process_group(subgroup), DeviceMesh, functional collectives) raises
    # "ProcessGroup name not set".
    def getGroupName(self) -> str:  # noqa: N802 - torch's name
        return self._group_name

    def setGroupName(self, name: str) -> None:  # noqa: N802 - torch's name
        self._group_name = name

    def getGroupDesc(self) -> str:  # noqa: N802 - torch's name
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802 - torch's name
        self._group_desc = desc

    @property
    def process_set(self) -> ProcessSet:
        """The fastps process set this group runs on."""
        return self._ps

    def __repr__(self) -> str:
        return f"FastPSProcessGroup(rank={self.rank()}, size={self.size()}, {self._ps!r})"

    # ------------------------------------------------------------------ plumbing

    def _name(self) -> str:
        """The next op's name (the same on every member: they call in the same order)."""
        with self._lock:
            name = f"c10d.{self._gid}.{self._seq % WINDOW}"
            self._seq += 1
            older = self._names.get(name)
        if older is not None and not older.done():
            older.wait()  # WINDOW ops ago: it must end before its name is used again
        return name

    def _global(self, group_rank: int, what: str) -> int:
        ranks = self._ps.ranks
        if not 0 <= group_rank < len(ranks):
            raise ValueError(f"fastps backend: {what}: rank {group_rank} is not in this group")
        return ranks[group_rank]

    def _submit(self, name: str, finish: Callable[[], Any], result: Any = None) -> _Work:
        """Work whose future ``finish`` (run on the completion thread) fulfils; ``result``
        is what ``finish`` returns (its CUDA tensors' devices go to the future)."""
        fut = _future(result)
        with self._lock:
            if self._closed:
                raise FastPSError(f"fastps backend: the process group was shut down ({name})")
            self._names[name] = fut
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._complete, name=f"fastps-c10d-{self._gid}", daemon=True
                )
                self._thread.start()
        self._queue.put((finish, fut))
        return _create_work(fut)

    def _complete(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            finish, fut = item
            try:
                result = finish()
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits
                fut.set_exception(exc)
            else:
                fut.set_result(result)

    def _wait(self, op: C.Op) -> Any:
        return op.synchronize(self._timeout)

    # ------------------------------------------------------------------ reductions

    def _allreduce_one(
        self, t: torch.Tensor, op: Any, name: str, priority: int
    ) -> Callable[[], None]:
        red = _Reduction(t, op, f"allreduce '{name}'")
        arr = red.array()
        if op in _BITWISE:
            cop = C.allgather_async(arr.reshape(1, -1), red.dtype, name, self._ps, priority)

            def finish_bitwise() -> None:
                stack, _ = self._wait(cop)
                red.restore(_bitwise(stack, op).reshape(arr.shape))

            return finish_bitwise
        # In place: ``wire`` is the caller's contiguous CPU tensor or this op's own copy.
        cop = C.allreduce_async(arr, red.dtype, name, op, 1.0, 1.0, self._ps, priority, out=arr)

        def finish() -> None:
            red.restore(self._wait(cop))

        return finish

    def _allreduce_priority(self) -> int:
        with self._lock:
            if self._allreduces_in_flight == 0:
                self._burst = 0
            self._allreduces_in_flight += 1
            priority = -self._burst  # first issued, first pushed (module doc)
            self._burst += 1
        return priority

    def _allreduce_done(self) -> None:
        with self._lock:
            self._allreduces_in_flight -= 1

    def allreduce(self, tensors: List[torch.Tensor], opts: Any = None) -> _Work:
        reduce_op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        factor = _premul_factor(reduce_op, tensors, "allreduce")
        if factor is not None:  # PREMUL_SUM: scaled in place, then the sum overwrites them
            for t in tensors:
                t.detach().mul_(factor)
            reduce_op = dist.ReduceOp.SUM
        op = _op_of(reduce_op, "allreduce")
        name = self._name()
        priority = self._allreduce_priority()
        try:
            finishes = [
                self._allreduce_one(t, op, f"{name}.{i}" if len(tensors) > 1 else name, priority)
                for i, t in enumerate(tensors)
            ]
        except BaseException:
            self._allreduce_done()
            raise

        def finish() -> List[torch.Tensor]:
            try:
                for f in finishes:
                    f()
            finally:
                self._allreduce_done()
            return tensors

        return self._submit(name, finish, tensors)

    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts: Any = None) -> _Work:
        return self.allreduce(tensors, opts)

    def reduce(self, tensors: List[torch.Tensor], opts: Any) -> _Work:
        op = _op_of(opts.reduceOp, "reduce")
        root = self._global(opts.rootRank, "reduce")
        name = self._name()
        finishes: List[Callable[[], None]] = []
        for i, t in enumerate(tensors):
            part = f"{name}.{i}" if len(tensors) > 1 else name
            red = _Reduction(t, op, f"reduce '{part}'")
            arr = red.array()
            if op in _BITWISE:
                cop = C.alltoall_async(
                    arr.reshape(1, -1),
                    red.dtype,
                    [1 if r == root else 0 for r in self._ps.ranks],
                    part,
                    self._ps,
                )

                def finish_bitwise(
                    cop: C.Op = cop, red: _Reduction = red, shape: Any = arr.shape
                ) -> None:
                    stack, _ = self._wait(cop)
                    if _api.rank() == root:
                        red.restore(_bitwise(stack, op).reshape(shape))

                finishes.append(finish_bitwise)
                continue
            cop = C.reduce_async(arr, red.dtype, root, part, op, self._ps)

            def finish_one(cop: C.Op = cop, red: _Reduction = red) -> None:
                result = self._wait(cop)
                if result is not None:
                    red.restore(result)

            finishes.append(finish_one)

        def finish() -> List[torch.Tensor]:
            for f in finishes:
                f()
            return tensors

        return self._submit(name, finish, tensors)

    def _reduce_scatter_rows(
        self, output: torch.Tensor, rows: torch.Tensor, op: Any, name: str
    ) -> Callable[[], None]:
        """``rows``: one row per member (flattened); member j gets row j reduced into
        ``output``."""
        n = self.size()
        red = _Reduction(rows, op, f"reduce_scatter '{name}'")
        arr = red.array().reshape(n, -1)
        if op in (ReduceOp.SUM, ReduceOp.AVERAGE):
            cop = C.reducescatter_async(arr, red.dtype, name, op, 1.0, 1.0, self._ps)
        else:  # each member's row j goes to member j, who reduces them
            cop = C.alltoall_async(arr, red.dtype, [1] * n, name, self._ps)
        out_red = _Reduction(output, op, f"reduce_scatter '{name}'")

        def finish() -> None:
            got = self._wait(cop)
            if op in (ReduceOp.SUM, ReduceOp.AVERAGE):
                mine = got.reshape(-1)
            else:
                stack = got[0]
                if op in _BITWISE:
                    mine = _bitwise(stack, op)
                else:
                    mine = C.reduce_rows(stack, red.dtype, op)
            out_red.restore(mine.reshape(out_red.wire.shape))

        return finish

    def reduce_scatter(
        self, outputs: List[torch.Tensor], inputs: List[List[torch.Tensor]], opts: Any
    ) -> _Work:
        factor = _premul_factor(opts.reduceOp, [t for ins in inputs for t in ins], "reduce_scatter")
        op = ReduceOp.SUM if factor is not None else _op_of(opts.reduceOp, "reduce_scatter")
        name = self._name()
        finishes = []
        for i, (out, ins) in enumerate(zip(outputs, inputs)):
            self._check_count(ins, "reduce_scatter input list")
            _check_like(ins, out, "reduce_scatter: input", "the output")
            rows = torch.stack([_contiguous_host(t).reshape(-1) for t in ins])
            if factor is not None:
                rows.mul_(factor)  # PREMUL_SUM (rows is a copy)
            part = f"{name}.{i}" if len(outputs) > 1 else name
            finishes.append(self._reduce_scatter_rows(out, rows, op, part))

        def finish() -> List[torch.Tensor]:
            for f in finishes:
                f()
            return outputs

        return self._submit(name, finish, outputs)

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> _Work:
        factor = _premul_factor(opts.reduceOp, [input], "reduce_scatter_tensor")
        op = ReduceOp.SUM if factor is not None else _op_of(opts.reduceOp, "reduce_scatter_tensor")
        if input.numel() != output.numel() * self.size() or input.dtype != output.dtype:
            raise ValueError(
                f"fastps backend: reduce_scatter_tensor: input {_describe(input)} must hold "
                f"{self.size()} x the output {_describe(output)}"
            )
        name = self._name()
        rows = _contiguous_host(input).reshape(self.size(), -1)
        if factor is not None:
            rows = rows * factor  # PREMUL_SUM (the input stays as it is)
        f = self._reduce_scatter_rows(output, rows, op, name)

        def finish() -> torch.Tensor:
            f()
            return output

        return self._submit(name, finish, output)

    reduce_scatter_single = _reduce_scatter_base

    def reduce_scatter_tensor_coalesced(
        self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any
    ) -> _Work:
        works = [self._reduce_scatter_base(o, i, opts) for o, i in zip(outputs, inputs)]
        return self._after(works, outputs)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    # ------------------------------------------------------------------ data movement

    def _check_count(self, tensors: Sequence[torch.Tensor], what: str) -> None:
        if len(tensors) != self.size():
            raise ValueError(
                f"fastps backend: {what} has {len(tensors)} tensors for {self.size()} ranks"
            )

    def broadcast(self, tensors: List[torch.Tensor], opts: Any) -> _Work:
        root = self._global(opts.rootRank, "broadcast")
        name = self._name()
        finishes = []
        for i, t in enumerate(tensors):
            part = f"{name}.{i}" if len(tensors) > 1 else name
            data = _bytes(t)
            cop = C.broadcast_async(data, "uint8", root, part, self._ps, out=data)

            def finish_one(cop: C.Op = cop, t: torch.Tensor = t) -> None:
                _store_bytes(t, self._wait(cop))

            finishes.append(finish_one)

        def finish() -> List[torch.Tensor]:
            for f in finishes:
                f()
            return tensors

        return self._submit(name, finish, tensors)

    def _gather_rows(self, t: torch.Tensor, name: str) -> C.Op:
        return C.allgather_async(_bytes(t).reshape(1, -1), "uint8", name, self._ps)

    def allgather(
        self, outputs: List[List[torch.Tensor]], inputs: List[torch.Tensor], opts: Any = None
    ) -> _Work:
        name = self._name()
        finishes = []
        for i, (outs, t) in enumerate(zip(outputs, inputs)):
            self._check_count(outs, "all_gather output list")
            _check_like(outs, t, "all_gather: output", "the input")
            cop = self._gather_rows(t, f"{name}.{i}" if len(inputs) > 1 else name)

            def finish_one(cop: C.Op = cop, outs: List[torch.Tensor] = outs) -> None:
                rows, _ = self._wait(cop)
                for row, o in zip(rows, outs):
                    _store_bytes(o, row)

            finishes.append(finish_one)

        def finish() -> List[List[torch.Tensor]]:
            for f in finishes:
                f()
            return outputs

        return self._submit(name, finish, outputs)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> _Work:
        if output.numel() != input.numel() * self.size() or output.dtype != input.dtype:
            raise ValueError(
                f"fastps backend: all_gather_into_tensor: output {_describe(output)} must hold "
                f"{self.size()} x the input {_describe(input)}"
            )
        name = self._name()
        cop = self._gather_rows(input, name)

        def finish() -> torch.Tensor:
            rows, _ = self._wait(cop)
            _store_bytes(output, rows)
            return output

        return self._submit(name, finish, output)

    all_gather_single = _allgather_base

    def allgather_into_tensor_coalesced(
        self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any = None
    ) -> _Work:
        works = [self._allgather_base(o, i, opts) for o, i in zip(outputs, inputs)]
        return self._after(works, outputs)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def allgather_coalesced(
        self, outputs: List[List[torch.Tensor]], inputs: List[torch.Tensor], opts: Any = None
    ) -> _Work:
        return self.allgather(outputs, inputs, opts)

    def _after(self, works: List[_Work], result: Any) -> _Work:
        """One work for several (a coalesced call): done when they all are, in order."""

        def finish() -> Any:
            for w in works:
                w.wait()
            return result

        fut = _future(result)
        self._queue.put((finish, fut))
        return _create_work(fut)

    def _alltoall_bytes(self, data: np.ndarray, send: List[int], name: str) -> C.Op:
        """``send[j]`` bytes of ``data`` (in order) to member j; the result is the received
        bytes in member order and the bytes from each."""
        return C.alltoall_async(data.reshape(-1, 1), "uint8", send, name, self._ps)

    def alltoall_base(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: List[int],
        input_split_sizes: List[int],
        opts: Any = None,
    ) -> _Work:
        n = self.size()
        if input.dtype != output.dtype:
            raise ValueError(
                f"fastps backend: all_to_all_single: input {_describe(input)} and output "
                f"{_describe(output)} differ in dtype"
            )
        in_rows = int(input.shape[0]) if input.dim() else 1
        out_rows = int(output.shape[0]) if output.dim() else 1
        in_row_bytes = input.numel() * input.element_size() // max(in_rows, 1)
        out_row_bytes = output.numel() * output.element_size() // max(out_rows, 1)
        if input_split_sizes:
            send_rows = [int(s) for s in input_split_sizes]
        else:
            if in_rows % n:
                raise ValueError(
                    f"fastps backend: all_to_all_single: input {_describe(input)} does not "
                    f"split evenly among {n} ranks; pass input_split_sizes"
                )
            send_rows = [in_rows // n] * n
        if len(send_rows) != n or sum(send_rows) != in_rows:
            raise ValueError(
                f"fastps backend: all_to_all_single: input_split_sizes {send_rows} must have "
                f"{n} entries summing to {in_rows}"
            )
        want = [int(s) for s in output_split_sizes] if output_split_sizes else None
        name = self._name()
        cop = self._alltoall_bytes(_bytes(input), [r * in_row_bytes for r in send_rows], name)

        def finish() -> torch.Tensor:
            data, got = self._wait(cop)
            got_rows = [g // out_row_bytes if out_row_bytes else 0 for g in got]
            if (
                want is not None and got_rows != want
            ) or data.size != output.numel() * output.element_size():
                raise FastPSError(
                    f"fastps backend: all_to_all_single '{name}': received rows {got_rows} from "
                    f"the ranks, but the output {_describe(output)} expects "
                    f"{want if want is not None else [out_rows // n] * n}"
                )
            _store_bytes(output, data)
            return output

        return self._submit(name, finish, output)

    def alltoall(
        self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any = None
    ) -> _Work:
        self._check_count(inputs, "all_to_all input list")
        self._check_count(outputs, "all_to_all output list")
        name = self._name()
        pieces = [_bytes(t) for t in inputs]
        data = np.concatenate(pieces) if pieces else np.empty(0, np.uint8)
        cop = self._alltoall_bytes(data, [p.size for p in pieces], name)

        def finish() -> List[torch.Tensor]:
            got, sizes = self._wait(cop)
            got = got.reshape(-1)
            begin = 0
            for j, (o, size) in enumerate(zip(outputs, sizes)):
                if size != o.numel() * o.element_size():
                    raise FastPSError(
                        f"fastps backend: all_to_all '{name}': rank {self._ps.ranks[j]} sent "
                        f"{size} bytes for an output {_describe(o)}"
                    )
                _store_bytes(o, got[begin : begin + size])
                begin += size
            return outputs

        return self._submit(name, finish, outputs)

    def gather(
        self, outputs: List[List[torch.Tensor]], inputs: List[torch.Tensor], opts: Any
    ) -> _Work:
        root = self._global(opts.rootRank, "gather")
        at_root = _api.rank() == root
        name = self._name()
        t = inputs[0]
        data = _bytes(t)
        send = [data.size if r == root else 0 for r in self._ps.ranks]
        cop = self._alltoall_bytes(data, send, name)
        if at_root:
            self._check_count(outputs[0], "gather output list")

        def finish() -> List[List[torch.Tensor]]:
            got, sizes = self._wait(cop)
            if at_root:
                got = got.reshape(-1)
                begin = 0
                for o, size in zip(outputs[0], sizes):
                    _store_bytes(o, got[begin : begin + size])
                    begin += size
            return outputs

        return self._submit(name, finish, outputs)

    def scatter(
        self, outputs: List[torch.Tensor], inputs: List[List[torch.Tensor]], opts: Any
    ) -> _Work:
        root = self._global(opts.rootRank, "scatter")
        at_root = _api.rank() == root
        name = self._name()
        out = outputs[0]
        if at_root:
            self._check_count(inputs[0], "scatter input list")
            pieces = [_bytes(t) for t in inputs[0]]
            data = np.concatenate(pieces)
            send = [p.size for p in pieces]
        else:
            data = np.empty(0, np.uint8)
            send = [0] * self.size()
        cop = self._alltoall_bytes(data, send, name)

        def finish() -> List[torch.Tensor]:
            got, _ = self._wait(cop)
            _store_bytes(out, got)
            return outputs

        return self._submit(name, finish, outputs)

    def barrier(self, opts: Any = None) -> _Work:
        ps = self._ps

        def finish() -> List[torch.Tensor]:
            C.barrier(ps)
            return []

        return self._submit(f"c10d.{self._gid}.barrier", finish)

    # ------------------------------------------------------------------ not offered

    def _p2p(self, what: str) -> None:
        raise RuntimeError(
            f"fastps backend: {what} (point-to-point) is not supported: fastps moves data "
            "through collectives. Use all_to_all_single, or a gloo group for send/recv "
            "(dist.new_group(backend='gloo'))"
        )

    def send(self, tensors: List[torch.Tensor], dst: int, tag: int = 0) -> _Work:
        self._p2p("send")

    def recv(self, tensors: List[torch.Tensor], src: int, tag: int = 0) -> _Work:
        self._p2p("recv")

    def recv_anysource(self, tensors: List[torch.Tensor], tag: int = 0) -> _Work:
        self._p2p("recv (any source)")

    # ------------------------------------------------------------------ the end

    def shutdown(self) -> None:
        """``destroy_process_group``: ends this group (ops in flight finish first). The
        fastps connections stay until the process exits."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        if thread is not None:
            self._queue.put(None)
            thread.join(self._timeout)
        if self._ps.process_set_id not in (None, 0):
            C.forget_member_process_set(self._ps)


# --------------------------------------------------------------------------- creation


def _set_id(store: Any, group_rank: int, timeout: float) -> int:
    """The members' common id for a new group's process set, drawn by its first member."""
    from fastps.launch.store_rendezvous import root_store, text_of, wait_for

    if group_rank == 0:
        seq = int(root_store(store).add(SET_SEQ_KEY, 1))
        store.set(SET_ID_KEY, str(C.MEMBER_SET_IDS + seq))
    wait_for(store, [SET_ID_KEY], timeout, "the new group's id from its first member")
    return int(text_of(store.get(SET_ID_KEY)))


def _master_addr(store: Any) -> Optional[str]:
    from fastps.launch.store_rendezvous import root_store

    return getattr(root_store(store), "host", None)


def create_process_group(dist_options: Any, backend_options: Any = None) -> FastPSProcessGroup:
    """The creator torch.distributed calls (``register_backend(..., extended_api=True)``)."""
    from fastps.launch import store_rendezvous
    from fastps.torch import basics

    store = dist_options.store
    rank = int(dist_options.group_rank)
    size = int(dist_options.group_size)
    td = dist_options.timeout
    timeout = td.total_seconds() if isinstance(td, datetime.timedelta) else float(td)
    ranks = list(dist_options.global_ranks_in_group or range(size))
    group_id = str(dist_options.group_id or "0")
    if not _api.is_initialized() and not torch_launched() and scheduler_given():
        _api.init()  # a fastpsrun job (FASTPS_SCHEDULER_ADDR set): join it, start nothing
    if not _api.is_initialized():
        if len(ranks) != size or ranks != list(range(size)):
            raise FastPSError(
                "fastps backend: the first process group must span every rank "
                f"(got ranks {ranks}); call init_process_group first"
            )
        cfg = store_rendezvous.join(store, rank, size, timeout, _master_addr(store))
        _api.init(cfg)
    if not basics.is_initialized():
        basics.init()
    world = _api.size()
    me = _api.rank()
    if ranks == list(range(world)):
        ps = C.global_process_set
        if rank != me:
            raise FastPSError(
                f"fastps backend: this process is rank {me} of the fastps job but rank {rank} "
                "of the new process group: one process, one rank"
            )
    else:
        if ranks[rank] != me:
            raise FastPSError(
                f"fastps backend: group {group_id}: global rank {ranks[rank]} expected, this "
                f"process is rank {me}"
            )
        ps = C.add_member_process_set(ranks, _set_id(store, rank, timeout))
    pg = FastPSProcessGroup(rank, size, ps, group_id, timeout)
    log.debug("created %r (group %s)", pg, group_id)
    return pg


def register() -> None:
    """Registers the backend (``import fastps.torch`` does; so does ``import torch`` through
    the entry point). Idempotent."""
    if not dist.is_available() or BACKEND.upper() in getattr(dist.Backend, "_plugins", {}):
        return
    dist.Backend.register_backend(
        BACKEND, create_process_group, extended_api=True, devices=list(DEVICES)
    )
