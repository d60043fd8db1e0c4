"""Time per iteration and time-to-accuracy with one worker slower: synchronous, quorum rounds
(n-1), async with staleness s in {1, 4} and unbounded, against PyTorch DDP (Gloo), in the
same run (docs/guide/async.md, docs/results/stragglers.md).

A step's compute is emulated by a sleep (``--compute-ms``), so the numbers measure what the
synchronisation scheme makes the fast workers wait, not how the loaded CPU happens to share
its cores. The straggler is the last rank. Two kinds of straggler (``--variants``):

- ``delay``: it sleeps ``--slow-factor`` times as long (a slower machine);
- ``link`` (``--rack`` only): it sleeps as long as the others, but its host's link is
  reshaped to ``--slow-link-mbit`` (by default the rate at which pushing its gradient takes
  twice the compute time, i.e. about a 2x slower step, since the exchange overlaps the
  compute; the straggler ms/iter of the ``link:async-unbounded`` row, where nobody waits
  for anybody, says what it really was).

Two tasks (``--task``):

- ``synthetic``: an MLP of width ``--width`` on a fixed random batch; time per iteration only;
- ``digits``: the same MLP shape on scikit-learn's digits (8x8 images, as
  examples/torch/train_digits.py: each worker its shard of every epoch's shuffled training
  set, Adam at lr x n for synchronous rounds and DDP, lr per worker for async). Rank 0 keeps
  a copy of its parameters every ``--eval-every`` iterations and scores them on the test set
  after training (so scoring costs the run nothing): time until ``--target-acc``, and the
  final accuracy (async: the parameters the servers hold once every worker is done).

Where the processes run:

- loopback (default): every process on this host through ``fastpsrun``'s launcher, with
  ``FASTPS_SHM=0`` so every worker pushes to the servers itself, as on separate machines;
- ``--rack``: the emulated rack (benchmarks/rack, needs root): one worker per worker host,
  the scheduler on w0, the servers on ``--cpu-hosts`` CPU hosts only (a server on the
  straggler's host would slow every worker's exchange, which is not the case studied), every
  link shaped to ``--rate``; DDP runs on the same worker hosts.

    python benchmarks/bench_straggler.py --np 4 --iters 40
    python benchmarks/bench_straggler.py --rack --task digits --np 4 --iters 200 \\
        --prefix fpsg --base-port 29800 --out s.json --plot s.png

Prints one ``RESULT`` line per configuration (a fast worker's, rank 0's, mean time per
measured iteration, the straggler's, the ratio to the no-straggler synchronous time; with
digits the time to the target accuracy, its ratio to the no-straggler synchronous one, and
the final accuracy), then a Markdown table. ``--out FILE.json`` keeps every iteration's time
of both and rank 0's accuracy curve; ``--plot FILE.png`` draws them.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import rack_common as rc  # noqa: E402

DIGITS_FEATURES = 64
Results = Dict[int, Dict[str, Any]]

# ============================================================================ workers


def build_model(in_dim: int, width: int) -> Any:
    import torch

    return torch.nn.Sequential(
        torch.nn.Linear(in_dim, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, 10),
    )


def param_count(in_dim: int, width: int) -> int:
    return in_dim * width + width + width * width + width + width * 10 + 10


def digits_split() -> Tuple[Any, Any, Any, Any]:
    """The train/test split of examples/torch/train_digits.py, as tensors."""
    import numpy as np
    import torch
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, digits.target, test_size=0.25, random_state=0, stratify=digits.target
    )
    t = torch.from_numpy
    return t(x_train), t(y_train), t(x_test), t(y_test)


class Batches:
    """This worker's batches: the one fixed synthetic batch, or its shard of every epoch's
    shuffled digits training set (the same order on every worker, as in the example)."""

    def __init__(self, args: argparse.Namespace, rank: int, size: int) -> None:
        import torch

        self.args, self.rank, self.size = args, rank, size
        self.epoch, self.pos = 0, 0
        self.shard: Any = None
        if args.task == "synthetic":
            gen = torch.Generator().manual_seed(rank)
            self.fixed = (
                torch.randn(args.batch, args.width, generator=gen),
                torch.randint(0, 10, (args.batch,), generator=gen),
            )
        else:
            self.x, self.y, self.x_test, self.y_test = digits_split()
            if len(self.x) // size < args.batch:
                raise ValueError(f"--batch {args.batch} is larger than a worker's shard")

    def next(self) -> Tuple[Any, Any]:
        import torch

        if self.args.task == "synthetic":
            return self.fixed
        if self.shard is None or self.pos + self.args.batch > len(self.shard):
            gen = torch.Generator().manual_seed(self.epoch)
            self.shard = torch.randperm(len(self.x), generator=gen)[self.rank :: self.size]
            self.epoch, self.pos = self.epoch + 1, 0
        idx = self.shard[self.pos : self.pos + self.args.batch]
        self.pos += self.args.batch
        return self.x[idx], self.y[idx]


def build_training(args: argparse.Namespace, size: int, asynchronous: bool) -> Tuple[Any, Any]:
    """The model (the same initial weights everywhere) and its local optimizer."""
    import torch

    torch.manual_seed(args.seed)
    if args.task == "synthetic":
        model = build_model(args.width, args.width)
        return model, torch.optim.SGD(model.parameters(), lr=0.01)
    model = build_model(DIGITS_FEATURES, args.width)
    # Synchronous rounds: one step on the mean of n gradients, at lr * n. Async: every worker
    # steps on its own gradient at lr, n steps per "round" (docs/guide/async.md, learning rate).
    lr = args.lr if asynchronous else args.lr * size
    return model, torch.optim.Adam(model.parameters(), lr=lr)


def train_loop(
    args: argparse.Namespace,
    rank: int,
    size: int,
    model: Any,
    optimizer: Any,
    batches: Batches,
    barrier: Callable[[], None],
) -> Tuple[List[float], List[Tuple[int, float, Any]], float]:
    """Every measured iteration's seconds (past the warm-up rounds); (rank 0, digits)
    parameter snapshots, flat, with the round count and the seconds since the first
    iteration began; seconds spent copying."""
    import torch.nn.functional as F
    from torch.nn.utils import parameters_to_vector

    delay = args.compute_ms / 1000.0
    if rank == size - 1 and args.slow_factor != 1.0:
        delay *= args.slow_factor
    total = args.warmup + args.iters
    keep = rank == 0 and args.task == "digits"
    times: List[float] = []
    snaps: List[Tuple[int, float, Any]] = []
    copying = 0.0

    # Rounds applied, not steps made: under quorum rounds a slow worker catches up on the
    # rounds that closed without it, several in one step (docs/guide/async.md, "Catch-up"), and
    # every worker must stop after the same round.
    def applied(steps: int) -> int:
        return int(getattr(optimizer, "applied_rounds", steps))

    barrier()  # a common start for the time-to-accuracy clock
    start = time.perf_counter()
    it = steps = 0
    while it < total:
        t0 = time.perf_counter()
        x, y = batches.next()
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        time.sleep(delay)  # the rest of the step's compute
        optimizer.step()
        t1 = time.perf_counter()
        steps += 1
        before, it = it, applied(steps)
        if keep and (it // args.eval_every > before // args.eval_every or it == total):
            # One flat copy (one torch call): under load, every call that releases the GIL
            # may wait a switch interval to get it back.
            snaps.append((it, t1 - start, parameters_to_vector(model.parameters())))
            copying += time.perf_counter() - t1
        # The copy counts as rank 0's step time: in synchronous modes the others wait for it.
        # Measured: the steps that end past the warm-up rounds (a caught-up straggler's
        # steps each span several rounds).
        if it > args.warmup:
            times.append(time.perf_counter() - t0)
    return times, snaps, copying


def accuracy(model: Any, x: Any, y: Any) -> float:
    import torch

    with torch.no_grad():
        return float((model(x).argmax(dim=1) == y).double().mean())


def report(
    args: argparse.Namespace,
    rank: int,
    model: Any,
    batches: Batches,
    times: List[float],
    snaps: List[Tuple[int, float, Any]],
    copying: float,
) -> None:
    """Hands this worker's measurements to the orchestrator (rack_common.emit_result)."""
    import torch

    payload: Dict[str, Any] = {
        "rank": rank,
        "host": os.environ.get("FASTPS_HOSTNAME", ""),
        "times": times,
    }
    if snaps:
        from torch.nn.utils import parameters_to_vector, vector_to_parameters

        final = parameters_to_vector(model.parameters())
        curve = []
        with torch.no_grad():
            for it, at, flat in snaps:
                vector_to_parameters(flat, model.parameters())
                curve.append([it, round(at, 4), accuracy(model, batches.x_test, batches.y_test)])
            vector_to_parameters(final, model.parameters())
        payload["curve"] = curve
        payload["copy_ms_per_snapshot"] = round(1000 * copying / len(snaps), 3)
        payload["final_acc"] = accuracy(model, batches.x_test, batches.y_test)
    rc.emit_result(payload, rank)


def fastps_worker(args: argparse.Namespace) -> None:
    import fastps
    import fastps.torch as hvd
    import torch

    torch.set_num_threads(1)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    asynchronous = args.mode == "async"
    batches = Batches(args, rank, size)
    model, opt = build_training(args, size, asynchronous)
    opt = hvd.DistributedOptimizer(
        opt, named_parameters=model.named_parameters(), asynchronous=asynchronous or None
    )
    if not asynchronous:
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    times, snaps, copying = train_loop(args, rank, size, model, opt, batches, fastps.barrier)
    fastps.barrier()
    if asynchronous:
        opt.pull_parameters()  # every worker's last update is in: the servers' final model
    report(args, rank, model, batches, times, snaps, copying)
    hvd.shutdown()


def ddp_worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, size = rc.init_gloo_from_env(args.timeout)
    batches = Batches(args, rank, size)
    model, opt = build_training(args, size, False)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    times, snaps, copying = train_loop(args, rank, size, ddp, opt, batches, dist.barrier)
    report(args, rank, model, batches, times, snaps, copying)
    dist.barrier()
    dist.destroy_process_group()


# ============================================================================ runners


def worker_argv(args: argparse.Namespace, mode: str, slow: float) -> List[str]:
    return [
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        mode,
        "--task",
        args.task,
        "--width",
        str(args.width),
        "--batch",
        str(args.batch),
        "--lr",
        str(args.lr),
        "--seed",
        str(args.seed),
        "--eval-every",
        str(args.eval_every),
        "--compute-ms",
        str(args.compute_ms),
        "--slow-factor",
        str(slow),
        "--iters",
        str(args.iters),
        "--warmup",
        str(args.warmup),
        "--timeout",
        str(args.timeout),
    ]


def collect(out: str) -> Results:
    got: Results = {}
    for line in out.splitlines():
        at = line.find(rc.RESULT_TAG)
        if at >= 0:
            rec = json.loads(line[at + len(rc.RESULT_TAG) :])
            got[rec["rank"]] = rec
    return got


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LoopbackRunner:
    """Every process on this host."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args

    def fastps(self, mode: str, slow: float, env: Dict[str, str]) -> Results:
        # FASTPS_SHM=0: every worker pushes to the servers over TCP, as workers on separate
        # machines do; with shared memory the workers of one host sum locally first, and that
        # local sum waits for every worker of the host (quorum counts hosts: docs/guide/async.md).
        args = self.args
        run_env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", FASTPS_SHM="0")
        run_env.update(env)
        cmd = [sys.executable, "-m", "fastps.launcher", "-np", str(args.np)]
        res = subprocess.run(
            cmd + worker_argv(args, mode, slow),
            env=run_env,
            capture_output=True,
            text=True,
            timeout=args.timeout,
        )
        if res.returncode != 0:
            raise RuntimeError(
                f"fastps {mode} {env} failed:\n{res.stdout[-3000:]}{res.stderr[-3000:]}"
            )
        return collect(res.stdout + res.stderr)

    def ddp(self, slow: float) -> Results:
        args = self.args
        port = free_port()
        procs = []
        for r in range(args.np):
            env = dict(
                os.environ,
                OMP_NUM_THREADS="1",
                PYTHONUNBUFFERED="1",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                RANK=str(r),
                WORLD_SIZE=str(args.np),
            )
            procs.append(
                subprocess.Popen(
                    worker_argv(args, "ddp", slow),
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            )
        out = ""
        for p in procs:
            o, _ = p.communicate(timeout=args.timeout)
            out += o
            if p.returncode != 0:
                raise RuntimeError(f"ddp worker failed:\n{o[-3000:]}")
        return collect(out)

    def slow_link(self, mbit: Optional[float]) -> None:
        if mbit is not None:
            raise RuntimeError("a slower link needs --rack")


class RackRunner:
    """One worker per worker host of an emulated rack, servers on its CPU hosts."""

    def __init__(self, rack: Any, args: argparse.Namespace) -> None:
        self.rack, self.args = rack, args
        self.port = args.base_port
        self.straggler = rack.workers[args.np - 1].name

    def _run(self, launch: Callable[[Dict[str, str], int], Any], what: str) -> Results:
        self.port += 3
        with tempfile.TemporaryDirectory(prefix="straggler-") as tmp:
            procs = launch({"RACK_RESULT_DIR": tmp}, self.port)
            ok, err = rc.wait_all(self.rack, procs, self.args.timeout)
            got = rc.read_results(Path(tmp))
        if not ok or len(got) != self.args.np:
            raise RuntimeError(f"{what}: results from {len(got)} of {self.args.np} workers\n{err}")
        if got[self.args.np - 1].get("host") not in ("", self.straggler):
            raise RuntimeError(
                f"{what}: rank {self.args.np - 1} ran on {got[self.args.np - 1]['host']}"
            )
        return got

    def fastps(self, mode: str, slow: float, env: Dict[str, str]) -> Results:
        a = self.args
        return self._run(
            lambda extra, port: rc.start_fastps(
                self.rack,
                a.np,
                a.cpu_hosts,
                worker_argv(a, mode, slow),
                port,
                {"FASTPS_SHM": "0", **extra, **env},
                timeout_s=a.timeout,
                label=f"st{port}",
                servers_on_workers=False,
            ),
            f"fastps {mode} {env}",
        )

    def ddp(self, slow: float) -> Results:
        a = self.args
        return self._run(
            lambda extra, port: rc.start_gloo(
                self.rack, a.np, worker_argv(a, "ddp", slow), port, extra, label=f"ddp{port}"
            ),
            "ddp",
        )

    def slow_link(self, mbit: Optional[float]) -> None:
        """The straggler's link at ``mbit`` (None: back to the rack's rate)."""
        self.rack.set_rate(self.straggler, mbit or self.args.rate)


# ============================================================================ orchestrator


Config = Tuple[str, str, str, float, Dict[str, str]]  # name, variant, system, slow factor, env


def configurations(args: argparse.Namespace) -> List[Config]:
    n, s = args.np, args.slow_factor
    # its loop counts applied rounds, so a straggler may catch up (docs/guide/async.md)
    q = {"FASTPS_ROUND_QUORUM": str(n - 1), "FASTPS_QUORUM_CATCH_UP": "1"}
    out: List[Config] = [
        ("sync-no-straggler", "none", "sync", 1.0, {}),
        ("ddp-no-straggler", "none", "ddp", 1.0, {}),
    ]
    for variant in args.variants:
        slow = s if variant == "delay" else 1.0
        tag = "" if variant == "delay" else "link:"
        out += [
            (tag + "sync", variant, "sync", slow, {}),
            (tag + "quorum-n-1", variant, "sync", slow, q),
            # A history longer than the run: the straggler's lag (half a round per round at
            # 2x) never reaches it, so this shows a transient straggler's cost.
            (tag + "quorum-n-1-h64", variant, "sync", slow, {**q, "FASTPS_QUORUM_HISTORY": "64"}),
            (tag + "async-s1", variant, "async", slow, {"FASTPS_STALENESS": "1"}),
            (tag + "async-s4", variant, "async", slow, {"FASTPS_STALENESS": "4"}),
            (tag + "async-unbounded", variant, "async", slow, {}),
            (tag + "ddp", variant, "ddp", slow, {}),
        ]
    return out


def time_to_target(
    curve: Sequence[Sequence[float]], target: float
) -> Tuple[Optional[float], Optional[int]]:
    for it, at, acc in curve:
        if acc >= target:
            return float(at), int(it)
    return None, None


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def run_all(args: argparse.Namespace, runner: Any) -> Dict[str, Dict[str, Any]]:
    n = args.np
    only = set(filter(None, args.only.split(",")))
    base: Optional[float] = None
    base_tta: Optional[float] = None
    series: Dict[str, Dict[str, Any]] = {}
    for name, variant, system, slow, env in configurations(args):
        if only and name not in only and name != "sync-no-straggler":
            continue
        before = load()
        t0 = time.monotonic()
        runner.slow_link(args.slow_link_mbit if variant == "link" else None)
        try:
            got = runner.ddp(slow) if system == "ddp" else runner.fastps(system, slow, env)
        except (RuntimeError, subprocess.SubprocessError) as exc:
            # One configuration failing must not cost the others' numbers.
            print(f"bench_straggler: {name} failed: {exc}", flush=True)
            first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            rec = {
                "config": name,
                "variant": variant,
                "slow_factor": slow,
                "status": "failed: " + first,
            }
            rec["slow_link_mbit"] = args.slow_link_mbit if variant == "link" else None
            series[name] = {"fast": [], "straggler": [], "curve": [], "result": rec}
            continue
        fast = sum(got[0]["times"]) / len(got[0]["times"])
        slowest = sum(got[n - 1]["times"]) / len(got[n - 1]["times"])
        if name == "sync-no-straggler":
            base = fast
        rec: Dict[str, Any] = {
            "config": name,
            "variant": variant,
            "workers": n,
            "compute_ms": args.compute_ms,
            "slow_factor": slow,
            "slow_link_mbit": args.slow_link_mbit if variant == "link" else None,
            "fast_ms_per_iter": round(fast * 1000, 1),
            "straggler_ms_per_iter": round(slowest * 1000, 1),
            "vs_sync_no_straggler": round(fast / base, 3) if base else None,
            "status": "ok",
        }
        if "curve" in got[0]:
            tta, tta_iter = time_to_target(got[0]["curve"], args.target_acc)
            if name == "sync-no-straggler":
                base_tta = tta
            rec.update(
                target_acc=args.target_acc,
                tta_s=None if tta is None else round(tta, 2),
                tta_iter=tta_iter,
                tta_vs_sync_no_straggler=round(tta / base_tta, 3) if tta and base_tta else None,
                final_acc=round(got[0]["final_acc"], 4),
                copy_ms_per_snapshot=got[0].get("copy_ms_per_snapshot"),
            )
        rec.update(wall_s=round(time.monotonic() - t0, 1), load_before=before, load_after=load())
        print(rc.RESULT_TAG + json.dumps(rec), flush=True)
        series[name] = {
            "fast": got[0]["times"],
            "straggler": got[n - 1]["times"],
            "curve": got[0].get("curve", []),
            "result": rec,
        }
    runner.slow_link(None)
    return series


def table(series: Dict[str, Dict[str, Any]]) -> str:
    accuracy_cols = any("final_acc" in s["result"] for s in series.values())
    head = (
        "| configuration | straggler | fast worker ms/iter | straggler ms/iter "
        "| vs sync, no straggler |"
    )
    rule = "|---|---|---|---|---|"
    if accuracy_cols:
        head += " time to target (s) | vs sync, no straggler | final accuracy |"
        rule += "---|---|---|"
    lines = [head, rule]
    for name, s in series.items():
        r = s["result"]
        if r["variant"] == "link":
            kind = f"link {r['slow_link_mbit']:g} Mbit/s"
        else:
            kind = f"{r['slow_factor']:g}x compute" if r["variant"] == "delay" else "none"
        if r.get("status", "ok") != "ok":
            lines.append(f"| {name} | {kind} | {r['status']} |")
            continue
        row = (
            f"| {name} | {kind} | {r['fast_ms_per_iter']} | {r['straggler_ms_per_iter']} "
            f"| {r['vs_sync_no_straggler']} |"
        )
        if accuracy_cols:
            tta = "not reached" if r.get("tta_s") is None else f"{r['tta_s']} (it {r['tta_iter']})"
            row += f" {tta} | {r.get('tta_vs_sync_no_straggler')} | {r.get('final_acc')} |"
        lines.append(row)
    return "\n".join(lines)


def plot(series: Dict[str, Dict[str, Any]], args: argparse.Namespace, path: str) -> None:
    """Per straggler variant (columns): rank 0's ms per measured iteration, and (digits) its
    test accuracy against its time; the no-straggler runs are drawn in every column."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = list(args.variants)
    rows = 2 if any(s["curve"] for s in series.values()) else 1
    fig, axes = plt.subplots(
        rows, len(variants), figsize=(7 * len(variants), 4.5 * rows), squeeze=False
    )
    for col, variant in enumerate(variants):
        for name, got in series.items():
            if got["result"]["variant"] not in ("none", variant):
                continue
            style = "--" if "ddp" in name else ":" if "no-straggler" in name else "-"
            ms = [t * 1000 for t in got["fast"]]
            axes[0][col].plot(
                range(args.warmup + 1, args.warmup + 1 + len(ms)), ms, style, label=name, lw=1.2
            )
            if rows == 2 and got["curve"]:
                at = [c[1] for c in got["curve"]]
                acc = [c[2] for c in got["curve"]]
                axes[1][col].plot(at, acc, style, label=name, lw=1.2)
        title = (
            f"{args.slow_factor:g}x slower compute"
            if variant == "delay"
            else f"link at {args.slow_link_mbit:g} Mbit/s"
        )
        where = f"rack, {args.rate:g} Mbit/s links" if args.rack else "loopback"
        axes[0][col].set_title(f"{args.np} workers, one straggler: {title} ({where})")
        axes[0][col].set_xlabel("iteration (after the warm-up)")
        axes[0][col].set_ylabel("rank 0 ms per iteration")
        axes[0][col].legend(fontsize=7, ncol=2)
        axes[0][col].grid(alpha=0.3)
        if rows == 2:
            axes[1][col].axhline(args.target_acc, color="grey", lw=0.8)
            axes[1][col].set_xlabel("rank 0 seconds since the start")
            axes[1][col].set_ylabel("test accuracy (digits)")
            axes[1][col].set_ylim(0.5, 1.0)
            axes[1][col].legend(fontsize=7, ncol=2)
            axes[1][col].grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def orchestrate(args: argparse.Namespace) -> int:
    if args.slow_link_mbit is None and "link" in args.variants:
        # Gradients are pushed while backward runs, before the emulated compute, and the
        # answers come back over the other direction of the full-duplex link: the exchange
        # hides behind the compute until it is longer. Pushing the gradient's bytes in twice
        # the compute time makes the straggler's step ~2x.
        in_dim = args.width if args.task == "synthetic" else DIGITS_FEATURES
        grad_bits = 8 * 4 * param_count(in_dim, args.width)
        args.slow_link_mbit = round(grad_bits / (2 * args.compute_ms / 1000.0) / 1e6, 1)
    meta = rc.provenance()
    print(f"bench_straggler: {json.dumps(meta)}", flush=True)
    if not args.rack:
        series = run_all(args, LoopbackRunner(args))
    else:
        from benchmarks.rack import Rack, is_supported

        ok, why = is_supported()
        if not ok:
            print(f"bench_straggler: emulated rack not supported here: {why}", file=sys.stderr)
            return 2
        with Rack(args.np, args.cpu_hosts, args.rate, prefix=args.prefix) as rack:
            link = rack.measure_throughput("w0", "c0", seconds=2.0)
            meta["rack"] = (
                f"{args.np} worker hosts + {args.cpu_hosts} CPU hosts (the servers), "
                f"{args.rate:g} Mbit/s per host, measured goodput {link:.1f} Mbit/s"
            )
            print(f"bench_straggler: {meta['rack']}", flush=True)
            series = run_all(args, RackRunner(rack, args))
    meta["load_at_end"] = rc.load_text()
    print("\n" + table(series), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "argv": sys.argv[1:], "configs": series}, f, indent=1)
    if args.plot:
        plot(series, args, args.plot)
    return 0


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--np", type=int, default=4)
    p.add_argument("--task", choices=("synthetic", "digits"), default="synthetic")
    p.add_argument("--width", type=int, default=512, help="MLP width (params ~w^2)")
    p.add_argument("--batch", type=int, default=32, help="per worker")
    p.add_argument("--lr", type=float, default=1e-3, help="digits: Adam lr per worker")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--target-acc", type=float, default=0.95)
    p.add_argument("--eval-every", type=int, default=5, help="digits: iterations per snapshot")
    p.add_argument("--compute-ms", type=float, default=100.0)
    p.add_argument("--slow-factor", type=float, default=2.0)
    p.add_argument("--iters", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--only", default="", help="comma-separated configuration names")
    p.add_argument("--variants", default="", help="delay,link (default: delay; rack: both)")
    p.add_argument("--out", default="", help="JSON file for every iteration's time")
    p.add_argument("--plot", default="", help="PNG of a fast worker's time per iteration")
    p.add_argument("--rack", action="store_true", help="run on the emulated rack (root)")
    p.add_argument("--rate", type=float, default=1000.0, help="rack: Mbit/s per host link")
    p.add_argument("--cpu-hosts", type=int, default=1, help="rack: server hosts")
    p.add_argument("--slow-link-mbit", type=float, default=None, help="rack: straggler's link")
    p.add_argument("--prefix", default="fpsg", help="rack: namespace prefix")
    p.add_argument("--base-port", type=int, default=29800, help="rack: first port")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker is not None:
        return args
    if args.np < 2:
        p.error("--np must be >= 2")
    if args.eval_every < 1 or not 0 < args.target_acc <= 1:
        p.error("--eval-every must be >= 1 and --target-acc in (0, 1]")
    variants = [v for v in args.variants.split(",") if v] or (
        ["delay", "link"] if args.rack else ["delay"]
    )
    for v in variants:
        if v not in ("delay", "link"):
            p.error(f"--variants: unknown straggler variant {v!r} (delay, link)")
        if v == "link" and not args.rack:
            p.error("--variants link needs --rack (a shaped link)")
    args.variants = variants
    if args.rack and args.cpu_hosts < 1:
        p.error("--cpu-hosts must be >= 1 (the servers run there)")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.worker == "ddp":
        ddp_worker(args)
        return 0
    if args.worker is not None:
        args.mode = args.worker
        fastps_worker(args)
        return 0
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
