"""Sufficient-factor broadcasting on the emulated rack: fully-connected layers at batch 32.

n = 4 worker hosts at ``--rate`` Mbit/s (benchmarks/rack), a fastps server on every worker
host (k = 0). Two models of fully-connected layers only, float32, batch 32 per worker:

- ``vgg16fc``: VGG-16's classifier, 25088-4096-4096-1000 (123.6 M weights, 494 MB of
  gradients), on random 25088-feature inputs (what the convolutions would hand it);
- ``ffn``: two transformer feed-forward blocks, 1024-4096-1024 each (16.8 M weights) on
  ``--seq`` positions per sample: K = batch x seq factor rows per layer.

Systems, in the same run on the same rack: fastps.torch with ``FASTPS_SFB=off`` (every
gradient through the servers), ``auto`` (the cost model chooses per layer, fastps.sfb) and,
with ``--force-on``, ``on``; and PyTorch DDP over Gloo (25 MiB buckets).

Per system: seconds per step (slowest worker, median), the seconds ``synchronize()`` waited
after backward (for SFB this includes rebuilding the gradients from the factors), and the
bytes each worker host's link carried per step (eth0 rx + tx inside the host's namespace,
its co-located server included). Every worker checks that all end with the same weights.

    python -m benchmarks.sfb_rack                       # both models, 1 Gbit/s
    python -m benchmarks.sfb_rack --models vgg16fc --steps 3 --warmup 1

Needs root. Writes docs/results/sfb.csv.
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

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import rack_common as rc  # noqa: E402

FIELDS = [
    "model",
    "system",
    "n",
    "rate_mbit",
    "link_goodput_mbit",
    "batch",
    "rows_per_layer",
    "steps",
    "step_s",
    "sync_wait_s",
    "rebuild_s",
    "host_mb_per_step",
    "params_m",
    "grad_mb",
    "sfb_layers",
    "status",
    "note",
]

SYSTEMS = {
    "fastps SFB off": ("fastps", "off"),
    "fastps SFB auto": ("fastps", "auto"),
    "fastps SFB on": ("fastps", "on"),
    "DDP-Gloo": ("ddp", ""),
}


def build_model(name: str, seq: int) -> Tuple[Any, Tuple[int, ...]]:
    """The model and the shape of one worker's input batch (without the batch size)."""
    import torch

    nn = torch.nn
    if name == "vgg16fc":
        model = nn.Sequential(
            nn.Linear(25088, 4096),
            nn.ReLU(),
            nn.Linear(4096, 4096),
            nn.ReLU(),
            nn.Linear(4096, 1000),
        )
        return model, (25088,)
    if name == "ffn":
        blocks = []
        for _ in range(2):
            blocks += [nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)]
        return nn.Sequential(*blocks), (seq, 1024)
    raise ValueError(f"unknown model {name!r}")


def _eth0_bytes() -> int:
    """rx + tx bytes of this namespace's eth0 (0 outside a rack host)."""
    with open("/proc/net/dev") as f:
        for line in f.readlines()[2:]:
            dev, _, rest = line.partition(":")
            if dev.strip() == "eth0":
                fields = rest.split()
                return int(fields[0]) + int(fields[8])
    return 0


# ============================================================================ children


def _setup(args: argparse.Namespace, rank: int) -> Tuple[Any, Any, Any, Any]:
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(1234)  # the same initial weights on every worker
    model, shape = build_model(args.model, args.seq)
    gen = torch.Generator().manual_seed(100 + rank)  # different data per worker
    x = torch.randn(args.batch, *shape, generator=gen)
    target = torch.randn(args.batch, *shape[:-1], model[-1].out_features, generator=gen)
    return torch, model, x, target


def _loop(args: argparse.Namespace, step: Any, barrier: Any) -> Dict[str, Any]:
    for _ in range(args.warmup):
        step()
    barrier()
    times: List[float] = []
    waits: List[float] = []
    b0 = _eth0_bytes()
    for _ in range(args.steps):
        t0 = time.perf_counter()
        waits.append(step())
        times.append(time.perf_counter() - t0)
    moved = _eth0_bytes() - b0
    return {"step_times": times, "waits": waits, "bytes_per_step": moved / args.steps}


def _checksum(model: Any) -> float:
    return float(sum(float(p.detach().double().sum()) for p in model.parameters()))


def child_fastps(args: argparse.Namespace) -> None:
    import fastps.torch as hvd

    hvd.init()
    rank = hvd.rank()
    torch, model, x, target = _setup(args, rank)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=1e-4),
        named_parameters=model.named_parameters(),
        model=model,
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    sfb = opt._fastps.sfb
    rebuilds: List[float] = []

    def step() -> float:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), target).backward()
        t0 = time.perf_counter()
        before = sfb.rebuild_s if sfb is not None else 0.0
        opt.synchronize()
        waited = time.perf_counter() - t0
        rebuilds.append((sfb.rebuild_s if sfb is not None else 0.0) - before)
        with opt.skip_synchronize():
            opt.step()
        return waited

    out = _loop(args, step, hvd.barrier)
    out["rebuilds"] = rebuilds[-args.steps :]
    out["sfb_layers"] = len(sfb.chosen_names()) if sfb is not None else 0
    out["checksum"] = _checksum(model)
    rc.emit_result(out, rank)
    hvd.barrier()
    hvd.shutdown()


def child_ddp(args: argparse.Namespace) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, n = rc.init_gloo_from_env(args.op_timeout)
    torch, model, x, target = _setup(args, rank)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-4)

    def step() -> float:
        opt.zero_grad()
        # DDP overlaps its allreduce with backward: nothing is left to wait for after it.
        torch.nn.functional.mse_loss(ddp(x), target).backward()
        opt.step()
        return 0.0

    out = _loop(args, step, dist.barrier)
    out["checksum"] = _checksum(model)
    out["sfb_layers"] = 0
    rc.emit_result(out, rank)
    dist.barrier()
    dist.destroy_process_group()


# ============================================================================ orchestrator


def _argv(args: argparse.Namespace, child: str, model: str) -> List[str]:
    return [
        sys.executable,
        "-m",
        "benchmarks.sfb_rack",
        "--child",
        child,
        "--model",
        model,
        "--batch",
        str(args.batch),
        "--seq",
        str(args.seq),
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        "--op-timeout",
        str(int(args.run_timeout)),
    ]


def _row(
    args: argparse.Namespace, model: str, system: str, link: float, res: Dict[int, Any]
) -> Dict[str, Any]:
    mdl, _ = build_model(model, args.seq)
    count = sum(p.numel() for p in mdl.parameters())
    row: Dict[str, Any] = {
        "model": model,
        "system": system,
        "n": args.workers,
        "rate_mbit": args.rate,
        "link_goodput_mbit": link,
        "batch": args.batch,
        "rows_per_layer": args.batch * (args.seq if model == "ffn" else 1),
        "steps": args.steps,
        "params_m": count / 1e6,
        "grad_mb": count * 4 / 1e6,
    }
    if len(res) != args.workers:
        row["status"] = f"failed: results from {len(res)} of {args.workers} workers"
        return row
    sums = [r["checksum"] for r in res.values()]
    if max(sums) - min(sums) > 1e-6 * max(1.0, abs(sums[0])):
        row["status"] = f"failed: workers' weights differ (checksums {sums})"
        return row
    per_step = [max(r["step_times"][i] for r in res.values()) for i in range(args.steps)]
    waits = [max(r["waits"][i] for r in res.values()) for i in range(args.steps)]
    row["step_s"] = statistics.median(per_step)
    row["sync_wait_s"] = statistics.median(waits)
    if all("rebuilds" in r for r in res.values()):
        row["rebuild_s"] = statistics.median(
            max(r["rebuilds"][i] for r in res.values()) for i in range(args.steps)
        )
    row["host_mb_per_step"] = statistics.mean(r["bytes_per_step"] for r in res.values()) / 1e6
    row["sfb_layers"] = res[0].get("sfb_layers", 0)
    row["status"] = "ok"
    return row


def orchestrate(args: argparse.Namespace) -> int:
    from benchmarks.rack import Rack, is_supported

    ok, why = is_supported()
    if not ok:
        print(f"sfb_rack: emulated rack not supported here: {why}", file=sys.stderr)
        return 2
    meta = rc.provenance()
    meta["compute"] = (
        f"{os.cpu_count()} CPU cores shared by all {args.workers} workers and their servers "
        "(one math thread each)"
    )
    rows: List[Dict[str, Any]] = []
    systems = [s for s in SYSTEMS if s != "fastps SFB on" or args.force_on]
    if args.systems:
        systems = [s for s in systems if s in args.systems]
    port = args.base_port
    t0 = time.monotonic()
    with Rack(
        n_workers=args.workers, n_cpu_hosts=0, rate_mbit=args.rate, prefix=args.prefix
    ) as rack:
        link = rack.measure_throughput("w0", "w1", seconds=2.0)
        meta[f"rack_{args.rate:g}"] = f"measured goodput {link:.1f} Mbit/s"
        print(f"sfb_rack: n={args.workers} at {args.rate:g} Mbit/s, goodput {link:.1f}", flush=True)
        for model in args.models:
            for system in systems:
                child, how = SYSTEMS[system]
                port += 3
                started = time.monotonic()
                with tempfile.TemporaryDirectory(prefix="sfb-") as tmp:
                    env = {"RACK_RESULT_DIR": tmp}
                    if child == "fastps":
                        launch = rc.start_fastps(
                            rack,
                            args.workers,
                            0,
                            _argv(args, child, model),
                            port,
                            {**env, "FASTPS_SFB": how},
                            timeout_s=args.run_timeout,
                            label=f"sfb{port}",
                        )
                    else:
                        launch = rc.start_gloo(
                            rack,
                            args.workers,
                            _argv(args, child, model),
                            port,
                            env,
                            label=f"ddp{port}",
                        )
                    done, err = rc.wait_all(rack, launch, args.run_timeout)
                    res = rc.read_results(Path(tmp))
                row = _row(args, model, system, link, res)
                row["note"] = f"wall {time.monotonic() - started:.0f} s"
                if not done:
                    row["status"] = row.get("status", "") + " " + err.splitlines()[-1][:200]
                    print("    " + "\n    ".join(err.splitlines()[-15:]), flush=True)
                if child == "fastps":
                    decisions = [
                        line.split("] ", 1)[-1]
                        for line in rack.logs().get("w0", "").splitlines()
                        if f"sfb{port}-w0" in line and "fastps SFB" in line
                    ]
                    for line in decisions:
                        print(f"    {line}", flush=True)
                print(
                    f"  {model:8s} {system:16s} step {row.get('step_s', float('nan')):.3f} s  "
                    f"sync wait {row.get('sync_wait_s', float('nan')):.3f} s  "
                    f"(rebuild {row.get('rebuild_s', float('nan')):.3f} s)  "
                    f"{row.get('host_mb_per_step', float('nan')):.1f} MB/host/step  "
                    f"sfb layers {row.get('sfb_layers', '-')}  {row['status']}",
                    flush=True,
                )
                rows.append(row)
                rc.write_csv(args.out, rows, FIELDS, meta)
    meta["duration"] = f"{time.monotonic() - t0:.0f} s"
    meta["load_at_end"] = rc.load_text()
    rc.write_csv(args.out, rows, FIELDS, meta)
    return 0 if all(r["status"] == "ok" for r in rows) else 1


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["vgg16fc", "ffn"], choices=["vgg16fc", "ffn"])
    p.add_argument("--workers", "-n", type=int, default=4)
    p.add_argument("--rate", type=float, default=1000.0, help="Mbit/s per host link")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=128, help="positions per sample (ffn)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--force-on", action="store_true", help="also run FASTPS_SFB=on")
    p.add_argument("--systems", nargs="+", choices=sorted(SYSTEMS), help="only these systems")
    p.add_argument("--run-timeout", type=float, default=900.0)
    p.add_argument("--base-port", type=int, default=29300)
    p.add_argument("--prefix", default="fpsfb")
    p.add_argument("--out", type=Path, default=rc.REPO / "docs" / "results" / "sfb.csv")
    p.add_argument("--child", choices=["fastps", "ddp"], help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--op-timeout", type=float, default=900.0, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.child == "fastps":
        child_fastps(args)
        return 0
    if args.child == "ddp":
        child_ddp(args)
        return 0
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
