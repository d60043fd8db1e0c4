"""Issue 42's judge: time to accuracy of fastps's training algorithms against PyTorch's
peers, in one run on the emulated rack (docs/results/algorithms.md).

n worker hosts (default 4) with a summation server on each (k = 0, the scheduler on w0)
and every host link shaped to each of ``--rates`` (benchmarks/rack). Every method trains
the same task (benchmarks/compression_tasks.py: ``digits``, the MLP of
examples/torch/train_digits.py; ``cifar``, the CIFAR-shaped synthetic task) from the same
seed, on the same data shards (epoch e's permutation, rank r takes every n-th example from
r), with the same batch size per worker and the same number of epochs:

- fastps (``fastps.torch.DistributedOptimizer``): ``fastps:none`` (synchronous averaging),
  ``fastps:fp16`` and ``fastps:onebit:ef`` (the core's codecs, with Adam: onebit with error
  feedback is expected not to train), ``fastps:onebit-adam`` (``OneBitAdam``, warm-up
  ``--freeze-frac`` of the run's steps), ``fastps:local:H`` and ``fastps:diloco:H``
  (``LocalSGD``/``DiLoCo``, the outer step on the servers), ``fastps:local-fp16:H`` and
  ``fastps:diloco-fp16:H`` (the same with ``compression=fastps.Compression.fp16``: fp16
  deltas, the parameters answered uncompressed; ``-onebit-ef`` likewise for onebit with
  error feedback), and each of these as ``overlap:H``, ``overlap-fp16:H``,
  ``overlap-diloco:H``, ... (``overlap=True``: a round's exchange runs during the next H
  local steps, its answer applied one round late);
- peers, torch.distributed over Gloo: ``ddp:none`` (DistributedDataParallel),
  ``ddp:fp16`` (``fp16_compress_hook``), ``ddp:powersgd:R`` (``powerSGD_hook``, rank R, error
  feedback and warm start, compressing from ``--powersgd-frac`` of the run's steps; buckets in
  order, benchmarks/bench_compression.py's ``in_bucket_order``), ``ddp:postlocal:H``
  (``post_localSGD_hook`` without gradient all-reduce, ``PostLocalSGDOptimizer`` with a
  ``PeriodicModelAverager`` of period H: local SGD from the first step, like fastps's);
  ``torchft:diloco:H`` (torchft's ``DiLoCo``, one replica group per host, a lighthouse in
  rank 0's process).

Every method uses Adam at ``lr × n`` (the task's lr per worker), apart from 1-bit Adam
(``OneBitAdam``, the same lr and betas) and the outer optimizers of local SGD (averaging)
and DiLoCo (SGD, lr 0.7, Nesterov momentum 0.9) around their inner Adam. Local methods
synchronise at the end of every epoch if steps were taken since their last outer step
(``LocalSGD.outer_step()``; DDP: ``average_parameters``), so that every epoch evaluates one
model; that sync counts in the training time and bytes. torchft's DiLoCo has no such call:
each rank evaluates the model it holds.

Recorded per epoch (after the epoch's training, the evaluation excluded from both):
the cumulative training time of the slowest worker; the bytes each worker's host link sent
(``tx_bytes`` of eth0 in the host's namespace, /proc/net/dev: the worker and, for fastps,
the server on its host; mean over the hosts) and, for fastps, the bytes the worker's
data-plane sockets sent (the core's ``socket_bytes_sent``, loopback and shared memory
included or not as the core routes them); test accuracy (exact counts, each rank
evaluating its shard of the test set, summed). Per run, the machine's CPU busy fraction
(/proc/stat, all cores) and load average: the hosts share this machine's cores.

Reported per task and rate: each method's final accuracy, the training time (and epoch)
at which it first reaches the target (``fastps:none``'s final accuracy − ``--target-points``
points) and its ratio to the fastest peer's, the bytes per worker, and issue 42's checks.

    python -m benchmarks.bench_algorithms --rates 1000 100                # needs root
    python -m benchmarks.bench_algorithms --tasks digits cifar --epochs 10
    python -m benchmarks.bench_algorithms --plot-only --plot docs/results/algorithms.png \
        --inputs docs/results/algorithms_digits.csv docs/results/algorithms_cifar.csv
    python -m benchmarks.bench_algorithms --loopback -n 2 --n-train 256 --epochs 1  # no root

``--loopback`` runs every job on this host's loopback (``python -m fastps.launcher`` for
fastps, n local processes for the peers): no shaping and no host links (no link bytes);
for development and the smoke test (tests/tools/test_bench_algorithms.py).
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

if __package__ in (None, ""):  # run as a file: make `benchmarks.*` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import compression_tasks as ct  # noqa: E402
from benchmarks import rack_common as rc  # noqa: E402
from benchmarks.cpu_account import machine_busy_seconds  # noqa: E402

FASTPS_METHODS = [
    "fastps:none",
    "fastps:fp16",
    "fastps:onebit:ef",
    "fastps:onebit-adam",
    "fastps:local:4",
    "fastps:local:8",
    "fastps:diloco:4",
    "fastps:diloco:8",
]
PEER_METHODS = [
    "ddp:none",
    "ddp:fp16",
    "ddp:powersgd:2",
    "ddp:postlocal:8",
    "torchft:diloco:8",
]
DEFAULT_METHODS = FASTPS_METHODS + PEER_METHODS
SYSTEMS = ("fastps", "ddp", "torchft")
BASELINE = "fastps:none"
FIELDS = [
    "task",
    "rate_mbit",
    "n",
    "method",
    "system",
    "optimizer",
    "epoch",
    "steps",
    "train_s",
    "accuracy",
    "loss",
    "link_mb",
    "socket_mb",
    "wall_s",
    "cpu_busy",
    "load",
    "status",
]
LINK_DEV = "eth0"  # a rack host's one interface (benchmarks/rack)
# torchft's Rust side logs every quorum at INFO; its warnings are enough here.
QUIET_LOGS = {"RUST_LOG": "warn"}


# ----------------------------------------------------------------------------- methods


@dataclass(frozen=True)
class Method:
    """A parsed method name: ``system:kind[:param]``."""

    name: str
    system: str
    kind: str
    param: int = 0
    spec: str = ""  # fastps: the core codec's spec (local/diloco: the deltas')
    overlap: bool = False  # fastps local/diloco: the exchange hidden behind the next H steps

    @property
    def local(self) -> bool:
        """Whether the workers take local steps between synchronisations."""
        return self.kind in ("local", "diloco", "postlocal")

    def optimizer(self) -> str:
        """The optimizer(s), in words, for the tables."""
        if self.kind == "onebit-adam":
            return "OneBitAdam"
        deltas = f", {self.spec} deltas" if self.local and self.spec else ""
        deltas += ", overlapped (applied one round late)" if self.overlap else ""
        if self.kind in ("local", "postlocal"):
            return f"Adam inner, averaging every {self.param} steps{deltas}"
        if self.kind == "diloco":
            return (
                f"Adam inner, SGD-Nesterov outer (lr 0.7, m 0.9) every {self.param} steps{deltas}"
            )
        return "Adam"


# fastps:local-<codec>:H and fastps:diloco-<codec>:H: the deltas' core codec spec.
DELTA_CODECS = {"fp16": "fp16", "onebit-ef": "onebit:ef"}


def parse_method(name: str) -> Method:
    """``fastps:none|fp16|onebit:ef|onebit-adam|local:H|diloco:H|local-fp16:H|
    diloco-fp16:H|local-onebit-ef:H|diloco-onebit-ef:H``, each local one also as
    ``overlap-...`` (``overlap:H``, ``overlap-fp16:H``, ``overlap-diloco:H`` ...: the same
    with ``overlap=True``), ``ddp:none|fp16|powersgd:R|postlocal:H``, ``torchft:diloco:H``."""
    system, _, rest = name.partition(":")
    kind, _, tail = rest.partition(":")
    if system == "fastps" and (kind == "overlap" or kind.startswith("overlap-")):
        inner = kind[len("overlap-") :] if kind != "overlap" else "local"
        if not inner.startswith(("local", "diloco")):
            inner = "local-" + inner  # overlap-fp16 is overlapped local SGD's fp16 deltas
        try:
            m = parse_method(f"fastps:{inner}:{tail}")
        except ValueError:
            raise ValueError(
                f"unknown method {name!r}: overlap-X:H takes a local method X (local, diloco, "
                "local-fp16, diloco-fp16, local-onebit-ef, diloco-onebit-ef; fp16 and "
                "onebit-ef alone mean local's) and H >= 1"
            ) from None
        return Method(name, m.system, m.kind, m.param, spec=m.spec, overlap=True)

    def positive(text: str, what: str) -> int:
        if not text.isdigit() or int(text) < 1:
            raise ValueError(f"method {name!r}: {what} must be an integer >= 1, got {text!r}")
        return int(text)

    if system == "fastps":
        if rest in ("none", "fp16", "onebit:ef"):
            return Method(name, system, rest.split(":")[0], spec=rest)
        if rest == "onebit-adam":
            return Method(name, system, rest)
        if kind in ("local", "diloco"):
            return Method(name, system, kind, positive(tail, "H"))
        base, _, codec = kind.partition("-")
        if base in ("local", "diloco") and codec in DELTA_CODECS:
            return Method(name, system, base, positive(tail, "H"), spec=DELTA_CODECS[codec])
    elif system == "ddp":
        if rest in ("none", "fp16"):
            return Method(name, system, rest)
        if kind == "powersgd":
            return Method(name, system, kind, positive(tail, "the rank"))
        if kind == "postlocal":
            return Method(name, system, kind, positive(tail, "H"))
    elif system == "torchft" and kind == "diloco":
        return Method(name, system, kind, positive(tail, "H"))
    raise ValueError(
        f"unknown method {name!r} (fastps:none|fp16|onebit:ef|onebit-adam|local:H|diloco:H|"
        "local-fp16:H|diloco-fp16:H|local-onebit-ef:H|diloco-onebit-ef:H, overlap-<any local>, "
        "ddp:none|fp16|powersgd:R|postlocal:H, torchft:diloco:H)"
    )


def link_tx_bytes(dev: str) -> Optional[int]:
    """Bytes ``dev`` sent (/proc/net/dev of this process's network namespace); None if
    there is no such device or no device was named."""
    if not dev:
        return None
    try:
        with open("/proc/self/net/dev", encoding="ascii") as fh:
            for line in fh:
                name, sep, counters = line.partition(":")
                if sep and name.strip() == dev:
                    return int(counters.split()[8])
    except OSError:
        return None
    return None


# ----------------------------------------------------------------------------- worker


class Comm(ABC):
    """One system's side of a training job: wraps the model and optimizer, syncs local
    methods at the end of an epoch, sums the evaluation's counts."""

    rank = 0
    size = 1

    @abstractmethod
    def wrap(self, model: Any, lr: float, total_steps: int) -> Tuple[Any, Any]:
        """(model, optimizer) as this system trains them."""

    def epoch_end(self) -> None:  # noqa: B027 - optional: only local methods sync here
        """Local methods: synchronise the steps taken since the last outer step."""

    @abstractmethod
    def sum(self, values: List[float]) -> List[float]:
        """The element-wise sum of ``values`` over every rank."""

    def socket_bytes(self) -> Optional[int]:
        return None

    def shutdown(self) -> None:  # noqa: B027 - optional: nothing to close by default
        pass


class FastpsComm(Comm):
    def __init__(self, method: Method, args: argparse.Namespace) -> None:
        import fastps.torch as hvd

        self.hvd = hvd
        self.method = method
        self.args = args
        hvd.init()
        self.rank, self.size = hvd.rank(), hvd.size()
        self.algorithm: Any = None

    def wrap(self, model: Any, lr: float, total_steps: int) -> Tuple[Any, Any]:
        import fastps
        import torch
        from fastps.torch.algorithms import DiLoCo, LocalSGD, OneBitAdam

        hvd, m = self.hvd, self.method
        kwargs: Dict[str, Any] = {}
        opt: Any
        if m.kind == "onebit-adam":
            freeze = max(1, round(self.args.freeze_frac * total_steps))
            opt = OneBitAdam(model.parameters(), lr=lr, freeze_step=freeze)
        else:
            opt = torch.optim.Adam(model.parameters(), lr=lr)
        if m.kind in ("fp16", "onebit"):
            kwargs["compression"] = fastps.Compression.from_spec(m.spec)
        elif m.kind in ("local", "diloco"):
            deltas = fastps.Compression.from_spec(m.spec) if m.spec else None
            algo = LocalSGD if m.kind == "local" else DiLoCo
            warmup = self.args.overlap_warmup if m.overlap else 0
            self.algorithm = kwargs["algorithm"] = algo(
                H=m.param, compression=deltas, overlap=m.overlap, overlap_warmup=warmup
            )
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), **kwargs)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        return model, opt

    def epoch_end(self) -> None:
        if self.algorithm is not None and not self.algorithm.synced:
            self.algorithm.outer_step()

    def sum(self, values: List[float]) -> List[float]:
        import torch

        out = self.hvd.allreduce(
            torch.tensor(values, dtype=torch.float64), name="bench.eval", op=self.hvd.Sum
        )
        return [float(v) for v in out]

    def socket_bytes(self) -> Optional[int]:
        from fastps.worker import api

        return int(api.data_path_stats()["socket_bytes_sent"])

    def shutdown(self) -> None:
        self.hvd.shutdown()


class DdpComm(Comm):
    def __init__(self, method: Method, args: argparse.Namespace) -> None:
        self.method = method
        self.args = args
        self.rank, self.size = rc.init_gloo_from_env(args.run_timeout)
        self.ddp: Any = None
        self.averager: Any = None

    def wrap(self, model: Any, lr: float, total_steps: int) -> Tuple[Any, Any]:
        import torch
        from torch.distributed.algorithms.ddp_comm_hooks import (
            default_hooks,
            post_localSGD_hook,
            powerSGD_hook,
        )
        from torch.nn.parallel import DistributedDataParallel

        from benchmarks.bench_compression import in_bucket_order

        m = self.method
        self.ddp = DistributedDataParallel(model)  # broadcasts rank 0's parameters
        opt: Any = torch.optim.Adam(self.ddp.parameters(), lr=lr)
        if m.kind == "fp16":
            self.ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif m.kind == "powersgd":
            psgd = powerSGD_hook.PowerSGDState(
                process_group=None,
                matrix_approximation_rank=m.param,
                start_powerSGD_iter=max(2, round(self.args.powersgd_frac * total_steps)),
            )
            self.ddp.register_comm_hook(psgd, in_bucket_order(powerSGD_hook.powerSGD_hook))
        elif m.kind == "postlocal":
            from torch.distributed.algorithms.model_averaging.averagers import (
                PeriodicModelAverager,
            )
            from torch.distributed.optim import PostLocalSGDOptimizer

            state = post_localSGD_hook.PostLocalSGDState(
                process_group=None,
                subgroup=None,
                start_localSGD_iter=0,
                post_local_gradient_allreduce=False,  # no gradient traffic at all
            )
            self.ddp.register_comm_hook(state, post_localSGD_hook.post_localSGD_hook)
            self.averager = PeriodicModelAverager(period=m.param, warmup_steps=0)
            # The averager averages when its step count is a multiple of the period and
            # counts after; from 1, it averages after steps H, 2H, ... as fastps's LocalSGD.
            self.averager.step = 1
            opt = PostLocalSGDOptimizer(optim=opt, averager=self.averager)
        return self.ddp, opt

    def epoch_end(self) -> None:
        if self.averager is None or self.averager.step == 1:
            return
        import torch.distributed as dist
        from torch.distributed.algorithms.model_averaging import utils

        world = dist.group.WORLD
        assert world is not None  # the process group is up while training
        utils.average_parameters(iter(self.ddp.parameters()), world)
        self.averager.step = 1  # the next average H steps from now

    def sum(self, values: List[float]) -> List[float]:
        import torch
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t)
        return [float(v) for v in t]

    def shutdown(self) -> None:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()


class TorchftComm(DdpComm):
    """torchft's DiLoCo: one replica group (one process) per host, its own TCPStore; the
    lighthouse runs in rank 0's process. The evaluation's sums use a Gloo group of their
    own (``DdpComm``)."""

    def __init__(self, method: Method, args: argparse.Namespace) -> None:
        super().__init__(method, args)
        self.stack: List[Callable[[], None]] = []
        self.diloco: Any = None
        self.manager: Any = None

    def wrap(self, model: Any, lr: float, total_steps: int) -> Tuple[Any, Any]:
        import torch
        import torch.distributed as dist
        from torchft import Manager, ProcessGroupGloo
        from torchft._torchft import LighthouseServer
        from torchft.local_sgd import DiLoCo as FtDiLoCo

        timeout = datetime.timedelta(seconds=self.args.run_timeout)
        master = os.environ["MASTER_ADDR"]
        lh_port = int(os.environ["MASTER_PORT"]) + 1
        if self.rank == 0:
            lighthouse = LighthouseServer(
                bind=f"0.0.0.0:{lh_port}", min_replicas=self.size, join_timeout_ms=100
            )
            self.stack.append(lighthouse.shutdown)
        dist.barrier()  # the lighthouse is up
        me = os.environ.get("FASTPS_HOST", "127.0.0.1")
        store = dist.TCPStore(me, 0, 1, is_master=True, timeout=timeout)
        self.store = store
        inner = torch.optim.Adam(model.parameters(), lr=lr)
        outer = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
        self.manager = Manager(
            pg=ProcessGroupGloo(timeout=timeout),
            load_state_dict=lambda sd: model.load_state_dict(sd["model"]),
            state_dict=lambda: {"model": model.state_dict()},
            min_replica_size=self.size,
            use_async_quorum=False,
            timeout=timeout,
            quorum_timeout=timeout,
            connect_timeout=timeout,
            rank=0,
            world_size=1,
            store_addr=me,
            store_port=store.port,
            lighthouse_addr=f"http://{master}:{lh_port}",
            replica_id=f"replica{self.rank}",
            hostname=me,
            # Every replica starts from the same seed's model, so none needs to heal from
            # another at the first step. (Healing fetches a checkpoint from an address built
            # from socket.gethostname(), which inside a rack host resolves to 127.0.0.1.)
            init_sync=False,
        )
        self.stack.append(lambda: self.manager.shutdown(wait=False))
        self.diloco = FtDiLoCo(self.manager, [model], inner, outer, sync_every=self.method.param)
        self.diloco.__enter__()
        self.stack.append(lambda: self.diloco.__exit__(None, None, None))
        return model, inner

    def shutdown(self) -> None:
        super().shutdown()
        for undo in reversed(self.stack):
            undo()


COMMS: Dict[str, Callable[[Method, argparse.Namespace], Comm]] = {
    "fastps": FastpsComm,
    "ddp": DdpComm,
    "torchft": TorchftComm,
}


def child(args: argparse.Namespace) -> None:
    """One worker of one run; rank 0 emits the epochs' records (rc.emit_result)."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    method = parse_method(args.method)
    comm = COMMS[method.system](method, args)
    rank, size = comm.rank, comm.size
    torch.manual_seed(args.seed)  # before the model, as the compression benchmark does
    task = ct.make_task(args.task, args.n_train)
    epochs = args.epochs or task.epochs
    steps = len(task.x_train) // size // task.batch_size
    if steps < 1:
        raise SystemExit(f"task {task.name}: {len(task.x_train)} examples make no step")
    model, opt = comm.wrap(task.build_model(), task.lr * size, epochs * steps)
    xs, ys = task.x_test[rank::size], task.y_test[rank::size]

    def counters() -> Tuple[int, int]:
        return link_tx_bytes(args.link_dev) or 0, comm.socket_bytes() or 0

    link_sent = sock_sent = 0
    link_mark, sock_mark = counters()
    train_s = 0.0
    records: List[Dict[str, Any]] = []
    for epoch in range(epochs):
        started = time.perf_counter()
        model.train()
        order = torch.randperm(len(task.x_train), generator=torch.Generator().manual_seed(epoch))
        shard = order[rank::size]
        loss_sum = 0.0
        for step in range(steps):
            idx = shard[step * task.batch_size : (step + 1) * task.batch_size]
            opt.zero_grad()
            loss = F.cross_entropy(model(task.x_train[idx]), task.y_train[idx])
            loss.backward()
            opt.step()
            loss_sum += float(loss.item())
        comm.epoch_end()
        train_s += time.perf_counter() - started
        link_now, sock_now = counters()
        link_sent += link_now - link_mark
        sock_sent += sock_now - sock_mark
        model.eval()
        with torch.no_grad():
            correct = int((model(xs).argmax(dim=1) == ys).sum())
        times = [0.0] * size
        times[rank] = train_s
        totals = comm.sum([correct, len(ys), loss_sum, steps, link_sent, sock_sent, *times])
        link_mark, sock_mark = counters()  # the evaluation's bytes are left out
        records.append(
            {
                "epoch": epoch + 1,
                "steps": (epoch + 1) * steps,
                "train_s": max(totals[6:]),  # the slowest worker
                "accuracy": totals[0] / totals[1],
                "loss": totals[2] / totals[3],
                "link_mb": totals[4] / size / 1e6 if args.link_dev else None,
                "socket_mb": totals[5] / size / 1e6 if method.system == "fastps" else None,
            }
        )
    if rank == 0:
        rc.emit_result({"method": method.name, "epochs": records}, rank)
    comm.shutdown()


# ----------------------------------------------------------------------------- runs


def child_argv(args: argparse.Namespace, method: str, task: str, link_dev: str) -> List[str]:
    argv = [sys.executable, "-m", "benchmarks.bench_algorithms", "--child", "--method", method]
    argv += ["--task", task, "--seed", str(args.seed), "--epochs", str(args.epochs)]
    argv += ["--n-train", str(args.n_train), "--freeze-frac", str(args.freeze_frac)]
    argv += ["--overlap-warmup", str(args.overlap_warmup)]
    argv += ["--powersgd-frac", str(args.powersgd_frac), "--run-timeout", str(args.run_timeout)]
    argv += ["--link-dev", link_dev]
    return argv


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_loopback(
    args: argparse.Namespace, method: Method, task: str, out_dir: Path
) -> Tuple[bool, str]:
    """One job on this host's loopback: fastps under its launcher, a peer as n processes
    with Gloo's variables; every process killed after ``--run-timeout`` seconds."""
    argv = child_argv(args, method.name, task, "")
    env = dict(os.environ, RACK_RESULT_DIR=str(out_dir), PYTHONUNBUFFERED="1")
    env.update(rc.QUIET_THREADS, **QUIET_LOGS)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(rc.REPO), env.get("PYTHONPATH")) if p)
    procs: List[subprocess.Popen] = []
    logs: List[Path] = []

    def start(cmd: List[str], extra: Dict[str, str]) -> None:
        log = out_dir / f"log{len(procs)}.txt"
        logs.append(log)
        with open(log, "w", encoding="utf-8") as fh:
            procs.append(
                subprocess.Popen(
                    cmd,
                    env={**env, **extra},
                    cwd=str(rc.REPO),
                    stdin=subprocess.DEVNULL,
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    if method.system == "fastps":
        launcher = [sys.executable, "-m", "fastps.launcher", "-np", str(args.n)]
        start(launcher + argv, {"FASTPS_TIMEOUT": str(int(args.run_timeout))})
    else:
        port = _free_port()
        for rank in range(args.n):
            gloo = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank)}
            gloo.update(WORLD_SIZE=str(args.n), GLOO_SOCKET_IFNAME="lo")
            start(argv, gloo)
    deadline = time.monotonic() + args.run_timeout
    failed_at: Optional[float] = None
    while time.monotonic() < deadline:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            break
        if failed_at is None and any(c not in (None, 0) for c in codes):
            failed_at = time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > 3.0:
            break
        time.sleep(0.05)
    codes = [p.poll() for p in procs]
    for p in procs:
        if p.poll() is None:
            _kill_group(p)
        p.wait(timeout=10)
    text = "\n".join(log.read_text(encoding="utf-8", errors="replace")[-3000:] for log in logs)
    if any(c is None for c in codes):
        return False, f"timed out after {args.run_timeout:g} s\n{text}"
    if any(c != 0 for c in codes):
        return False, f"exit codes {codes}\n{text}"
    return True, ""


def run_rack(
    rack: Any, args: argparse.Namespace, method: Method, task: str, out_dir: Path, port: int
) -> Tuple[bool, str]:
    """One job on the rack: fastps with a server on every worker host (k = 0), a peer as
    one process per worker host."""
    argv = child_argv(args, method.name, task, LINK_DEV)
    env = {"RACK_RESULT_DIR": str(out_dir), **QUIET_LOGS}
    if method.system == "fastps":
        launch = rc.start_fastps(
            rack, args.n, 0, argv, port, env, timeout_s=args.run_timeout, label=f"alg{port}"
        )
    else:
        launch = rc.start_gloo(rack, args.n, argv, port, env, label=f"peer{port}")
    return rc.wait_all(rack, launch, args.run_timeout)


def run_method(
    args: argparse.Namespace,
    method: Method,
    task: str,
    rate: Optional[float],
    rack: Any = None,
    port: int = 0,
) -> List[Dict[str, Any]]:
    """Trains once; the epochs' rows (one failed row if the run failed)."""
    load = rc.load_text()
    busy0, wall0 = machine_busy_seconds(), time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fastps-alg-") as tmp:
        if rack is None:
            ok, err = run_loopback(args, method, task, Path(tmp))
        else:
            ok, err = run_rack(rack, args, method, task, Path(tmp), port)
        result = rc.read_results(Path(tmp)).get(0)
    wall = time.monotonic() - wall0
    busy = (machine_busy_seconds() - busy0) / (wall * (os.cpu_count() or 1))
    base = {
        "task": task,
        "rate_mbit": f"{rate:g}" if rate is not None else "loopback",
        "n": args.n,
        "method": method.name,
        "system": method.system,
        "optimizer": method.optimizer(),
        "wall_s": wall,
        "cpu_busy": busy,
        "load": load,
    }
    if not ok or result is None:
        why = (err or "no result from rank 0").strip()
        print(f"  {task} {method.name}: FAILED\n    " + "\n    ".join(why.splitlines()[-20:]))
        return [dict(base, status="failed: " + _why(why))]
    rows = [dict(base, status="ok", **rec) for rec in result["epochs"]]
    last = rows[-1]
    link = f"{last['link_mb']:.2f} MB link" if last.get("link_mb") is not None else "no link"
    print(
        f"  {task:6s} {f'{rate:g}' if rate is not None else 'lo':>5} {method.name:20s} accuracy "
        f"{last['accuracy']:.4f} after {last['epoch']} epochs, {last['train_s']:.1f} s "
        f"training, {link} / worker  [{wall:.0f} s wall, CPU busy {busy:.0%}, load {load}]",
        flush=True,
    )
    return rows


def _why(err: str) -> str:
    """One line for a failed run's status: the last error a process printed, else the
    first line (a timeout's)."""
    lines = [ln.strip() for ln in err.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "Error" in ln or "error:" in ln]
    return (errors[-1] if errors else lines[0] if lines else "unknown")[:200]


# ----------------------------------------------------------------------------- summary


def _num(value: Any) -> Optional[float]:
    if isinstance(value, (int, float)):
        return float(value)
    return rc.csv_number(value)


def _curves(rows: Sequence[Dict[str, Any]], task: str, rate: str) -> Dict[str, List[Dict]]:
    """method -> its epoch rows in order (failed runs left out)."""
    out: Dict[str, List[Dict]] = {}
    for r in rows:
        if r["task"] == task and str(r["rate_mbit"]) == rate and r.get("status") == "ok":
            out.setdefault(r["method"], []).append(r)
    for run in out.values():
        run.sort(key=lambda r: int(r["epoch"]))
    return out


def _bytes(row: Dict[str, Any]) -> Optional[float]:
    """Megabytes per worker: the host link's where measured, else the sockets'."""
    link = _num(row.get("link_mb"))
    return link if link is not None else _num(row.get("socket_mb"))


def summarize(
    rows: Sequence[Dict[str, Any]], task: str, rate: str, target_points: float
) -> List[Dict[str, Any]]:
    """One summary per method of ``task`` at ``rate``, in the order they ran (failed runs
    included, with no numbers). The target is fastps:none's final accuracy minus
    ``target_points`` points."""
    curves = _curves(rows, task, rate)
    if BASELINE not in curves:
        raise ValueError(f"{task} at {rate}: no successful {BASELINE} run to compare with")
    base_final = float(curves[BASELINE][-1]["accuracy"])
    target = base_final - target_points / 100.0
    base_bytes = _bytes(curves[BASELINE][-1])
    mine = [r for r in rows if r["task"] == task and str(r["rate_mbit"]) == rate]
    order = list(dict.fromkeys(r["method"] for r in mine))
    out: List[Dict[str, Any]] = []
    for name in order:
        run = curves.get(name)
        failed = next((r["status"] for r in mine if r["method"] == name), "")
        s: Dict[str, Any] = {
            "method": name,
            "system": name.split(":")[0],
            "optimizer": parse_method(name).optimizer(),
            "target": target,
            "base_final": base_final,
        }
        if not run:
            s["status"] = failed
            out.append(s)
            continue
        last = run[-1]
        hit = next((r for r in run if float(r["accuracy"]) >= target), None)
        mb = _bytes(last)
        s.update(
            status="ok",
            final=float(last["accuracy"]),
            delta_points=100.0 * (float(last["accuracy"]) - base_final),
            tta_s=float(hit["train_s"]) if hit else None,
            tta_epoch=int(hit["epoch"]) if hit else None,
            train_s=float(last["train_s"]),
            first_s=float(run[0]["train_s"]),
            # The later epochs' median: the first holds one-time setup (fastps: every
            # tensor's first push declares it to the servers; DDP: its buckets).
            epoch_s=statistics.median(
                float(b["train_s"]) - float(a["train_s"]) for a, b in zip(run, run[1:])
            )
            if len(run) > 1
            else None,
            epochs=int(last["epoch"]),
            mb=mb,
            link_mb=_num(last.get("link_mb")),
            socket_mb=_num(last.get("socket_mb")),
            fewer_bytes=(base_bytes / mb) if base_bytes and mb else None,
            cpu_busy=_num(last.get("cpu_busy")),
        )
        out.append(s)
    peers = [s for s in out if s["system"] != "fastps" and s.get("tta_s") is not None]
    best_peer = min(peers, key=lambda s: s["tta_s"]) if peers else None
    for s in out:
        s["best_peer"] = best_peer["method"] if best_peer else None
        tta = s.get("tta_s")
        s["vs_peer"] = tta / best_peer["tta_s"] if tta is not None and best_peer else None
    return out


def verdicts(summary: Sequence[Dict[str, Any]], rate: str, target_points: float) -> List[str]:
    """Issue 42's done-when, checked on one task at one rate."""
    lines: List[str] = []
    ok = [s for s in summary if s.get("status") == "ok"]
    mine = [s for s in ok if s["system"] == "fastps" and s.get("tta_s") is not None]
    peers = [s for s in ok if s["system"] != "fastps" and s.get("tta_s") is not None]
    best = min(mine, key=lambda s: s["tta_s"]) if mine else None
    peer = min(peers, key=lambda s: s["tta_s"]) if peers else None
    if _num(rate) is None:
        need = 1.0
        where = f"on {rate}"
    else:
        need = 1.5 if float(rate) < 500 else 1.0
        where = f"at {rate} Mbit/s"
    if best is None:
        lines.append(f"MISS: no fastps method reached the target {where}")
    elif peer is None:
        lines.append(
            f"PASS (no peer ran or reached the target): fastps's best, {best['method']}, "
            f"reached it in {best['tta_s']:.1f} s"
        )
    else:
        speedup = peer["tta_s"] / best["tta_s"]
        verdict = "PASS" if speedup >= need else "MISS"
        lines.append(
            f"{verdict}: {where} fastps's best ({best['method']}, "
            f"{best['tta_s']:.1f} s) reaches the target {speedup:.2f}x sooner than the best "
            f"peer ({peer['method']}, {peer['tta_s']:.1f} s); needed >= {need:g}x"
        )
    onebit = next((s for s in ok if s["method"] == "fastps:onebit-adam"), None)
    if onebit is not None:
        close = onebit["delta_points"] >= -target_points
        fewer = onebit.get("fewer_bytes")
        verdict = "PASS" if close and fewer is not None and fewer >= 4 else "MISS"
        lines.append(
            f"{verdict}: 1-bit Adam ends {onebit['delta_points']:+.2f} points from uncompressed "
            f"Adam (needed within {target_points:g}) at "
            f"{f'{fewer:.2f}x' if fewer else '?'} fewer bytes (needed >= 4x)"
        )
    return lines


def table(summary: Sequence[Dict[str, Any]], task: str, rate: str) -> str:
    head = summary[0]
    where = f"{rate} Mbit/s" if _num(rate) is not None else str(rate)
    lines = [
        f"{task} at {where}: target {head['target']:.4f} ({BASELINE} final "
        f"{head['base_final']:.4f} − 1 point); times are training seconds of the slowest "
        f"worker, evaluation excluded; MB sent per worker over the run",
        "",
        "| method | optimizer | final accuracy | Δ points | time to target (s) | epoch "
        "| vs best peer | training s | first epoch s | later epochs s (median) "
        "| MB / worker (link) | MB / worker (sockets) | fewer bytes than none | CPU busy |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def f(value: Any, fmt: str) -> str:
        return "" if value is None else format(value, fmt)

    for s in summary:
        if s.get("status") != "ok":
            lines.append(f"| {s['method']} | {s['optimizer']} | {s['status']} |" + " |" * 11)
            continue
        tta = f(s["tta_s"], ".1f") if s["tta_s"] is not None else "not reached"
        delta = "" if s["method"] == BASELINE else f(s["delta_points"], "+.1f")
        lines.append(
            f"| {s['method']} | {s['optimizer']} | {s['final']:.4f} | {delta} | {tta} | "
            f"{f(s['tta_epoch'], 'd')} | {f(s['vs_peer'], '.2f')} | {s['train_s']:.1f} | "
            f"{s['first_s']:.2f} | {f(s['epoch_s'], '.3f')} | "
            f"{f(s['link_mb'], '.2f')} | {f(s['socket_mb'], '.2f')} | "
            f"{f(s['fewer_bytes'], '.1f')} | {f(s['cpu_busy'], '.0%')} |"
        )
    return "\n".join(lines)


def _panels(rows: Sequence[Dict[str, Any]]) -> List[Tuple[str, str]]:
    return list(
        dict.fromkeys((r["task"], str(r["rate_mbit"])) for r in rows if r.get("status") == "ok")
    )


def report(rows: Sequence[Dict[str, Any]], target_points: float) -> str:
    parts: List[str] = []
    for task, rate in _panels(rows):
        try:
            summary = summarize(rows, task, rate, target_points)
        except ValueError as exc:
            parts.append(str(exc))
            continue
        parts.append(table(summary, task, rate))
        parts.append("\n".join(verdicts(summary, rate, target_points)))
    return "\n\n".join(parts)


def plot(
    rows: Sequence[Dict[str, Any]], meta: Dict[str, str], target_points: float, out: Path
) -> None:
    """Per task and rate: test accuracy against training time and against MB sent per
    worker (log scale), fastps solid, the peers dashed, the target dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = _panels(rows)
    if not panels:
        raise ValueError("nothing to plot: no successful runs")
    fig, axes = plt.subplots(len(panels), 2, figsize=(13, 4.6 * len(panels)), squeeze=False)
    names = list(dict.fromkeys(r["method"] for r in rows if r.get("status") == "ok"))
    palette = plt.get_cmap("tab20")
    colors = {name: palette(i % 20) for i, name in enumerate(names)}  # the same in every panel
    for row_axes, (task, rate) in zip(axes, panels):
        curves = _curves(rows, task, rate)
        summary = summarize(rows, task, rate, target_points) if BASELINE in curves else []
        target = summary[0]["target"] if summary else None
        finals = [float(run[-1]["accuracy"]) for run in curves.values()]
        bottom = max(0.0, min([(target or 1.0) - 0.2] + [a - 0.05 for a in finals if a > 0.5]))
        for name, run in curves.items():
            style: Dict[str, Any] = {
                "marker": ".",
                "linewidth": 2.2 if name == BASELINE else 1.3,
                "linestyle": "-" if name.startswith("fastps") else "--",
                "color": colors[name],
            }
            secs = [float(r["train_s"]) for r in run]
            acc = [float(r["accuracy"]) for r in run]
            row_axes[0].plot(secs, acc, label=name, **style)
            mbs = [_bytes(r) for r in run]
            if all(m is not None and m > 0 for m in mbs):
                row_axes[1].plot(mbs, acc, label=name, **style)
        where = f"{rate} Mbit/s" if _num(rate) is not None else rate
        link = all(_num(r.get("link_mb")) is not None for run in curves.values() for r in run)
        sent = "MB sent per worker (host link)" if link else "MB sent per worker (sockets)"
        labels = ("training time, s (slowest worker)", sent)
        for ax, xlabel in zip(row_axes, labels):
            if target is not None:
                ax.axhline(target, linestyle=":", color="gray", label=f"target {target:.3f}")
            ax.set_xlabel(xlabel)
            ax.set_ylabel("test accuracy")
            ax.set_title(f"{task}, n={meta.get('n', '?')} at {where}: accuracy vs {xlabel}")
            ax.set_ylim(bottom, min(1.0, max(finals + [target or 0.0]) + 0.05))
            ax.grid(alpha=0.3)
        row_axes[1].set_xscale("log")
        row_axes[1].legend(fontsize=7, loc="lower right")
    fig.text(
        0.01,
        0.003,
        f"commit {meta.get('commit', '?')}, {meta.get('date', '?')}; {meta.get('machine', '')}; "
        f"load at start {meta.get('load_at_start', '?')}",
        fontsize=7,
    )
    fig.tight_layout(rect=(0, 0.015, 1, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    print(f"bench_algorithms: wrote {out}", flush=True)


# ----------------------------------------------------------------------------- main


def torchft_available() -> Tuple[bool, str]:
    try:
        import torchft  # noqa: F401
    except ImportError as exc:
        return False, f"torchft is not installed ({exc})"
    return True, ""


def orchestrate(args: argparse.Namespace) -> int:
    meta = rc.provenance()
    meta["n"] = str(args.n)
    methods = [parse_method(m) for m in args.methods]
    ok_ft, why_ft = torchft_available()
    if not ok_ft and any(m.system == "torchft" for m in methods):
        print(f"bench_algorithms: skipping torchft: {why_ft}", flush=True)
        meta["torchft"] = "skipped: " + why_ft
        methods = [m for m in methods if m.system != "torchft"]
    rows: List[Dict[str, Any]] = []
    t0 = time.monotonic()

    def record(new: List[Dict[str, Any]]) -> None:
        rows.extend(new)
        meta["load_at_end"] = rc.load_text()
        meta["duration"] = f"{time.monotonic() - t0:.0f} s"
        rc.write_csv(args.out, rows, FIELDS, meta)

    if args.loopback:
        meta["network"] = f"{args.n} workers on loopback (no shaping)"
        for task in args.tasks:
            for m in methods:
                record(run_method(args, m, task, None))
    else:
        from benchmarks.rack import Rack, is_supported

        supported, why = is_supported()
        if not supported:
            print(f"bench_algorithms: emulated rack not supported here: {why}", file=sys.stderr)
            return 2
        port = args.base_port
        for rate in args.rates:
            with Rack(n_workers=args.n, n_cpu_hosts=0, rate_mbit=rate, prefix=args.prefix) as rack:
                link = rack.measure_throughput("w0", "w1", seconds=2.0)
                meta[f"rack_{rate:g}"] = (
                    f"{args.n} worker hosts (a server on each, k=0) at {rate:g} Mbit/s, "
                    f"measured {link:.0f} Mbit/s"
                )
                print(f"bench_algorithms: {meta[f'rack_{rate:g}']}", flush=True)
                for task in args.tasks:
                    for m in methods:
                        port += 5
                        record(run_method(args, m, task, rate, rack, port))
    print(f"bench_algorithms: wrote {args.out} ({time.monotonic() - t0:.0f} s)\n", flush=True)
    print(report(rows, args.target_points), flush=True)
    if args.plot:
        plot(rows, meta, args.target_points, args.plot)
    return 0 if all(r["status"] == "ok" for r in rows) else 1


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--tasks", nargs="+", default=["digits"], choices=ct.TASKS)
    p.add_argument("--methods", nargs="+", default=DEFAULT_METHODS)
    p.add_argument("--rates", nargs="+", type=float, default=[1000.0, 100.0])
    p.add_argument("-n", type=int, default=4, help="worker hosts (a server on each)")
    p.add_argument("--epochs", type=int, default=0, help="0: the task's own (digits 30, cifar 10)")
    p.add_argument("--n-train", type=int, default=0, help="0: the task's own training set")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument(
        "--freeze-frac",
        type=float,
        default=0.2,
        help="1-bit Adam's warm-up, a fraction of the run's steps",
    )
    p.add_argument(
        "--overlap-warmup",
        type=int,
        default=0,
        help="overlapped methods: synchronous rounds before overlapping (overlap_warmup)",
    )
    p.add_argument(
        "--powersgd-frac",
        type=float,
        default=0.1,
        help="PowerSGD compresses from this fraction of the run's steps (torch's advice: 10%%)",
    )
    p.add_argument("--target-points", type=float, default=1.0)
    p.add_argument("--run-timeout", type=float, default=600.0)
    p.add_argument("--loopback", action="store_true", help="no rack: every job on loopback")
    p.add_argument("--prefix", default="fpal")
    p.add_argument("--base-port", type=int, default=33400)
    p.add_argument("--out", type=Path, default=rc.RESULTS_DIR / "algorithms.csv")
    p.add_argument("--plot", type=Path, default=None, help="write the accuracy curves (PNG)")
    p.add_argument("--plot-only", action="store_true", help="only report and plot --out's rows")
    p.add_argument(
        "--inputs",
        nargs="+",
        type=Path,
        default=None,
        help="with --plot-only: these csv files (e.g. one per task) instead of --out",
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--method", default=BASELINE, help=argparse.SUPPRESS)
    p.add_argument("--task", default="digits", choices=ct.TASKS, help=argparse.SUPPRESS)
    p.add_argument("--link-dev", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    try:
        for m in [args.method, *args.methods]:
            parse_method(m)
    except ValueError as exc:
        p.error(str(exc))
    if not args.child and not args.plot_only and BASELINE not in args.methods:
        p.error(f"--methods must include {BASELINE}: the target comes from it")
    if args.n < 2:
        p.error("-n must be >= 2")
    if args.overlap_warmup < 0:
        p.error("--overlap-warmup must be >= 0")
    if not 0 < args.freeze_frac < 1 or not 0 <= args.powersgd_frac < 1:
        p.error("--freeze-frac must be in (0, 1) and --powersgd-frac in [0, 1)")
    if not 0 < args.run_timeout <= 3600 or not math.isfinite(args.target_points):
        p.error("--run-timeout must be in (0, 3600] s")
    return args


def _typed(rows: Sequence[Dict[str, str]]) -> List[Dict[str, Any]]:
    out: List[Dict[str, Any]] = []
    for r in rows:
        row: Dict[str, Any] = dict(r)
        for key in ("train_s", "accuracy", "loss", "link_mb", "socket_mb", "cpu_busy", "wall_s"):
            row[key] = rc.csv_number(r.get(key))
        out.append(row)
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.child:
        child(args)
        return 0
    if args.plot_only:
        rows: List[Dict[str, Any]] = []
        meta: Dict[str, str] = {}
        for path in args.inputs or [args.out]:
            meta, raw = rc.read_csv(path)  # the plot's footer names the last file's run
            rows.extend(_typed(raw))
        print(report(rows, args.target_points), flush=True)
        if args.plot:
            plot(rows, meta, args.target_points, args.plot)
        return 0
    return orchestrate(args)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
