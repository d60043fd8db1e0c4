"""Per-step times of one method on the digits task on the rack (issue 42 follow-up).

Same task/model/shards/batch as benchmarks/bench_algorithms.py's child, but it records
every step's time, split into (zero_grad + forward + backward) and opt.step(), for the
first --epochs epochs; rank 0 can cProfile its first K steps (--profile K).

    python docs/results/algorithms_digits_steps-2026-11-30.py --rates 100 1000 --epochs 4 \
        --variants fastps:none 'fastps:none@FASTPS_GC_FREEZE=0' ddp:none --out /tmp/steps.json

A variant is ``method[@VAR=value,...]``: the variables go into every process of the job.
A one-off measurement script for docs/results/algorithms.md (2026-11-30), not a benchmark.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks import bench_algorithms as ba  # noqa: E402
from benchmarks import compression_tasks as ct  # noqa: E402
from benchmarks import rack_common as rc  # noqa: E402
from benchmarks.cpu_account import machine_busy_seconds  # noqa: E402


def child(args: argparse.Namespace) -> None:
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    method = ba.parse_method(args.method)
    t0 = time.perf_counter()
    comm = ba.COMMS[method.system](method, args)
    t_init = time.perf_counter() - t0
    rank, size = comm.rank, comm.size
    torch.manual_seed(args.seed)
    task = ct.make_task("digits", 0)
    steps = len(task.x_train) // size // task.batch_size
    t0 = time.perf_counter()
    model, opt = comm.wrap(task.build_model(), task.lr * size, args.epochs * steps)
    t_wrap = time.perf_counter() - t0
    fb, st, ee = [], [], []
    prof = cProfile.Profile() if (rank == 0 and args.profile) else None
    sock0 = comm.socket_bytes() or 0
    stats0 = None
    for epoch in range(args.epochs):
        order = torch.randperm(len(task.x_train), generator=torch.Generator().manual_seed(epoch))
        shard = order[rank::size]
        for step in range(steps):
            idx = shard[step * task.batch_size : (step + 1) * task.batch_size]
            k = epoch * steps + step
            if prof is not None and k < args.profile:
                prof.enable()
            a = time.perf_counter()
            opt.zero_grad()
            loss = F.cross_entropy(model(task.x_train[idx]), task.y_train[idx])
            loss.backward()
            b = time.perf_counter()
            opt.step()
            c = time.perf_counter()
            if prof is not None and k < args.profile:
                prof.disable()
            fb.append(b - a)
            st.append(c - b)
            if method.system == "fastps" and k == steps and stats0 is None:
                from fastps.worker import api

                stats0 = dict(api.data_path_stats())
        a = time.perf_counter()
        comm.epoch_end()
        ee.append(time.perf_counter() - a)
    out = {
        "method": args.method,
        "rank": rank,
        "steps_per_epoch": steps,
        "init_s": t_init,
        "wrap_s": t_wrap,
        "fb": fb,
        "step": st,
        "epoch_end": ee,
        "socket_bytes": (comm.socket_bytes() or 0) - sock0,
    }
    if method.system == "fastps":
        from fastps.worker import api

        now = dict(api.data_path_stats())
        out["stats_end"] = {k: v for k, v in now.items() if isinstance(v, (int, float))}
        if stats0:
            out["stats_from_epoch2"] = {
                k: now[k] - stats0[k]
                for k in now
                if isinstance(now.get(k), (int, float)) and isinstance(stats0.get(k), (int, float))
            }
    if prof is not None:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(35)
        out["profile"] = s.getvalue()
    # every rank's times: sum them via the comm (rank 0 writes)
    times = [0.0] * (2 * size)
    times[rank] = sum(fb[:steps]) + sum(st[:steps]) + ee[0]
    times[size + rank] = statistics.median(st[steps:]) if len(st) > steps else 0.0
    tot = comm.sum(times)
    out["epoch1_s_per_rank"] = tot[:size]
    out["median_step_s_per_rank"] = tot[size:]
    rc.emit_result(out, rank)
    comm.shutdown()


def orchestrate(args: argparse.Namespace) -> None:
    from benchmarks.rack import Rack

    results = []
    port = args.base_port
    for rate in args.rates:
        with Rack(n_workers=4, n_cpu_hosts=0, rate_mbit=rate, prefix=args.prefix) as rack:
            link = rack.measure_throughput("w0", "w1", seconds=2.0)
            print(f"rack at {rate:g} Mbit/s, measured {link:.0f}", flush=True)
            for variant in args.variants:
                for rep in range(args.repeats):
                    name, _, envtext = variant.partition("@")
                    env = dict(kv.split("=", 1) for kv in envtext.split(",") if kv)
                    method = ba.parse_method(name)
                    argv = [sys.executable, __file__, "--child", "--method", name]
                    argv += ["--epochs", str(args.epochs), "--profile", str(args.profile)]
                    argv += ["--run-timeout", str(args.run_timeout)]
                    load = rc.load_text()
                    busy0, w0 = machine_busy_seconds(), time.monotonic()
                    port += 5
                    with tempfile.TemporaryDirectory(prefix="alg42-steps-") as tmp:
                        e = {"RACK_RESULT_DIR": tmp, **ba.QUIET_LOGS, **env}
                        if method.system == "fastps":
                            launch = rc.start_fastps(
                                rack,
                                4,
                                0,
                                argv,
                                port,
                                e,
                                timeout_s=args.run_timeout,
                                label=f"st{port}",
                            )
                        else:
                            launch = rc.start_gloo(rack, 4, argv, port, e, label=f"stp{port}")
                        ok, err = rc.wait_all(rack, launch, args.run_timeout)
                        res = rc.read_results(Path(tmp)).get(0)
                    wall = time.monotonic() - w0
                    busy = (machine_busy_seconds() - busy0) / (wall * (os.cpu_count() or 1))
                    if not ok or res is None:
                        print(f"  {variant} FAILED: {err[-800:]}", flush=True)
                        continue
                    res.update(variant=variant, rate=rate, load=load, cpu_busy=busy, rep=rep)
                    results.append(res)
                    n = res["steps_per_epoch"]
                    step, fbt = res["step"], res["fb"]
                    print(
                        f"  {rate:>5g} {variant:45s} epoch1 {max(res['epoch1_s_per_rank']):.3f} s"
                        f" | step1 {step[0] * 1e3:.0f} ms step2 {step[1] * 1e3:.0f} ms"
                        f" steps3-{n} med {statistics.median(step[2:n]) * 1e3:.1f} ms"
                        f" | later step med {statistics.median(step[n:]) * 1e3:.1f} ms"
                        f" fb med {statistics.median(fbt[n:]) * 1e3:.1f} ms"
                        f" epoch_end med {statistics.median(res['epoch_end']) * 1e3:.1f} ms"
                        f" | wrap {res['wrap_s']:.2f} s | busy {busy:.0%} load {load}",
                        flush=True,
                    )
                    Path(args.out).write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--child", action="store_true")
    p.add_argument("--method", default="fastps:none")
    p.add_argument("--variants", nargs="+", default=["fastps:none", "ddp:none"])
    p.add_argument("--rates", nargs="+", type=float, default=[100.0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--profile", type=int, default=0)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--run-timeout", type=float, default=180.0)
    p.add_argument("--freeze-frac", type=float, default=0.2)
    p.add_argument("--powersgd-frac", type=float, default=0.1)
    p.add_argument("--prefix", default="alg42s")
    p.add_argument("--base-port", type=int, default=35400)
    p.add_argument("--out", default="/tmp/steps.json")
    args = p.parse_args()
    if args.child:
        child(args)
    else:
        orchestrate(args)


if __name__ == "__main__":
    main()
