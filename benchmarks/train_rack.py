"""Training benchmark on the emulated rack: samples/s of data-parallel training.

n = 4 worker hosts (and k CPU hosts for fastps), every host link shaped to each of
``--rates`` Mbit/s. Two self-contained PyTorch models on 32x32 synthetic images (CPU):

- ``vgg``: a VGG-like net (3x3 convolutions 16-32-64 with max pooling, then fully connected
  1024-4096-1024-10): 8.4 M parameters, 34 MB of gradients per step, little compute:
  communication bound at 1 Gbit/s, like VGG-16 on GPUs;
- ``resnet``: a ResNet-18-like net (stride-2 stem, basic blocks 2-2-2-2, widths
  32-64-128-256, batch norm): 2.8 M parameters, 11 MB, much more compute per byte.

Systems, measured in the same run:

- fastps with k = 0 and k = 2 CPU hosts (servers on every worker host + the CPU hosts),
  through ``fastps.torch.DistributedOptimizer`` when the plugin works; otherwise through the
  core API (``push_pull_async`` from gradient hooks, as the plugin would) and the CSV says so;
- PyTorch DDP with the Gloo backend (25 MiB buckets, the default);
- the ceiling: linear scaling of one worker's speed, 4 x the samples/s of one worker
  training alone (no network), and, for reference, the 4 workers training at once with no
  synchronisation at all (what the machine's cores can do: the 4 workers share them).

Throughput is n x batch x steps / the slowest worker's time for ``--steps`` steps after
``--warmup`` steps. All workers start from the same weights; fastps's result is checked
(every worker must end with the same weights).

    python -m benchmarks.train_rack                         # vgg + resnet, 1, 2.5, 5 Gbit/s
    python -m benchmarks.train_rack --models vgg --rates 1000 --steps 5

Needs root. Writes docs/results/train.csv.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import rack_common as rc  # noqa: E402

FIELDS = [
    "model",
    "system",
    "n",
    "k",
    "rate_mbit",
    "link_goodput_mbit",
    "batch",
    "steps",
    "samples_per_s",
    "step_s",
    "frac_linear",
    "params_m",
    "grad_mb",
    "api",
    "status",
    "note",
]
MODEL_BATCH = {"vgg": 32, "resnet": 16}


# ============================================================================ models


def build_model(name: str) -> Any:
    import torch
    from torch import nn

    class VGGLike(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            layers: List[nn.Module] = []
            cin = 3
            for item in (16, "M", 32, "M", 64, "M"):
                if item == "M":
                    layers.append(nn.MaxPool2d(2))
                else:
                    layers += [nn.Conv2d(cin, int(item), 3, padding=1), nn.ReLU(inplace=True)]
                    cin = int(item)
            self.features = nn.Sequential(*layers)
            self.classifier = nn.Sequential(
                nn.Flatten(),
                nn.Linear(64 * 4 * 4, 4096),
                nn.ReLU(inplace=True),
                nn.Linear(4096, 1024),
                nn.ReLU(inplace=True),
                nn.Linear(1024, 10),
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.classifier(self.features(x))

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.short: nn.Module = nn.Identity()
            if stride != 1 or cin != cout:
                self.short = nn.Sequential(
                    nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
                )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.relu(self.bn1(self.conv1(x)))
            return torch.relu(self.bn2(self.conv2(y)) + self.short(x))

    class ResNetLike(nn.Module):
        def __init__(
            self,
            widths: Tuple[int, ...] = (32, 64, 128, 256),
            blocks: Tuple[int, ...] = (2, 2, 2, 2),
        ) -> None:
            super().__init__()
            # A stride-2 stem (stages at 16, 8, 4, 2 pixels) keeps the compute per step small
            # enough that 4 workers sharing 2 cores still wait on the network.
            self.stem = nn.Sequential(
                nn.Conv2d(3, widths[0], 3, 2, 1, bias=False),
                nn.BatchNorm2d(widths[0]),
                nn.ReLU(inplace=True),
            )
            stages: List[nn.Module] = []
            cin = widths[0]
            for i, (w, b) in enumerate(zip(widths, blocks)):
                for j in range(b):
                    stages.append(Block(cin, w, 2 if (i > 0 and j == 0) else 1))
                    cin = w
            self.stages = nn.Sequential(*stages)
            self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 10))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.stages(self.stem(x)))

    if name == "vgg":
        return VGGLike()
    if name == "resnet":
        return ResNetLike()
    raise ValueError(f"unknown model {name!r}")


def model_stats(name: str) -> Tuple[float, float]:
    """(parameters in millions, gradient MB) of a model."""
    model = build_model(name)
    count = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return count / 1e6, count * 4 / 1e6


# ============================================================================ children


def _setup(args: argparse.Namespace, rank: int) -> Tuple[Any, Any, Any, Any]:
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(1234)  # the same initial weights on every worker
    model = build_model(args.model)
    gen = torch.Generator().manual_seed(100 + rank)  # different data per worker
    x = torch.randn(args.batch, 3, 32, 32, generator=gen)
    y = torch.randint(0, 10, (args.batch,), generator=gen)
    return torch, model, x, y


def _timed_loop(args: argparse.Namespace, step: Any, barrier: Any) -> Tuple[float, List[float]]:
    for _ in range(args.warmup):
        step()
    barrier()
    marks: List[float] = []
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
        marks.append(time.perf_counter())
    elapsed = time.perf_counter() - t0
    return elapsed, [b - a for a, b in zip([t0] + marks[:-1], marks)]


def _checksum(model: Any) -> float:
    return float(sum(float(p.detach().double().sum()) for p in model.parameters()))


def child_single(args: argparse.Namespace) -> None:
    """One worker, no network: the per-worker speed that linear scaling multiplies."""
    torch, model, x, y = _setup(args, int(os.environ.get("RACK_RANK", "0")))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step() -> None:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()

    elapsed, steps = _timed_loop(args, step, lambda: None)
    rank = int(os.environ.get("RACK_RANK", "0"))
    rc.emit_result({"elapsed": elapsed, "step_times": steps, "api": "none"}, rank)


def _fastps_plugin_step(args: argparse.Namespace) -> Tuple[Any, Any, Any, int, str]:
    import fastps.torch as hvd

    hvd.init()
    rank = hvd.rank()
    torch, model, x, y = _setup(args, rank)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step() -> None:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()

    def done() -> None:
        hvd.shutdown()

    return model, step, done, rank, "fastps.torch.DistributedOptimizer"


def _fastps_core_step(args: argparse.Namespace) -> Tuple[Any, Any, Any, int, str]:
    """The plugin's job done by hand: push_pull each gradient as soon as backward makes it."""
    import fastps

    fastps.init()
    rank = fastps.rank()
    torch, model, x, y = _setup(args, rank)
    params = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    opt = torch.optim.SGD([p for _, p in params], lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    pending: List[Any] = []

    def hook(index: int, name: str) -> Any:
        def fire(p: Any) -> None:
            g = p.grad.numpy()  # contiguous CPU float32, summed in place
            pending.append(
                fastps.push_pull_async(g, average=True, name=name, priority=-index, out=g)
            )

        return fire

    for i, (name, p) in enumerate(params):
        p.register_post_accumulate_grad_hook(hook(i, name))

    def step() -> None:
        opt.zero_grad(set_to_none=False)
        loss_fn(model(x), y).backward()
        for h in pending:
            h.synchronize()
        pending.clear()
        opt.step()

    # Same start on every worker (rank 0's weights), like broadcast_parameters.
    for i, (name, p) in enumerate(params):
        if rank != 0:
            p.data.zero_()
        arr = p.data.numpy()
        fastps.push_pull(arr, average=False, name=f"init.{name}", priority=-i, out=arr)
    return model, step, fastps.shutdown, rank, "fastps core push_pull_async (grad hooks)"


def child_fastps(args: argparse.Namespace) -> None:
    if args.api == "plugin":
        model, step, done, rank, api = _fastps_plugin_step(args)
    else:
        model, step, done, rank, api = _fastps_core_step(args)
    import fastps

    elapsed, steps = _timed_loop(args, step, fastps.barrier)
    rc.emit_result(
        {"elapsed": elapsed, "step_times": steps, "api": api, "checksum": _checksum(model)}, rank
    )
    fastps.barrier()
    done()


def child_ddp(args: argparse.Namespace) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, n = rc.init_gloo_from_env(args.op_timeout)
    torch, model, x, y = _setup(args, rank)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step() -> None:
        opt.zero_grad()
        loss_fn(ddp(x), y).backward()
        opt.step()

    elapsed, steps = _timed_loop(args, step, dist.barrier)
    rc.emit_result(
        {
            "elapsed": elapsed,
            "step_times": steps,
            "api": "torch DDP (gloo)",
            "checksum": _checksum(model),
        },
        rank,
    )
    dist.barrier()
    dist.destroy_process_group()


CHILDREN = {"single": child_single, "fastps": child_fastps, "ddp": child_ddp}


# ============================================================================ orchestrator


class Trainer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.port = args.base_port
        self.rows: List[Dict[str, Any]] = []
        self.api = "plugin" if args.fastps_api in ("auto", "plugin") else "core"
        self.api_note = ""
        self.stats = {m: model_stats(m) for m in args.models}
        self.linear: Dict[str, float] = {}

    def argv(self, system: str, model: str) -> List[str]:
        a = self.args
        return [
            sys.executable,
            "-m",
            "benchmarks.train_rack",
            "--child",
            system,
            "--model",
            model,
            "--batch",
            str(a.batch.get(model, MODEL_BATCH[model])),
            "--steps",
            str(a.steps),
            "--warmup",
            str(a.warmup),
            "--api",
            self.api,
            "--op-timeout",
            str(int(a.run_timeout)),
        ]

    def base_row(
        self, model: str, system: str, n: int, k: int, rate: float, link: float
    ) -> Dict[str, Any]:
        params_m, grad_mb = self.stats[model]
        return {
            "model": model,
            "system": system,
            "n": n,
            "k": k,
            "rate_mbit": rate,
            "link_goodput_mbit": link,
            "batch": self.args.batch.get(model, MODEL_BATCH[model]),
            "steps": self.args.steps,
            "params_m": params_m,
            "grad_mb": grad_mb,
        }

    def finish(
        self,
        row: Dict[str, Any],
        res: Dict[int, Dict[str, Any]],
        n: int,
        ok: bool,
        err: str,
        check: bool,
    ) -> Dict[str, Any]:
        if len(res) != n:
            row["status"] = (
                "failed: "
                + (_first_error(err) if not ok else "")
                + f" (results from {len(res)} of {n} workers)"
            )
            return row
        if check:
            sums = [r["checksum"] for r in res.values()]
            spread = max(sums) - min(sums)
            if spread > 1e-6 * max(1.0, abs(sums[0])):
                row["status"] = f"failed: workers' weights differ (checksums {sums})"
                return row
        elapsed = max(r["elapsed"] for r in res.values())
        row["samples_per_s"] = n * row["batch"] * self.args.steps / elapsed
        row["step_s"] = elapsed / self.args.steps
        row["api"] = next(iter(res.values())).get("api", "")
        lin = self.linear.get(row["model"])
        if lin:
            row["frac_linear"] = row["samples_per_s"] / lin
        row["status"] = "ok"
        return row

    def launch(
        self, rack: Any, system: str, model: str, n: int, k: int, rate: float, link: float
    ) -> Dict[str, Any]:
        self.port += 3
        label = f"fastps k={k}" if system == "fastps" else "DDP-Gloo"
        row = self.base_row(model, label, n, k, rate, link)
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"train-{system}-") as tmp:
            env = {"RACK_RESULT_DIR": tmp}
            if system == "fastps":
                launch = rc.start_fastps(
                    rack,
                    n,
                    k,
                    self.argv("fastps", model),
                    self.port,
                    {**env, **self.args.fastps_env},
                    timeout_s=self.args.run_timeout,
                    label=f"fps{self.port}",
                )
            else:
                launch = rc.start_gloo(
                    rack, n, self.argv("ddp", model), self.port, env, label=f"ddp{self.port}"
                )
            ok, err = rc.wait_all(rack, launch, self.args.run_timeout)
            res = rc.read_results(Path(tmp))
        row = self.finish(row, res, n, ok, err, check=True)
        row["note"] = f"wall {time.monotonic() - t0:.0f} s"
        if row["status"] != "ok" and not ok:
            print("    " + "\n    ".join(err.splitlines()[-20:]), flush=True)
        _report(row)
        return row

    def run_fastps(
        self, rack: Any, model: str, n: int, k: int, rate: float, link: float
    ) -> Dict[str, Any]:
        row = self.launch(rack, "fastps", model, n, k, rate, link)
        if row["status"] != "ok" and self.api == "plugin" and self.args.fastps_api == "auto":
            self.api = "core"
            self.api_note = f"fastps.torch failed ({row['status'][:200]}); core API used"
            print(f"  train_rack: {self.api_note}", flush=True)
            row = self.launch(rack, "fastps", model, n, k, rate, link)
        if self.api_note:
            row["note"] += "; " + self.api_note
        return row

    def baselines(self, rack: Any, model: str, n: int) -> List[Dict[str, Any]]:
        """One worker alone (linear-scaling ceiling) and n workers with no sync at all."""
        out: List[Dict[str, Any]] = []
        for count, system in ((1, "linear scaling"), (n, "no sync (CPU ceiling)")):
            row = self.base_row(model, system, n, 0, 0.0, 0.0)
            with tempfile.TemporaryDirectory(prefix="train-single-") as tmp:
                procs = [
                    rack.spawn(
                        rack.workers[i],
                        self.argv("single", model),
                        env={"RACK_RESULT_DIR": tmp, "RACK_RANK": str(i), **rc.QUIET_THREADS},
                        cwd=str(rc.REPO),
                        label=f"single{i}",
                    )
                    for i in range(count)
                ]
                ok, err = rc.wait_all(rack, rc.Launch(procs), self.args.run_timeout)
                res = rc.read_results(Path(tmp))
            row = self.finish(row, res, count, ok, err, check=False)
            if row["status"] == "ok" and count == 1:
                # linear scaling: n x one worker's samples/s
                row["samples_per_s"] *= n
                self.linear[model] = row["samples_per_s"]
                row["frac_linear"] = 1.0
                row["note"] = f"{n} x one worker alone ({row['step_s']:.3f} s/step)"
            elif row["status"] == "ok":
                row["frac_linear"] = row["samples_per_s"] / self.linear.get(model, 1.0)
                row["note"] = f"{n} workers at once, no synchronisation"
            _report(row)
            out.append(row)
        return out


def _first_error(err: str) -> str:
    for line in err.splitlines():
        low = line.lower()
        if "error" in low or "exception" in low or "abort" in low:
            return line.strip()[:300]
    return err.strip().splitlines()[0][:300] if err.strip() else ""


def _report(row: Dict[str, Any]) -> None:
    if row.get("status") == "ok":
        frac = row.get("frac_linear")
        fr = f", {100 * frac:.0f}% of linear" if isinstance(frac, float) else ""
        print(
            f"  {row['model']:6s} {row['system']:22s} rate={row['rate_mbit']:>6g}: "
            f"{row['samples_per_s']:8.1f} samples/s ({row['step_s']:.3f} s/step{fr}) "
            f"[{row.get('note', '')}]",
            flush=True,
        )
    else:
        print(
            f"  {row['model']:6s} {row['system']:22s} rate={row['rate_mbit']:>6g}: "
            f"{row.get('status')}",
            flush=True,
        )


def _print_table(rows: Sequence[Dict[str, Any]]) -> None:
    print(
        f"\n{'model':6s} {'system':22s} {'Mbit/s':>7s} {'samples/s':>10s} {'s/step':>7s} "
        f"{'%linear':>8s}  status"
    )
    for r in rows:
        if r.get("status") == "ok":
            frac = r.get("frac_linear")
            fr = f"{100 * frac:7.1f}%" if isinstance(frac, float) else f"{'-':>8s}"
            print(
                f"{r['model']:6s} {r['system']:22s} {r['rate_mbit']:7g} "
                f"{r['samples_per_s']:10.1f} {r['step_s']:7.3f} {fr}  ok"
            )
        else:
            print(
                f"{r['model']:6s} {r['system']:22s} {r['rate_mbit']:7g} {'-':>10s} "
                f"{'-':>7s} {'-':>8s}  {r.get('status')}"
            )


def orchestrate(args: argparse.Namespace) -> int:
    from benchmarks.rack import Rack, is_supported

    ok, why = is_supported()
    if not ok:
        print(f"train_rack: emulated rack not supported here: {why}", file=sys.stderr)
        return 2
    meta = rc.provenance()
    meta["compute"] = (
        f"{os.cpu_count()} CPU cores shared by all {args.workers} workers and "
        "the servers (one math thread each); synthetic 32x32 data"
    )
    tr = Trainer(args)
    rows: List[Dict[str, Any]] = []
    n = args.workers
    k_max = max(args.cpu_hosts)
    t0 = time.monotonic()
    for ri, rate in enumerate(args.rates):
        with Rack(n_workers=n, n_cpu_hosts=k_max, rate_mbit=rate, prefix=args.prefix) as rack:
            link = rack.measure_throughput("w0", "w1", seconds=args.measure_seconds)
            print(
                f"train_rack: rack n={n} k={k_max} at {rate:g} Mbit/s; measured link "
                f"goodput {link:.1f} Mbit/s ({link / rate:.3f} of rate)",
                flush=True,
            )
            meta[f"rack_{rate:g}"] = f"measured goodput {link:.1f} Mbit/s"
            for model in args.models:
                if ri == 0:  # the ceiling does not depend on the network: once per model
                    rows += tr.baselines(rack, model, n)
                for k in args.cpu_hosts:
                    rows.append(tr.run_fastps(rack, model, n, k, rate, link))
                    rc.write_csv(args.out, rows, FIELDS, meta)
                rows.append(tr.launch(rack, "ddp", model, n, 0, rate, link))
                rc.write_csv(args.out, rows, FIELDS, meta)
    if tr.api_note:
        meta["fastps_api"] = tr.api_note
    meta["duration"] = f"{time.monotonic() - t0:.0f} s"
    meta["load_at_end"] = rc.load_text()
    rc.write_csv(args.out, rows, FIELDS, meta)
    _print_table(rows)
    print(f"\ntrain_rack: wrote {args.out} ({time.monotonic() - t0:.0f} s)")
    return (
        1
        if any(
            r.get("status", "").startswith("failed") and str(r["system"]).startswith("fastps")
            for r in rows
        )
        else 0
    )


def _batches(items: Sequence[str]) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or name not in MODEL_BATCH:
            raise argparse.ArgumentTypeError(f"--batch wants MODEL=N, got {item!r}")
        out[name] = int(value)
    return out


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--models", nargs="+", default=["vgg", "resnet"], choices=sorted(MODEL_BATCH))
    p.add_argument("--workers", "-n", type=int, default=4)
    p.add_argument("--cpu-hosts", "-k", nargs="+", type=int, default=[0, 2])
    p.add_argument(
        "--rates",
        nargs="+",
        type=float,
        default=[1000.0, 2500.0, 5000.0],
        help="Mbit/s per host link, one rack each",
    )
    p.add_argument("--steps", type=int, default=10, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument(
        "--batch",
        nargs="*",
        default=[],
        help="per-model batch size, e.g. vgg=32 resnet=16 (the defaults)",
    )
    p.add_argument(
        "--fastps-api",
        choices=["auto", "plugin", "core"],
        default="auto",
        help="auto: fastps.torch, falling back to the core API if it fails",
    )
    p.add_argument("--fastps-env", nargs="*", default=[])
    p.add_argument("--run-timeout", type=float, default=240.0)
    p.add_argument("--measure-seconds", type=float, default=3.0)
    p.add_argument("--prefix", default="fpsr")
    p.add_argument("--base-port", type=int, default=29600)
    p.add_argument("--out", type=Path, default=rc.RESULTS_DIR / "train.csv")
    p.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    p.add_argument("--model", default="vgg", help=argparse.SUPPRESS)
    p.add_argument("--api", default="plugin", help=argparse.SUPPRESS)
    p.add_argument("--op-timeout", type=int, default=240, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        args.batch = int(args.batch[0]) if args.batch else MODEL_BATCH[args.model]
        return args
    if not 1 <= args.steps <= 1000 or not 0 <= args.warmup <= 100:
        p.error("--steps must be 1..1000 and --warmup 0..100")
    if args.workers < 2:
        p.error("--workers must be >= 2")
    args.batch = _batches(args.batch)
    env: Dict[str, str] = {}
    for item in args.fastps_env:
        key, sep, value = item.partition("=")
        if not sep or not key.startswith("FASTPS_"):
            p.error(f"--fastps-env wants FASTPS_NAME=value, got {item}")
        env[key] = value
    args.fastps_env = env
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.child:
        CHILDREN[args.child](args)
        return 0
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
