"""Time to accuracy per gradient compressor against uncompressed (docs/results/compression.md).

For every task (``digits``: examples/torch/train_digits.py exactly; ``cifar``: a
CIFAR-shaped synthetic task, benchmarks/compression_tasks.py), compressor and seed, 2
workers train with ``fastps.torch.DistributedOptimizer`` under ``fastpsrun`` (real
processes, a real server, every part over TCP: ``FASTPS_SHM=0``, since a compressed part
never takes shared memory and the local reduce would spare uncompressed parts bytes the
compressed ones pay). After every epoch the workers evaluate the test set (in shards, the
counts summed) and record their cumulative training time (the evaluation excluded), the
bytes their data-plane sockets sent (headers included) and the test accuracy.

Reported per task: each compressor's final accuracy (mean over seeds, with the spread) and
its difference from uncompressed in points; the training time and the epochs until the
test accuracy first reaches the target (``--target`` times uncompressed's mean final
accuracy), and that time's ratio to uncompressed's; megabytes sent per worker per epoch.
``--plot PATH`` draws accuracy against training time and against epochs.

    python -m benchmarks.bench_compression_accuracy                  # both tasks, seed 42
    python -m benchmarks.bench_compression_accuracy --tasks cifar --seeds 42 43 44
    python -m benchmarks.bench_compression_accuracy --plot-only --plot acc.png   # from --out

On one host the link is loopback: the time to accuracy measures what each codec costs in
CPU (compress, decompress-sum-recompress on the server) next to the training itself, not
the bandwidth it saves (docs/results/compression.md measures that on the emulated rack).

A spec's ``warmup=half`` (``randomk:0.01:ef:warmup=half``) is this benchmark's shorthand
for a sparsity warm-up over the first half of the run's rounds (docs/guide/compression.md,
"Sparsity warm-up"); the workers resolve it from the task's rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

if __package__ in (None, ""):  # run as a file: make `benchmarks.*` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import compression_tasks as ct  # noqa: E402
from benchmarks import rack_common as rc  # noqa: E402

DEFAULT_SPECS = [
    "none",
    "fp16",
    "bf16",
    "onebit:ef",
    "topk:0.01:ef",
    "randomk:0.01:ef:warmup=half",
    "dithering:16:ef",
]
FIELDS = [
    "task",
    "compression",
    "resolved",
    "seed",
    "epoch",
    "train_s",
    "accuracy",
    "loss",
    "mb_sent",
    "load",
    "status",
]


def resolve_spec(spec: str, rounds: int) -> str:
    """``warmup=half`` becomes ``warmup=<half of the run's rounds>``."""
    return spec.replace("warmup=half", f"warmup={max(1, rounds // 2)}")


# ----------------------------------------------------------------------------- worker


def child(args: argparse.Namespace) -> None:
    """One worker of one run (started by fastpsrun); rank 0 writes the epochs' records."""
    import fastps
    import fastps.torch as hvd
    import torch
    import torch.nn.functional as F
    from fastps.worker import api

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.set_num_threads(1)
    # The example's order: the seed before the model, so digits trains exactly as it does.
    torch.manual_seed(args.seed)
    task = ct.make_task(args.task, args.n_train)
    epochs = args.epochs or task.epochs
    steps = len(task.x_train) // size // task.batch_size
    if steps < 1:
        raise SystemExit(f"task {task.name}: {len(task.x_train)} examples make no step")
    spec = resolve_spec(args.spec, epochs * steps)
    model = task.build_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=task.lr * size)
    optimizer = hvd.DistributedOptimizer(
        optimizer,
        named_parameters=model.named_parameters(),
        compression=(
            hvd.Compression.none if spec == "none" else fastps.Compression.from_spec(spec)
        ),
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    sent_at_start = api.data_path_stats()["socket_bytes_sent"]

    records: List[Dict[str, Any]] = []
    train_s = 0.0
    xs, ys = task.x_test[rank::size], task.y_test[rank::size]
    for epoch in range(epochs):
        started = time.perf_counter()
        model.train()
        order = torch.randperm(len(task.x_train), generator=torch.Generator().manual_seed(epoch))
        shard = order[rank::size]
        loss_sum = 0.0
        for step in range(steps):
            idx = shard[step * task.batch_size : (step + 1) * task.batch_size]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(task.x_train[idx]), task.y_train[idx])
            loss.backward()
            optimizer.step()  # returns once this step's gradients are averaged
            loss_sum += float(loss.item())
        train_s += time.perf_counter() - started
        model.eval()
        with torch.no_grad():
            correct = int((model(xs).argmax(dim=1) == ys).sum())
        sent = api.data_path_stats()["socket_bytes_sent"] - sent_at_start
        totals = hvd.allreduce(
            torch.tensor([correct, len(ys), loss_sum, steps, sent], dtype=torch.float64),
            name="bench.eval",
            op=hvd.Sum,
        )
        records.append(
            {
                "epoch": epoch + 1,
                "train_s": train_s,
                "accuracy": float(totals[0] / totals[1]),
                "loss": float(totals[2] / totals[3]),
                "mb_sent": float(totals[4]) / size / 1e6,  # per worker, cumulative
            }
        )
    if rank == 0:
        payload = {"task": task.name, "spec": args.spec, "resolved": spec, "epochs": records}
        tmp = Path(args.result).with_suffix(".tmp")
        tmp.write_text(json.dumps(payload), encoding="utf-8")
        os.replace(tmp, args.result)
    hvd.shutdown()


# ----------------------------------------------------------------------------- runs


def run_one(
    task: str, spec: str, seed: int, args: argparse.Namespace, workdir: Path
) -> List[Dict[str, Any]]:
    """Trains once under fastpsrun; the epochs' rows (one 'failed' row if it failed)."""
    result = workdir / f"{task}-{spec.replace(':', '_')}-{seed}.json"
    cmd = [sys.executable, "-m", "fastps.launcher", "-np", "2", sys.executable, "-m"]
    cmd += ["benchmarks.bench_compression_accuracy", "--child", "--task", task, "--spec", spec]
    cmd += ["--seed", str(seed), "--result", str(result), "--n-train", str(args.n_train)]
    if args.epochs:
        cmd += ["--epochs", str(args.epochs)]
    env = dict(os.environ, FASTPS_SHM="0", PYTHONUNBUFFERED="1", **rc.QUIET_THREADS)
    load = rc.load_text()
    try:
        res = subprocess.run(
            cmd,
            env=env,
            cwd=str(rc.REPO),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=args.run_timeout,
        )
        log, code = res.stdout, res.returncode
    except subprocess.TimeoutExpired as exc:
        log = exc.stdout if isinstance(exc.stdout, str) else ""
        code = f"timed out after {args.run_timeout:g} s"
    base = {"task": task, "compression": spec, "seed": seed, "load": load}
    if code != 0 or not result.exists():
        print(f"  {task} {spec} seed {seed}: FAILED ({code})\n{log[-3000:]}", flush=True)
        return [dict(base, status="failed")]
    payload = json.loads(result.read_text(encoding="utf-8"))
    rows = [
        dict(base, resolved=payload["resolved"], status="ok", **rec) for rec in payload["epochs"]
    ]
    last = rows[-1]
    print(
        f"  {task:6s} {spec:28s} seed {seed}: accuracy {last['accuracy']:.4f} after "
        f"{last['epoch']} epochs, {last['train_s']:.1f} s training, "
        f"{last['mb_sent']:.2f} MB sent per worker  (load {load})",
        flush=True,
    )
    return rows


# ----------------------------------------------------------------------------- summary


def _curves(rows: Sequence[Dict[str, Any]], task: str) -> Dict[str, Dict[int, List[Dict]]]:
    """spec -> seed -> that run's epoch rows in order (runs that failed left out)."""
    out: Dict[str, Dict[int, List[Dict]]] = {}
    for r in rows:
        if r["task"] != task or r.get("status") != "ok":
            continue
        out.setdefault(r["compression"], {}).setdefault(int(r["seed"]), []).append(r)
    for runs in out.values():
        for seed in runs:
            runs[seed].sort(key=lambda r: int(r["epoch"]))
    return out


def summarize(
    rows: Sequence[Dict[str, Any]], task: str, target_frac: float
) -> List[Dict[str, Any]]:
    """One summary per compressor of ``task`` (uncompressed first). The target accuracy
    is ``target_frac`` times uncompressed's mean final accuracy; a run that never reaches
    it counts in ``reached`` and not in the time's mean."""
    curves = _curves(rows, task)
    if "none" not in curves:
        raise ValueError(f"task {task}: no successful uncompressed run to compare with")
    none_final = statistics.mean(run[-1]["accuracy"] for run in curves["none"].values())
    target = target_frac * none_final
    out: List[Dict[str, Any]] = []
    specs = ["none"] + [s for s in curves if s != "none"]
    for spec in specs:
        runs = list(curves[spec].values())
        finals = [float(run[-1]["accuracy"]) for run in runs]
        hits = []
        for run in runs:
            hit = next((r for r in run if float(r["accuracy"]) >= target), None)
            if hit is not None:
                hits.append((float(hit["train_s"]), int(hit["epoch"])))
        epochs = [int(run[-1]["epoch"]) for run in runs]
        out.append(
            {
                "compression": spec,
                "seeds": len(runs),
                "final": statistics.mean(finals),
                "final_min": min(finals),
                "final_max": max(finals),
                "delta_points": 100.0 * (statistics.mean(finals) - none_final),
                "target": target,
                "reached": len(hits),
                "tta_s": statistics.mean(h[0] for h in hits) if hits else None,
                "tta_epochs": statistics.mean(h[1] for h in hits) if hits else None,
                "train_s": statistics.mean(float(run[-1]["train_s"]) for run in runs),
                "mb_per_epoch": statistics.mean(
                    float(run[-1]["mb_sent"]) / e for run, e in zip(runs, epochs)
                ),
            }
        )
    base = out[0]["tta_s"]
    for s in out:
        s["tta_ratio"] = s["tta_s"] / base if s["tta_s"] and base else None
    return out


def table(task: str, summary: Sequence[Dict[str, Any]], target_frac: float) -> str:
    """A Markdown table of ``summary``."""
    head = summary[0]
    lines = [
        f"{task}: target {head['target']:.4f} ({target_frac:g} x uncompressed's "
        f"{head['final']:.4f}); times are training seconds (rank 0, evaluation excluded)",
        "",
        "| compressor | seeds | final accuracy (min–max) | Δ vs none (points) | time to target "
        "(s) | vs none | epochs to target | training s (whole run) | MB sent / worker / epoch |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        spread = f" ({s['final_min']:.4f}–{s['final_max']:.4f})" if s["seeds"] > 1 else ""
        delta = "" if s["compression"] == "none" else f"{s['delta_points']:+.1f}"
        if s["tta_s"] is None:
            tta = ratio = epochs = "not reached"
        else:
            tta = f"{s['tta_s']:.1f}"
            ratio = f"{s['tta_ratio']:.2f}×" if s["tta_ratio"] else ""
            epochs = f"{s['tta_epochs']:.1f}"
            if s["reached"] < s["seeds"]:
                tta += f" ({s['reached']} of {s['seeds']} seeds)"
        lines.append(
            f"| {s['compression']} | {s['seeds']} | {s['final']:.4f}{spread} | {delta} | {tta} "
            f"| {ratio} | {epochs} | {s['train_s']:.1f} | {s['mb_per_epoch']:.3f} |"
        )
    return "\n".join(lines)


def plot(
    rows: Sequence[Dict[str, Any]], meta: Dict[str, str], target_frac: float, out: Path
) -> None:
    """Per task: test accuracy (mean over seeds) against training time and against epochs,
    one line per compressor, the target dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(r["task"] for r in rows if r.get("status") == "ok"))
    if not tasks:
        raise ValueError("nothing to plot: no successful runs")
    fig, axes = plt.subplots(len(tasks), 2, figsize=(12, 4.4 * len(tasks)), squeeze=False)
    for row_axes, task in zip(axes, tasks):
        curves = _curves(rows, task)
        summary = summarize(rows, task, target_frac)
        target = summary[0]["target"]
        # Low enough for every compressor's final accuracy, not for the first epochs'.
        bottom = max(0.0, min([target - 0.25] + [s["final"] - 0.05 for s in summary]))
        for spec, runs in curves.items():
            n = min(len(run) for run in runs.values())
            acc = [
                statistics.mean(float(run[i]["accuracy"]) for run in runs.values())
                for i in range(n)
            ]
            secs = [
                statistics.mean(float(run[i]["train_s"]) for run in runs.values()) for i in range(n)
            ]
            label = f"{spec} ({len(runs)} seed{'s' if len(runs) > 1 else ''})"
            style = {"linewidth": 2.4, "color": "black"} if spec == "none" else {"linewidth": 1.3}
            row_axes[0].plot(secs, acc, marker=".", label=label, **style)
            row_axes[1].plot(range(1, n + 1), acc, marker=".", label=label, **style)
        for ax, xlabel in zip(row_axes, ("training time, s (rank 0)", "epoch")):
            ax.axhline(target, linestyle="--", color="gray", label=f"target {target:.3f}")
            ax.set_xlabel(xlabel)
            ax.set_ylabel("test accuracy (mean over seeds)")
            ax.set_title(f"{task}: accuracy against {xlabel.split(',')[0]}")
            ax.set_ylim(bottom, 1.0)
            ax.grid(alpha=0.3)
        row_axes[1].legend(fontsize=8, loc="lower right")
    fig.text(
        0.01,
        0.005,
        f"commit {meta.get('commit', '?')}, {meta.get('date', '?')}; {meta.get('machine', '')}; "
        f"load at start {meta.get('load_at_start', '?')}; 2 workers on loopback",
        fontsize=7,
    )
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    print(f"bench_compression_accuracy: wrote {out}", flush=True)


def report(rows: Sequence[Dict[str, Any]], target_frac: float) -> str:
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    return "\n\n".join(table(t, summarize(rows, t, target_frac), target_frac) for t in tasks)


def _typed(rows: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """CSV rows with their numbers as numbers."""
    out = []
    for r in rows:
        r = dict(r)
        for key in ("train_s", "accuracy", "loss", "mb_sent"):
            r[key] = rc.csv_number(r.get(key))
        for key in ("seed", "epoch"):
            r[key] = int(r[key]) if r.get(key) not in (None, "") else None
        out.append(r)
    return out


def orchestrate(args: argparse.Namespace) -> int:
    meta = rc.provenance()
    rows: List[Dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="fastps-acc-") as tmp:
        for task in args.tasks:
            for spec in args.specs:
                for seed in args.seeds_for(spec):
                    rows.extend(run_one(task, spec, seed, args, Path(tmp)))
                    meta["load_at_end"] = rc.load_text()
                    rc.write_csv(args.out, rows, FIELDS, meta)
    print(f"bench_compression_accuracy: wrote {args.out}\n", flush=True)
    ok = all(r["status"] == "ok" for r in rows)
    if any(r["status"] == "ok" and r["compression"] == "none" for r in rows):
        print(report(rows, args.target), flush=True)
        if args.plot:
            plot(rows, meta, args.target, args.plot)
    return 0 if ok else 1


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", nargs="+", default=list(ct.TASKS), choices=ct.TASKS)
    p.add_argument("--specs", nargs="+", default=DEFAULT_SPECS)
    p.add_argument("--seeds", nargs="+", type=int, default=[42])
    p.add_argument(
        "--ef-seeds",
        nargs="+",
        type=int,
        default=None,
        help="seeds for uncompressed and the error-feedback specs (':ef') instead of --seeds",
    )
    p.add_argument("--epochs", type=int, default=0, help="0: the task's own (digits 30, cifar 10)")
    p.add_argument("--n-train", type=int, default=0, help="0: the task's own training set")
    p.add_argument(
        "--target",
        type=float,
        default=0.95,
        help="target accuracy as a fraction of uncompressed's mean final accuracy",
    )
    p.add_argument("--run-timeout", type=float, default=600.0)
    p.add_argument("--out", type=Path, default=rc.RESULTS_DIR / "compression_accuracy.csv")
    p.add_argument("--plot", type=Path, default=None, help="write the accuracy curves (PNG) here")
    p.add_argument(
        "--plot-only", action="store_true", help="only report and plot the rows of --out"
    )
    p.add_argument(
        "--inputs",
        nargs="+",
        type=Path,
        default=None,
        help="with --plot-only: read these csv files (e.g. one per task) instead of --out",
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--task", default="digits", choices=ct.TASKS, help=argparse.SUPPRESS)
    p.add_argument("--spec", default="none", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=42, help=argparse.SUPPRESS)
    p.add_argument("--result", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not 0 < args.target <= 1:
        p.error(f"--target must be in (0, 1], got {args.target}")
    if args.child and not args.result:
        p.error("--child needs --result PATH")
    if not args.child and not args.plot_only and "none" not in args.specs:
        p.error("--specs must include 'none': every compressor is compared with it")

    def seeds_for(spec: str) -> List[int]:
        if args.ef_seeds and (spec == "none" or ":ef" in spec):
            return list(args.ef_seeds)
        return list(args.seeds)

    args.seeds_for = seeds_for
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.child:
        child(args)
        return 0
    if args.plot_only:
        rows: List[Dict[str, Any]] = []
        for path in args.inputs or [args.out]:
            meta, raw = rc.read_csv(path)  # the plot's footer names the last file's run
            rows.extend(_typed(raw))
        print(report(rows, args.target), flush=True)
        if args.plot:
            plot(rows, meta, args.target, args.plot)
        return 0
    return orchestrate(args)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
