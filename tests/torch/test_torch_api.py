"""fastps.torch's Horovod-style API, run as real 2-worker jobs through fastpsrun.

The worker scripts in ``workers/`` do the checking and print ``... OK`` lines; these tests
check exit codes and those lines.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict

import pytest
import torch
from torchjobs import WORKERS, fastpsrun, lines_of


def test_collectives_every_dtype(subprocess_env: Dict[str, str]) -> None:
    """allreduce/push_pull (+async, in place, ops, scale factors), allgather, broadcast,
    grouped, compression, objects, autograd, errors, join, barrier, broadcast_parameters
    and the optimizer API on every dtype the core supports."""
    res = fastpsrun(WORKERS / "api_ops.py", env=subprocess_env)
    assert res.returncode == 0, res.stdout[-6000:]
    for dtype in (
        "float32",
        "float64",
        "float16",
        "bfloat16",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "bool",
    ):
        assert len(lines_of(res.stdout, f"dtype {dtype} OK")) == 2, dtype
    for check in (
        "sparse allreduce",
        "sparse optimizer",
        "compression",
        "objects",
        "autograd",
        "errors",
        "join/barrier",
        "broadcast_parameters",
        "optimizer api",
        "ALL",
    ):
        assert len(lines_of(res.stdout, f"{check} OK")) == 2, (check, res.stdout[-3000:])


@pytest.mark.parametrize(
    "mode, fragment",
    [
        ("extra", "tensor 'extra.weight' (float32[2, 2]) exists on rank 1 but not on rank 0"),
        ("shape", "tensor 'fc1.weight' is float32[8, 4] on rank 0 but float32[9, 4] on rank 1"),
        ("params", "exists on rank 1 but not on rank 0"),
        ("allreduce", "op 'layer.weight': mismatched shape: rank 0 has [5], rank 1 has [6]"),
    ],
)
def test_mismatched_models_raise_not_hang(
    subprocess_env: Dict[str, str], mode: str, fragment: str
) -> None:
    """Every rank gets a FastPSError naming the tensor, within seconds, and the job goes
    on: the next op works."""
    res = fastpsrun(WORKERS / "mismatch.py", mode, env=subprocess_env, timeout=90)
    caught = lines_of(res.stdout, "CAUGHT")
    assert len(caught) == 2, res.stdout[-4000:]
    for line in caught:
        assert fragment in line, line
    assert "NO ERROR" not in res.stdout
    assert len(lines_of(res.stdout, "NEXT OP OK")) == 2, res.stdout[-4000:]
    assert res.returncode == 0, res.stdout[-4000:]


def test_single_process_without_launcher(subprocess_env: Dict[str, str], tmp_path: Path) -> None:
    """Without fastpsrun, init() runs alone: collectives return their input."""
    script = tmp_path / "alone.py"
    script.write_text(
        textwrap.dedent("""
        import torch
        import fastps.torch as hvd
        hvd.init()
        assert (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size()) == (0, 1, 0, 1)
        x = torch.arange(4.0)
        assert torch.equal(hvd.allreduce(x), x)
        assert torch.equal(hvd.allgather(x), x)
        assert torch.equal(hvd.broadcast(x, 0), x)
        assert hvd.broadcast_object({"a": 1}) == {"a": 1}
        assert hvd.allgather_object(3) == [3]
        assert hvd.join() == 0
        model = torch.nn.Linear(2, 1)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters())
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
        print("ALONE OK")
    """)
    )
    res = subprocess.run(
        [sys.executable, str(script)],
        env=subprocess_env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=120,
    )
    assert res.returncode == 0 and "ALONE OK" in res.stdout, res.stdout[-3000:]


def test_forward_order_recorder_unit() -> None:
    """The recorder follows execution order, not registration order; unseen parameters
    come last in their given order."""
    from fastps.torch.priority import ForwardOrder

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.last = torch.nn.Linear(4, 2)
            self.unused = torch.nn.Linear(2, 2)
            self.first = torch.nn.Linear(3, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.last(torch.relu(self.first(x)))

    net = Net()
    params = list(net.parameters())
    order = ForwardOrder(params)
    assert order.learning
    net(torch.ones(1, 3))
    ranked = order.ranked(params)
    want = [
        net.first.weight,
        net.first.bias,
        net.last.weight,
        net.last.bias,
        net.unused.weight,
        net.unused.bias,
    ]
    assert [id(p) for p in ranked] == [id(p) for p in want]
    assert order.position(net.unused.weight) is None
    order.stop()
    assert not order.learning
    net.unused(torch.ones(1, 2))  # after learning stopped, nothing changes
    assert order.position(net.unused.weight) is None


def test_cross_barrier_options_unit(monkeypatch: pytest.MonkeyPatch) -> None:
    """FASTPS_CROSS_BARRIER and FASTPS_GC_FREEZE parse 1/0 and name the variable otherwise;
    the per-parameter check looks through torch's step wrappers and subclasses."""
    from fastps.torch import cross_barrier, heap

    monkeypatch.delenv("FASTPS_CROSS_BARRIER", raising=False)
    assert cross_barrier.enabled(None) is True  # the default
    assert not cross_barrier.explicit(None) and cross_barrier.explicit(True)
    assert cross_barrier.enabled(False) is False
    monkeypatch.setenv("FASTPS_CROSS_BARRIER", "off")
    assert cross_barrier.enabled(None) is False
    monkeypatch.setenv("FASTPS_CROSS_BARRIER", "on")
    assert cross_barrier.enabled(None) is True and cross_barrier.explicit(None)
    assert cross_barrier.enabled(False) is False  # the argument wins
    monkeypatch.setenv("FASTPS_CROSS_BARRIER", "maybe")
    with pytest.raises(ValueError, match="FASTPS_CROSS_BARRIER='maybe'"):
        cross_barrier.enabled(None)
    with pytest.raises(TypeError, match="cross_barrier"):
        cross_barrier.enabled(1)  # type: ignore[arg-type]
    monkeypatch.setenv("FASTPS_GC_FREEZE", "2")
    with pytest.raises(ValueError, match="FASTPS_GC_FREEZE='2'"):
        heap._enabled()

    class MyAdam(torch.optim.Adam):
        pass

    # torch wraps step in a profiling hook on the first class constructed (MyAdam's own
    # only when no Adam was built before in this process); a wrapper of our own makes the
    # looked-through case certain whatever ran earlier.
    MyAdam([torch.zeros(1, requires_grad=True)])

    class WrappedAdam(torch.optim.Adam):
        @functools.wraps(torch.optim.Adam.step)
        def step(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201
            return super().step(*args, **kwargs)

    assert "step" in WrappedAdam.__dict__
    for cls in (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, MyAdam, WrappedAdam):
        assert cross_barrier.coupling(cls) is None, cls
    assert "LBFGS.step()" in str(cross_barrier.coupling(torch.optim.LBFGS))
    assert cross_barrier.coupling(torch.optim.SparseAdam) is None


def test_pending_parameter_reads_apply_the_update_unit() -> None:
    """While its update pends a parameter has a subclass of its own class whose
    __torch_function__ settles the update before a read of values or gradient; metadata
    reads pass; the class goes back afterwards; a parameter class with its own
    __torch_function__ is refused (the optimizer then steps synchronously)."""
    from fastps.torch import cross_barrier as cb

    settled = []

    class FakeBarrier:
        def __init__(self) -> None:
            self.pending = {}

        def wait_params(self, params, waiter="", in_forward=False):  # noqa: ANN001, ANN201
            for p in params:
                settled.append(p)
                self.pending.pop(id(p))
                cb._restore(p)

    lin = torch.nn.Linear(3, 2)
    barrier = FakeBarrier()
    for p in lin.parameters():
        barrier.pending[id(p)] = object()
        cb._mark(p, barrier)  # type: ignore[arg-type]
    w = lin.weight
    assert isinstance(w, torch.nn.Parameter) and type(w) is not torch.nn.Parameter
    assert w.shape == (2, 3) and w.dtype == torch.float32 and w.requires_grad
    assert w.numel() == 6 and w.size(0) == 2 and not settled  # metadata: no update needed
    w.detach()
    assert settled == [w] and type(w) is torch.nn.Parameter
    with torch.no_grad():
        torch._foreach_mul_([lin.bias], 2.0)  # a list argument
    assert settled == [w, lin.bias] and type(lin.bias) is torch.nn.Parameter

    class Logged(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
            return super().__torch_function__(func, types, args, kwargs)

    plain = [torch.nn.Parameter(torch.zeros(2)), torch.zeros(2, requires_grad=True)]
    assert cb._unswappable(plain) is None
    assert "Logged" in str(cb._unswappable([torch.zeros(2).as_subclass(Logged)]))


def test_compression_unit() -> None:
    import fastps.torch as hvd

    x = torch.linspace(-3, 3, 11, dtype=torch.float64)
    c, ctx = hvd.Compression.fp16.compress(x)
    assert c.dtype == torch.float16
    back = hvd.Compression.fp16.decompress(c, ctx)
    assert back.dtype == torch.float64 and torch.allclose(back, x, atol=1e-3)
    i = torch.arange(3)
    c, ctx = hvd.Compression.fp16.compress(i)
    assert c is i and hvd.Compression.fp16.decompress(c, ctx) is i
    c, ctx = hvd.Compression.none.compress(x)
    assert c is x


def test_unsupported_dtype_error_names_tensor() -> None:
    import fastps
    from fastps.torch.ops import core_dtype

    for dtype in (torch.complex64, torch.complex128, torch.uint16, torch.uint32, torch.uint64):
        with pytest.raises(fastps.FastPSError, match=r"tensor 'my\.weight'.*not supported"):
            core_dtype(torch.zeros(2, dtype=dtype), "my.weight")
