"""Gradient compression on the emulated rack: communication time per iteration.

Every worker holds the float32 gradients of a real model (ResNet-50 or VGG-16 shapes,
benchmarks/rack_common.py; random normal values, so top-k has real work to do) and sums
them over all workers with one ``grouped_push_pull_async`` per iteration, as a training
step would, under each compressor and uncompressed, in the same run on the same rack
(n worker hosts with a server each, links shaped to ``--rates``; benchmarks/rack).
The time of an iteration includes compressing on the workers and decompress-sum-recompress
on the servers: it is what a training step waits for.

PyTorch DDP over Gloo is measured on the same gradients in the same run (``--ddp-hooks``):
a DistributedDataParallel module whose parameters have the model's shapes and whose
backward hands DDP the same random gradients, uncompressed (``none``) and with torch's
comm hooks ``fp16_compress_hook`` (``fp16``) and PowerSGD (``powersgd:R``, matrix
approximation rank R, error feedback and warm start on, compressing from the third
iteration, which the warm-up covers; its buckets run one after the other, which Gloo
needs, see ``in_bucket_order``). A DDP iteration is one backward: copying the
gradients into DDP's 25 MiB buckets (``local_s``: the same backward under ``no_sync()``),
the hook and its all-reduce.

Reported per row: median seconds per iteration of the slowest worker, its speed-up over
fastps uncompressed, the fraction of the physical bound (the time the link needs to move
the uncompressed gradients: BytePS Eq. 6 at the measured goodput, which for 2 workers is
also ring all-reduce's) and the machine's load (the rack's hosts share this machine's
cores, so CPU-heavy codecs compete with the other jobs on it: ratios matter more than
seconds). ``--plot PATH`` draws the seconds per iteration of every row.

    python -m benchmarks.bench_compression                      # both models, 1000 and 100 Mbit/s
    python -m benchmarks.bench_compression --models vgg16 --rates 1000 --iters 3
    python -m benchmarks.bench_compression --plot-only --plot compression.png   # from --out
    python -m benchmarks.bench_compression --digits     # accuracy of the digits example

Needs root (network namespaces). Writes docs/results/compression.csv.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

if __package__ in (None, ""):  # run as a file: make `benchmarks.*` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import rack_common as rc  # noqa: E402

DEFAULT_SPECS = [
    "none",
    "fp16",
    "onebit:ef",
    "topk:0.01:ef",
    "randomk:0.01:ef",
    "dithering:16:ef",
]
DDP_HOOKS = ["none", "fp16", "powersgd:1", "powersgd:4"]
# PowerSGD compresses from this iteration on (the first ones are plain all-reduces that
# its error feedback and warm start need); the warm-up covers them.
POWERSGD_START_ITER = 2
FIELDS = [
    "model",
    "rate_mbit",
    "scale",
    "n",
    "system",
    "compression",
    "model_mb",
    "iters",
    "time_s",
    "time_min_s",
    "speedup",
    "bound_s",
    "frac_bound",
    "local_s",
    "link_goodput_mbit",
    "load",
    "status",
]


def child(args: argparse.Namespace) -> None:
    import fastps
    import numpy as np
    from fastps.worker.compression import Compression

    sizes = _sizes(args.model, args.scale)
    comp = Compression.from_spec(args.spec)
    fastps.init()
    rank = fastps.rank()
    rng = np.random.default_rng(rank)
    grads = [rng.standard_normal(count, dtype=np.float32) * 1e-2 for _, count in sizes]
    outs = [np.empty_like(g) for g in grads]
    order = list(reversed(range(len(grads))))  # backward order: last layer first
    times: List[float] = []
    bad = 0
    for it in range(args.warmup + args.iters):
        fastps.barrier()
        t0 = time.perf_counter()
        handles = fastps.grouped_push_pull_async(
            [grads[i] for i in order],
            average=True,
            names=[sizes[i][0] for i in order],
            priorities=[-i for i in order],
            outs=[outs[i] for i in order],
            compression=comp,
        )
        for h in handles:
            h.synchronize()
        dt = time.perf_counter() - t0
        # The average of n standard normals (x 1e-2) is finite and small whatever the codec.
        bad += sum(int(not np.isfinite(o[:: max(1, len(o) // 64)]).all()) for o in outs)
        bad += sum(int(np.abs(o[:: max(1, len(o) // 64)]).max() > 1.0) for o in outs)
        if it >= args.warmup:
            times.append(dt)
    rc.emit_result({"times": times, "bad": bad, "rank": rank}, rank)
    fastps.barrier()
    fastps.shutdown()


def _sizes(model: str, scale: float) -> List[Tuple[str, int]]:
    """(name, elements) of the gradients both systems sum: the shapes DDP's module holds
    (rack_common.gradient_shapes), so every row moves the same bytes."""
    return [(name, rc.numel(shape)) for name, shape in rc.gradient_shapes(model, scale)]


def _ddp_hook(hook: str) -> Tuple[Any, Any, int]:
    """(state, hook function or None, first compressed iteration) for a --ddp-hooks name."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if hook == "none":
        return None, None, 0
    if hook == "fp16":
        return None, default_hooks.fp16_compress_hook, 0
    if hook.startswith("powersgd:"):
        state = powerSGD_hook.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=int(hook.split(":", 1)[1]),
            start_powerSGD_iter=POWERSGD_START_ITER,
        )
        return state, in_bucket_order(powerSGD_hook.powerSGD_hook), POWERSGD_START_ITER
    raise ValueError(f"unknown DDP hook {hook!r} (none, fp16, powersgd:RANK)")


def in_bucket_order(hook: Any) -> Any:
    """``hook`` with each bucket's work started only once the previous bucket's is done.

    PowerSGD issues its P and Q all-reduces from the completion callbacks of the previous
    all-reduce. Gloo completes futures on its own threads (NCCL's futures complete when
    the work is enqueued, which is why the hook works there), so with several buckets in
    flight a rank may issue bucket b's Q all-reduce before or after bucket b+1's first
    all-reduce, which DDP issues from the autograd thread; Gloo pairs collectives by the
    order they are issued in, and the ranks' orders differ ("Received data size doesn't
    match expected size"; pytorch/pytorch#48478 on collectives from callbacks). Chaining
    the buckets makes every rank issue the same sequence. The chain does not block the
    backward: the next bucket's hook runs from the previous one's completion.
    """
    import torch

    last: List[Any] = [None]

    def ordered(state: Any, bucket: Any) -> Any:
        result = torch.futures.Future()

        def relay(inner: Any) -> None:
            try:
                result.set_result(inner.value())
            except Exception as exc:  # the hook's failure is the bucket's
                result.set_exception(exc)

        def start(_prev: Any) -> None:
            try:
                hook(state, bucket).add_done_callback(relay)
            except Exception as exc:
                result.set_exception(exc)

        prev, last[0] = last[0], result
        if prev is None:
            start(None)
        else:
            prev.add_done_callback(start)
        return result

    # DDP checks the hook's annotations against its own types; this module's are strings.
    ordered.__annotations__ = {}
    return ordered


def child_ddp(args: argparse.Namespace) -> None:
    """DDP over Gloo on the model's gradient shapes: each backward hands DDP this rank's
    fixed random gradients (the forward computes nothing), so an iteration is DDP's own
    work: bucket copies, the comm hook, the all-reduce."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    rank, n = rc.init_gloo_from_env(int(args.run_timeout))
    shapes = [shape for _, shape in rc.gradient_shapes(args.model, args.scale)]
    gen = torch.Generator().manual_seed(rank)
    grads = [torch.randn(shape, generator=gen) * 1e-2 for shape in shapes]

    class Feed(torch.autograd.Function):
        """Returns a fixed gradient for its parameter."""

        @staticmethod
        def forward(ctx: Any, param: Any, grad: Any) -> Any:
            ctx.grad = grad
            return param.new_zeros(())

        @staticmethod
        def backward(ctx: Any, _out: Any) -> Any:
            return ctx.grad, None

    class FixedGradients(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weights = torch.nn.ParameterList(
                torch.nn.Parameter(torch.zeros(shape)) for shape in shapes
            )

        def forward(self) -> Any:
            # Summed in forward order: backward reaches the last layer first.
            total = torch.zeros(())
            for p, g in zip(self.weights, grads):
                total = total + Feed.apply(p, g)
            return total

    model = DistributedDataParallel(
        FixedGradients(), bucket_cap_mb=args.bucket_mb, gradient_as_bucket_view=True
    )
    state, hook, start = _ddp_hook(args.spec)
    if hook is not None:
        model.register_comm_hook(state, hook)
    params = list(model.parameters())

    def backward(sync: bool) -> float:
        for p in params:
            p.grad = None
        dist.barrier()
        t0 = time.perf_counter()
        if sync:
            model().backward()
        else:
            with model.no_sync():
                model().backward()
        return time.perf_counter() - t0

    # PowerSGD's first compressed iteration allocates its matrices: warm that up too.
    warm = max(args.warmup, start + 1 if start else 0)
    times: List[float] = []
    bad = 0
    for it in range(warm + args.iters):
        dt = backward(True)
        for p in params:
            g = p.grad.reshape(-1)[:: max(1, p.numel() // 64)]
            bad += int(not bool(torch.isfinite(g).all()) or float(g.abs().max()) > 1.0)
        if it >= warm:
            times.append(dt)
    local = [backward(False) for _ in range(args.iters)]
    rc.emit_result({"times": times, "bad": bad, "rank": rank, "local": local}, rank)
    dist.barrier()
    dist.destroy_process_group()


def _collect(out_dir: Path, n: int) -> Tuple[Optional[List[float]], str]:
    res = rc.read_results(out_dir)
    if len(res) != n:
        return None, f"results from {sorted(res)} of {n} workers"
    bad = sum(int(r.get("bad", 0)) for r in res.values())
    if bad:
        return None, f"BAD RESULT in {bad} tensor checks"
    per_rank = [r["times"] for r in res.values()]
    iters = min(len(t) for t in per_rank)
    return [max(t[i] for t in per_rank) for i in range(iters)], ""


def _launch(
    rack: Any,
    args: argparse.Namespace,
    system: str,
    model: str,
    spec: str,
    scale: float,
    port: int,
) -> Tuple[Optional[List[float]], Optional[float], str, str]:
    """Runs one row's processes; (times of the slowest worker, DDP's median local
    backward, why there are no times, the processes' error output)."""
    argv = [
        sys.executable,
        "-m",
        "benchmarks.bench_compression",
        "--child",
        system,
        "--model",
        model,
        "--spec",
        spec,
        "--scale",
        str(scale),
        "--iters",
        str(args.iters),
        "--warmup",
        str(args.warmup),
        "--bucket-mb",
        str(args.bucket_mb),
        "--run-timeout",
        str(args.run_timeout),
    ]
    with tempfile.TemporaryDirectory(prefix="compress-") as tmp:
        env = {"RACK_RESULT_DIR": tmp}
        if system == "fastps":
            launch = rc.start_fastps(
                rack, args.n, 0, argv, port, env, timeout_s=args.run_timeout, label=f"cmp{port}"
            )
        else:
            launch = rc.start_gloo(rack, args.n, argv, port, env, label=f"ddp{port}")
        _ok, err = rc.wait_all(rack, launch, args.run_timeout)
        times, why = _collect(Path(tmp), args.n)
        local = [r["local"] for r in rc.read_results(Path(tmp)).values() if "local" in r]
    local_s = statistics.median(max(ts) for ts in zip(*local)) if local else None
    return times, local_s, why, err


def run_rate(
    args: argparse.Namespace, rate: float, rows: List[Dict[str, Any]], meta: Dict[str, str]
) -> None:
    from benchmarks.rack import Rack

    scale = args.scale_100 if rate < 500 else args.scale
    port = args.base_port + int(rate) % 1000 * 7
    with Rack(n_workers=args.n, n_cpu_hosts=0, rate_mbit=rate, prefix=args.prefix) as rack:
        link = rack.measure_throughput("w0", "w1", seconds=2.0)
        print(
            f"bench_compression: {args.n} hosts at {rate:g} Mbit/s, measured {link:.0f} Mbit/s",
            flush=True,
        )
        meta[f"rack_{rate:g}"] = (
            f"{args.n} worker hosts at {rate:g} Mbit/s, measured {link:.0f} Mbit/s"
        )
        for model in args.models:
            sizes = _sizes(model, scale)
            model_bytes = 4 * sum(c for _, c in sizes)
            # The link's time for the uncompressed gradients: fastps's optimum (BytePS
            # Eq. 6, a server on every worker host), for 2 workers also ring all-reduce's.
            bound = rc.fastps_bound_s(args.n, 0, model_bytes, link * 1e6 / 8)
            base: Optional[float] = None
            runs = [("fastps", spec) for spec in args.specs]
            runs += [("ddp-gloo", hook) for hook in args.ddp_hooks]
            for system, spec in runs:
                port += 3
                load = rc.load_text()
                t_start = time.monotonic()
                child = "ddp" if system == "ddp-gloo" else "fastps"
                times, local_s, why, err = _launch(rack, args, child, model, spec, scale, port)
                row: Dict[str, Any] = {
                    "model": model,
                    "rate_mbit": rate,
                    "scale": scale,
                    "n": args.n,
                    "system": system,
                    "compression": spec,
                    "model_mb": model_bytes / 1e6,
                    "bound_s": bound,
                    "link_goodput_mbit": link,
                    "load": load,
                }
                if times is None:
                    row.update(iters=0, status="failed: " + why)
                    print(
                        f"  {model} {system} {spec}: failed: {why}\n    "
                        + "\n    ".join(err.splitlines()[-15:]),
                        flush=True,
                    )
                else:
                    t = statistics.median(times)
                    if system == "fastps" and spec == "none":
                        base = t
                    row.update(
                        iters=len(times),
                        time_s=t,
                        time_min_s=min(times),
                        status="ok",
                        speedup=(base / t) if base else "",
                        frac_bound=bound / t,
                        local_s=local_s if local_s is not None else "",
                    )
                    sp = f"{base / t:.2f}x" if base else "-"
                    extra = f"  (local backward {local_s:.3f} s)" if local_s is not None else ""
                    print(
                        f"  {model:9s} {rate:6g} Mbit/s {system:8s} {spec:16s} {t:8.3f} s/iter  "
                        f"{sp:>7s}  {bound / t:6.2f} of bound  load {load}  "
                        f"[{time.monotonic() - t_start:.0f} s wall]{extra}",
                        flush=True,
                    )
                rows.append(row)
                rc.write_csv(args.out, rows, FIELDS, meta)


def _label(row: Dict[str, Any]) -> str:
    if row.get("system") == "ddp-gloo":
        hook = row["compression"]
        return "DDP " + (f"PowerSGD r{hook.split(':')[1]}" if hook.startswith("powersgd") else hook)
    return row["compression"]


def plot(rows: Sequence[Dict[str, Any]], meta: Dict[str, str], out: Path) -> None:
    """Seconds per iteration of every row, one panel per model and link, fastps and DDP
    in two colours, the uncompressed physical bound dashed (log scale: codecs differ 10x+)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    panels = list(dict.fromkeys((r["model"], float(r["rate_mbit"])) for r in rows))
    if not panels:
        raise ValueError("nothing to plot: no rows")
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.6), squeeze=False)
    for ax, (model, rate) in zip(axes[0], panels):
        mine = [r for r in rows if r["model"] == model and float(r["rate_mbit"]) == rate]
        xs = list(range(len(mine)))
        heights = [rc.csv_number(r.get("time_s")) or 0.0 for r in mine]
        colors = ["tab:orange" if r.get("system") == "ddp-gloo" else "tab:blue" for r in mine]
        ax.bar(xs, heights, color=colors)
        floor = min([h for h in heights if h > 0] or [1.0])  # a log axis has no 0
        for x, h in zip(xs, heights):
            label = f"{h:.3g}" if h else "failed"
            ax.text(x, h or floor, label, ha="center", va="bottom", fontsize=7)
        bound = rc.csv_number(mine[0].get("bound_s"))
        if bound:
            ax.axhline(bound, linestyle="--", color="gray", label=f"bound {bound:.3g} s")
        ax.set_xticks(xs)
        ax.set_xticklabels([_label(r) for r in mine], rotation=45, ha="right", fontsize=8)
        ax.set_yscale("log")
        if max(heights) > 0:
            ax.set_ylim(top=max(heights) * 6)  # room for the legend above the bars
        scale = float(mine[0].get("scale") or 1)
        ax.set_title(f"{model}{f' x{scale:g}' if scale != 1 else ''} at {rate:g} Mbit/s")
        ax.set_ylabel("communication s / iteration")
        handles = [
            Patch(color="tab:blue", label="fastps"),
            Patch(color="tab:orange", label="DDP over Gloo"),
        ]
        handles += ax.get_legend_handles_labels()[0]
        ax.legend(handles=handles, fontsize=8)
    fig.text(
        0.01,
        0.01,
        f"commit {meta.get('commit', '?')}, {meta.get('date', '?')}; {meta.get('machine', '')}",
        fontsize=7,
    )
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    print(f"bench_compression: wrote {out}", flush=True)


DIGITS_SPECS = [
    "none",
    "fp16:ef",
    "onebit:ef",
    "topk:0.01:ef",
    "randomk:0.01:ef",
    # DGC's sparsity warm-up over half of the default 30 epochs' 1,260 rounds
    # (docs/guide/compression.md, "Sparsity warm-up").
    "randomk:0.01:ef:warmup=630",
    "dithering:16:ef",
    "topk:0.01",
]


def digits(args: argparse.Namespace) -> int:
    """Final test accuracy of examples/torch/train_digits.py (2 workers, one host) with
    each compressor, seeds fixed; writes docs/results/compression_digits.csv."""
    import re
    import subprocess

    rows: List[Dict[str, Any]] = []
    meta = rc.provenance()
    script = rc.REPO / "examples" / "torch" / "train_digits.py"
    for spec in args.digits_specs:
        for seed in args.seeds:
            cmd = [
                sys.executable,
                "-m",
                "fastps.launcher",
                "-np",
                "2",
                sys.executable,
                str(script),
                "--epochs",
                str(args.epochs),
                "--seed",
                str(seed),
                "--min-accuracy",
                "0",
            ]
            if spec != "none":
                cmd += ["--compression", spec]
            env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
            load = rc.load_text()
            t0 = time.monotonic()
            res = subprocess.run(
                cmd,
                env=env,
                cwd=str(rc.REPO),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=900,
            )
            found = re.search(r"test accuracy: ([0-9.]+)", res.stdout)
            acc = float(found.group(1)) if found and res.returncode == 0 else None
            rows.append(
                {
                    "compression": spec,
                    "seed": seed,
                    "epochs": args.epochs,
                    "accuracy": acc if acc is not None else "",
                    "wall_s": time.monotonic() - t0,
                    "load": load,
                    "status": "ok" if acc is not None else "failed",
                }
            )
            print(
                f"  digits {spec:16s} seed {seed}: accuracy "
                f"{acc if acc is not None else 'FAILED'}  load {load}",
                flush=True,
            )
            if acc is None:
                print(res.stdout[-2000:], flush=True)
            rc.write_csv(
                args.digits_out,
                rows,
                ["compression", "seed", "epochs", "accuracy", "wall_s", "load", "status"],
                meta,
            )
    return 0 if all(r["status"] == "ok" for r in rows) else 1


def orchestrate(args: argparse.Namespace) -> int:
    from benchmarks.rack import is_supported

    ok, why = is_supported()
    if not ok:
        print(f"bench_compression: emulated rack not supported here: {why}", file=sys.stderr)
        return 2
    meta = rc.provenance()
    rows: List[Dict[str, Any]] = []
    for rate in args.rates:
        run_rate(args, rate, rows, meta)
    meta["load_at_end"] = rc.load_text()
    rc.write_csv(args.out, rows, FIELDS, meta)
    print(f"bench_compression: wrote {args.out}")
    if args.plot:
        plot(rows, meta, args.plot)
    return 0 if all(r["status"] == "ok" for r in rows) else 1


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["resnet50", "vgg16"], choices=sorted(rc.MODELS))
    p.add_argument("--rates", nargs="+", type=float, default=[1000.0, 100.0])
    p.add_argument("--specs", nargs="+", default=DEFAULT_SPECS)
    p.add_argument(
        "--ddp-hooks",
        nargs="*",
        default=DDP_HOOKS,
        help="DDP-over-Gloo rows on the same gradients: none, fp16, powersgd:RANK "
        "(none given: no DDP rows)",
    )
    p.add_argument("--bucket-mb", type=int, default=25, help="DDP's bucket size in MiB")
    p.add_argument("--plot", type=Path, default=None, help="write a bar chart (PNG) here")
    p.add_argument(
        "--plot-only", action="store_true", help="only plot the rows of --out (needs --plot)"
    )
    p.add_argument("-n", type=int, default=2, help="worker hosts (a server on each)")
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument(
        "--scale", type=float, default=1.0, help="fraction of every tensor at >= 500 Mbit/s"
    )
    p.add_argument(
        "--scale-100",
        type=float,
        default=0.1,
        help="fraction of every tensor below 500 Mbit/s (keeps the run short)",
    )
    p.add_argument("--run-timeout", type=float, default=600.0)
    p.add_argument("--prefix", default="fpcm")
    p.add_argument("--base-port", type=int, default=31400)
    p.add_argument("--out", type=Path, default=rc.RESULTS_DIR / "compression.csv")
    p.add_argument(
        "--digits",
        action="store_true",
        help="instead: accuracy of the torch digits example per compressor",
    )
    p.add_argument("--digits-specs", nargs="+", default=DIGITS_SPECS)
    p.add_argument("--seeds", nargs="+", type=int, default=[42, 43, 44])
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--digits-out", type=Path, default=rc.RESULTS_DIR / "compression_digits.csv")
    p.add_argument("--child", choices=("fastps", "ddp"), help=argparse.SUPPRESS)
    p.add_argument("--model", default="resnet50", help=argparse.SUPPRESS)
    p.add_argument("--spec", default="none", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for hook in args.ddp_hooks:
        name, _, rank = hook.partition(":")
        if not (hook in ("none", "fp16") or (name == "powersgd" and rank.isdigit() and int(rank))):
            p.error(f"--ddp-hooks: unknown hook {hook!r} (none, fp16, powersgd:RANK)")
    if args.plot_only and not args.plot:
        p.error("--plot-only needs --plot PATH")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.child == "fastps":
        child(args)
        return 0
    if args.child == "ddp":
        child_ddp(args)
        return 0
    if args.plot_only:
        meta, rows = rc.read_csv(args.out)
        plot(rows, meta, args.plot)
        return 0
    if args.digits:
        return digits(args)
    return orchestrate(args)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
