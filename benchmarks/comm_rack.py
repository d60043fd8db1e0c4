"""Communication benchmark on the emulated rack: time to synchronise a model's gradient set.

n worker hosts and k CPU hosts, every host link shaped to ``--rate`` Mbit/s (benchmarks/rack).
Each worker holds the float32 gradient tensors of a real model (ResNet-50: 161 tensors,
102 MB; VGG-16: 32 tensors, 553 MB; shapes in benchmarks/rack_common.py) and sums them over
all workers, as a training step's backward pass would (tensors handed over last layer
first, the first layer with the highest priority). Systems, measured in the same run on the
same rack:

- fastps: scheduler on w0, one server on every worker host and one on each CPU host
  (BytePS topology, num_servers = n + k), every tensor started by one
  ``grouped_push_pull_async`` (``--submit each``: one ``push_pull_async`` per tensor);
- Gloo: torch.distributed all_reduce over 25 MiB buckets (what DDP does); k has no meaning
  for it: it is measured once per n and shown at every k;
- MXNet: the dist_sync KVStore (ps-lite) with its scheduler and servers where fastps has
  them; push + pull of every key, no optimizer on the servers (they store the sum);
- Horovod 0.28.1 does not build against torch 2.13 (docs/design/peers.md), so it is not a peer.

Reported per row: seconds per synchronisation (median over iterations of the slowest
worker), goodput (model bytes / time, the metric of BytePS Fig. 12) and the fraction of the
optimum of docs/design/rationale.md, t = 2n(n-1)M / ((n^2 + kn - 2k) B), both with B measured
on the rack (``measure_throughput``, one TCP stream) and with B = 0.956 x rate. Every result is
checked: each worker fills its tensors with rank + 1, so every element must come back n(n+1)/2.

CPU: ``mb_per_cpu_s`` is model megabytes per second of the whole machine's CPU time,
``job_mb_per_cpu_s`` per second of the job's own processes plus the packet work
(benchmarks/cpu_account.py). ``wire_per_model`` is what every host sent over its link per
iteration, in model bytes (the switch's counters, warm-up included): 2(n-1) for a ring
all-reduce and for fastps at k = 0, more with CPU servers (BytePS's topology moves
(n + k) x the bound's time of link bytes: 6.7 / 7.2 / 8.0 at n = 4, k = 1 / 2 / 4). On an
emulated rack every host's packet work runs on the same cores, so CPU per model byte
compares topologies as well as implementations; CPU per wire byte
(``job_mb_per_cpu_s x wire_per_model``) compares the implementations.

    python -m benchmarks.comm_rack                                # ResNet-50, n=4, k=0,1,2,4
    python -m benchmarks.comm_rack --models resnet50 vgg16 --iters 3 --warmup 1
    python -m benchmarks.comm_rack --models vgg16 --scale 0.25    # a quarter of every tensor

Needs root (network namespaces). Writes docs/results/comm.csv (provenance in the
``#`` header lines).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

if __package__ in (None, ""):  # run as a file: make `benchmarks.*` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import rack_common as rc  # noqa: E402
from benchmarks.cpu_account import (  # noqa: E402
    BusyReader,
    JobAndMachineSampler,
    JobCpuSampler,
    MachineCpuSampler,
)
from benchmarks.rack import linkstat  # noqa: E402

SYSTEMS = ("fastps", "gloo", "mxnet")
FIELDS = [
    "model",
    "system",
    "n",
    "k",
    "rate_mbit",
    "link_goodput_mbit",
    "model_mb",
    "tensors",
    "iters",
    "time_s",
    "time_min_s",
    "goodput_gbit",
    "bound_s",
    "frac_bound",
    "bound_nominal_s",
    "frac_bound_nominal",
    "allreduce_bound_s",
    "cpu_s_per_iter",
    "mb_per_cpu_s",
    "job_cpu_s_per_iter",
    "job_mb_per_cpu_s",
    "wire_per_model",
    "status",
    "note",
]


# ============================================================================ children


def _child_common(args: argparse.Namespace) -> List[Tuple[str, int]]:
    return rc.gradient_sizes(args.model, args.scale)


def _summary(times: List[float], bad: int, extra: Dict[str, Any]) -> Dict[str, Any]:
    return {"times": times, "bad": bad, **extra}


def child_fastps(args: argparse.Namespace) -> None:
    import fastps
    import numpy as np

    sizes = _child_common(args)
    fastps.init()
    rank, n = fastps.rank(), fastps.size()
    want = n * (n + 1) / 2
    grads = [np.empty(count, dtype=np.float32) for _, count in sizes]
    times: List[float] = []
    spans: List[Tuple[float, float]] = []
    bad = 0
    for it in range(args.warmup + args.iters):
        for g in grads:
            g.fill(rank + 1)
        fastps.barrier()
        w0 = time.time()
        t0 = time.perf_counter()
        order = list(reversed(range(len(grads))))  # backward order: last layer first
        if args.submit == "group":
            handles = fastps.grouped_push_pull_async(
                [grads[i] for i in order],
                average=False,
                names=[sizes[i][0] for i in order],
                priorities=[-i for i in order],
                outs=[grads[i] for i in order],
            )
        else:
            handles = [
                fastps.push_pull_async(
                    grads[i], average=False, name=sizes[i][0], priority=-i, out=grads[i]
                )
                for i in order
            ]
        for h in handles:
            h.synchronize()
        dt = time.perf_counter() - t0
        spans.append((w0, w0 + dt))
        bad += sum(int(g[0] != want or g[-1] != want or g[len(g) // 2] != want) for g in grads)
        if it >= args.warmup:
            times.append(dt)
    rc.emit_result(_summary(times, bad, {"rank": rank, "n": n, "spans": spans}), rank)
    fastps.barrier()
    fastps.shutdown()


def _buckets(sizes: Sequence[Tuple[str, int]], bucket_bytes: int) -> List[List[int]]:
    """Tensor indices grouped in backward order into buckets of about bucket_bytes."""
    out: List[List[int]] = []
    cur: List[int] = []
    cur_bytes = 0
    for i in reversed(range(len(sizes))):
        cur.append(i)
        cur_bytes += sizes[i][1] * 4
        if bucket_bytes > 0 and cur_bytes >= bucket_bytes:
            out.append(cur)
            cur, cur_bytes = [], 0
        elif bucket_bytes <= 0:
            out.append(cur)
            cur, cur_bytes = [], 0
    if cur:
        out.append(cur)
    return out


def child_gloo(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    sizes = _child_common(args)
    rank, n = rc.init_gloo_from_env(args.op_timeout)
    want = n * (n + 1) / 2
    # Like DDP with gradient_as_bucket_view: each gradient is a view into a flat bucket.
    flats = [
        torch.empty(sum(sizes[i][1] for i in b), dtype=torch.float32)
        for b in _buckets(sizes, args.bucket_mb << 20)
    ]
    times: List[float] = []
    spans: List[Tuple[float, float]] = []
    bad = 0
    for it in range(args.warmup + args.iters):
        for f in flats:
            f.fill_(rank + 1)
        dist.barrier()
        w0 = time.time()
        t0 = time.perf_counter()
        works = [dist.all_reduce(f, async_op=True) for f in flats]
        for w in works:
            w.wait()
        dt = time.perf_counter() - t0
        spans.append((w0, w0 + dt))
        bad += sum(int(f[0].item() != want or f[-1].item() != want) for f in flats)
        if it >= args.warmup:
            times.append(dt)
    rc.emit_result(
        _summary(times, bad, {"rank": rank, "n": n, "buckets": len(flats), "spans": spans}), rank
    )
    dist.barrier()
    dist.destroy_process_group()


def child_mxnet(args: argparse.Namespace) -> None:
    import mxnet as mx

    sizes = _child_common(args)
    kv = mx.kv.create("dist_sync")
    rank, n = kv.rank, kv.num_workers
    want = n * (n + 1) / 2
    grads = [mx.nd.zeros((count,), dtype="float32") for _, count in sizes]
    for i, g in enumerate(grads):
        kv.init(i, g)
    mx.nd.waitall()
    times: List[float] = []
    bad = 0
    for it in range(args.warmup + args.iters):
        for g in grads:
            g[:] = rank + 1
        mx.nd.waitall()
        kv._barrier()
        t0 = time.perf_counter()
        for i in reversed(range(len(grads))):
            kv.push(i, grads[i], priority=-i)
            kv.pull(i, out=grads[i], priority=-i)
        mx.nd.waitall()
        dt = time.perf_counter() - t0
        for g in grads:
            m = len(g)
            vals = g[0].asscalar(), g[m - 1].asscalar(), g[m // 2].asscalar()
            bad += int(any(v != want for v in vals))
        if it >= args.warmup:
            times.append(dt)
    rc.emit_result(_summary(times, bad, {"rank": rank, "n": n}), rank)
    kv._barrier()


CHILDREN = {"fastps": child_fastps, "gloo": child_gloo, "mxnet": child_mxnet}


# ============================================================================ orchestrator


def _child_argv(python: str, system: str, args: argparse.Namespace, model: str) -> List[str]:
    return [
        python,
        "-m",
        "benchmarks.comm_rack",
        "--child",
        system,
        "--model",
        model,
        "--scale",
        str(args.scale),
        "--iters",
        str(args.iters),
        "--warmup",
        str(args.warmup),
        "--bucket-mb",
        str(args.bucket_mb),
        "--op-timeout",
        str(int(args.run_timeout)),
        "--submit",
        args.submit,
    ]


def _collect(out_dir: Path, n: int) -> Tuple[Optional[List[float]], str]:
    """Per-iteration time of the slowest worker, or why there is none."""
    res = rc.read_results(out_dir)
    if len(res) != n:
        return None, f"results from {sorted(res)} of {n} workers"
    bad = sum(int(r.get("bad", 0)) for r in res.values())
    if bad:
        return None, f"WRONG SUM in {bad} tensor checks"
    per_rank = [r["times"] for r in res.values()]
    iters = min(len(t) for t in per_rank)
    return [max(t[i] for t in per_rank) for i in range(iters)], ""


class Runner:
    def __init__(self, rack: Any, args: argparse.Namespace, link_mbit: float) -> None:
        self.rack = rack
        self.args = args
        self.link_mbit = link_mbit
        self.port = args.base_port
        self.rows: List[Dict[str, Any]] = []

    def next_port(self) -> int:
        self.port += 3
        return self.port

    def row(
        self,
        model: str,
        system: str,
        n: int,
        k: int,
        times: Optional[List[float]],
        status: str,
        note: str = "",
    ) -> Dict[str, Any]:
        sizes = rc.gradient_sizes(model, self.args.scale)
        model_bytes = 4 * sum(c for _, c in sizes)
        b_meas = self.link_mbit * 1e6 / 8
        b_nom = rc.GOODPUT_FACTOR * self.args.rate * 1e6 / 8
        bound = rc.fastps_bound_s(n, k, model_bytes, b_meas)
        bound_nom = rc.fastps_bound_s(n, k, model_bytes, b_nom)
        row: Dict[str, Any] = {
            "model": model,
            "system": system,
            "n": n,
            "k": k,
            "rate_mbit": self.args.rate,
            "link_goodput_mbit": self.link_mbit,
            "model_mb": model_bytes / 1e6,
            "tensors": len(sizes),
            "iters": len(times or []),
            "bound_s": bound,
            "bound_nominal_s": bound_nom,
            "allreduce_bound_s": rc.allreduce_bound_s(n, model_bytes, b_meas),
            "status": status,
            "note": note,
        }
        if times:
            t = statistics.median(times)
            row.update(
                time_s=t,
                time_min_s=min(times),
                goodput_gbit=model_bytes * 8 / t / 1e9,
                frac_bound=bound / t,
                frac_bound_nominal=bound_nom / t,
            )
        return row

    def sample_links(self, stack: contextlib.ExitStack, tag: str) -> Optional[Path]:
        """With --linkstats DIR: samples every host link while ``stack`` is open."""
        if not self.args.linkstats:
            return None
        out = self.args.linkstats / f"{tag}.csv"
        sampling = linkstat.sampling(self.rack.switch_ns, out, self.args.run_timeout)
        return stack.enter_context(sampling)

    def wire_bytes(self, before: Dict[str, Tuple[int, int]]) -> int:
        """Bytes every host sent over its link since ``before`` (its switch's counters):
        what the kernel moved for the job, warm-up included (a ring all-reduce sends
        2(n-1) model bytes per iteration; a PS with k CPU servers more, see wire_per_model)."""
        after = linkstat.namespace_counters(self.rack.switch_ns)
        return linkstat.egress_bytes(before, after, [h.name for h in self.rack.hosts])

    def run_one(self, system: str, model: str, n: int, k: int, python: str) -> Dict[str, Any]:
        args = self.args
        port = self.next_port()
        argv = _child_argv(python, system, args, model)
        t_start = time.monotonic()
        with contextlib.ExitStack() as stack:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix=f"comm-{system}-"))
            samples = self.sample_links(stack, f"{system}-{model}-n{n}-k{k}")
            # One sampler thread reads both counters where the job's cgroup is available
            # (cpu_account.JobAndMachineSampler: a third of two samplers' own CPU).
            job_cpu: Optional[JobAndMachineSampler] = None
            cpu: BusyReader
            if JobCpuSampler.available():
                job_cpu = stack.enter_context(
                    JobAndMachineSampler(f"{args.prefix}-{system}-{port}")
                )
                cpu = job_cpu.machine
            else:
                cpu = stack.enter_context(MachineCpuSampler())
            env = {"RACK_RESULT_DIR": tmp}
            wire_before = linkstat.namespace_counters(self.rack.switch_ns)
            if system == "fastps":
                # Defaults: each process reads its host's link rate (the htb class here)
                # and paces its flows (--fastps-env FASTPS_LINK_MBIT=0 turns that off).
                env.update(args.fastps_env)
                launch = rc.start_fastps(
                    self.rack, n, k, argv, port, env, timeout_s=args.run_timeout, label=f"fps{port}"
                )
            elif system == "gloo":
                launch = rc.start_gloo(self.rack, n, argv, port, env, label=f"gloo{port}")
            elif system == "mxnet":
                launch = rc.start_mxnet(self.rack, n, k, python, argv, port, env, label=f"mx{port}")
            else:
                raise ValueError(system)
            if job_cpu is not None:
                _charge(job_cpu, [p.pid for p in launch.procs])
            ok, err = rc.wait_all(self.rack, launch, args.run_timeout)
            wire = self.wire_bytes(wire_before)
            times, why = _collect(Path(tmp), n)
            cpu_s = _cpu_per_iter(cpu, Path(tmp), args.iters)
            job_cpu_s = _cpu_per_iter(job_cpu, Path(tmp), args.iters) if job_cpu else None
            if samples is not None:  # the workers' iteration spans beside the samples
                spans = {r: res.get("spans", []) for r, res in rc.read_results(Path(tmp)).items()}
                samples.with_suffix(".spans.json").write_text(json.dumps(spans))
        wall = time.monotonic() - t_start
        if times is None:
            status = "failed: " + (why if ok else _first_error(err) or why)
            print(f"  {system:8s} {model} n={n} k={k}: {status}", flush=True)
            if not ok:
                print("    " + "\n    ".join(err.splitlines()[-25:]), flush=True)
            return self.row(model, system, n, k, None, status)
        row = self.row(model, system, n, k, times, "ok", f"wall {wall:.0f} s")
        if cpu_s:
            row.update(cpu_s_per_iter=cpu_s, mb_per_cpu_s=row["model_mb"] / cpu_s)
        if job_cpu_s:
            row.update(job_cpu_s_per_iter=job_cpu_s, job_mb_per_cpu_s=row["model_mb"] / job_cpu_s)
        if wire:
            row["wire_per_model"] = wire / (args.warmup + args.iters) / (row["model_mb"] * 1e6)
        print(
            f"  {system:8s} {model} n={n} k={k}: {row['time_s']:.3f} s/iter, "
            f"{row['goodput_gbit']:.3f} Gbit/s, {100 * row['frac_bound']:.0f}% of bound "
            f"({row['bound_s']:.3f} s), {100 * row['frac_bound_nominal']:.0f}% of nominal "
            f"bound ({row['bound_nominal_s']:.3f} s), "
            f"{row.get('mb_per_cpu_s', float('nan')):.0f} MB per CPU-s, "
            f"{row.get('job_mb_per_cpu_s', float('nan')):.0f} per job CPU-s [{wall:.0f} s wall]",
            flush=True,
        )
        return row


def _charge(job_cpu: JobCpuSampler, pids: Sequence[int]) -> None:
    """Puts the job's processes, and any child they started already, in its cgroup (the
    children they start later are born there)."""
    todo = list(pids)
    while todo:
        pid = todo.pop()
        try:
            job_cpu.add(pid)
            for task in Path(f"/proc/{pid}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except OSError:  # it ended already
            continue


def _cpu_per_iter(cpu: BusyReader, out_dir: Path, iters: int) -> Optional[float]:
    """Machine CPU seconds per timed iteration: each timed iteration spans from the first
    worker's start to the last worker's end (workers report wall-clock spans)."""
    spans = [r.get("spans") for r in rc.read_results(out_dir).values()]
    if not spans or not all(spans) or iters < 1:
        return None
    timed = [s[-iters:] for s in spans]
    windows = [(min(s[i][0] for s in timed), max(s[i][1] for s in timed)) for i in range(iters)]
    busy = cpu.busy_in(windows)
    return busy / iters if busy else None


def _first_error(err: str) -> str:
    for line in err.splitlines():
        low = line.lower()
        if "error" in low or "exception" in low or "abort" in low:
            return line.strip()[:300]
    return ""


def _print_table(rows: Sequence[Dict[str, Any]]) -> None:
    print()
    print(
        f"{'model':9s} {'system':8s} {'n':>2s} {'k':>2s} {'s/iter':>8s} {'Gbit/s':>7s} "
        f"{'bound s':>8s} {'%bound':>7s} {'%nominal':>8s} {'MB/CPU-s':>8s} {'job':>5s} "
        f"{'wire':>5s}  status"
    )
    for r in rows:
        if "time_s" in r:
            print(
                f"{r['model']:9s} {r['system']:8s} {r['n']:2d} {r['k']:2d} "
                f"{r['time_s']:8.3f} {r['goodput_gbit']:7.3f} {r['bound_s']:8.3f} "
                f"{100 * r['frac_bound']:6.1f}% {100 * r['frac_bound_nominal']:7.1f}% "
                f"{r.get('mb_per_cpu_s', float('nan')):8.0f} "
                f"{r.get('job_mb_per_cpu_s', float('nan')):5.0f} "
                f"{r.get('wire_per_model', float('nan')):5.2f}  {r['status']} {r['note']}"
            )
        else:
            print(
                f"{r['model']:9s} {r['system']:8s} {r['n']:2d} {r['k']:2d} {'-':>8s} "
                f"{'-':>7s} {r['bound_s']:8.3f} {'-':>7s} {'-':>8s} {'-':>8s} {'-':>5s} {'-':>5s}  "
                f"{r['status']}"
            )


def orchestrate(args: argparse.Namespace) -> int:
    from benchmarks.rack import Rack, is_supported

    ok, why = is_supported()
    if not ok:
        print(f"comm_rack: emulated rack not supported here: {why}", file=sys.stderr)
        return 2
    meta = rc.provenance()
    systems = list(args.systems)
    pythons: Dict[str, str] = {s: sys.executable for s in systems}
    skipped: Dict[str, str] = {}
    if "mxnet" in systems:
        py, msg = rc.mxnet_python()
        if py is None:
            skipped["mxnet"] = msg
            print(f"comm_rack: skipping MXNet: {msg}", flush=True)
        else:
            pythons["mxnet"] = py
            print(f"comm_rack: MXNet peer: {py} ({msg})", flush=True)
    n_max = max(args.workers)
    k_max = max(args.cpu_hosts)
    rows: List[Dict[str, Any]] = []
    t0 = time.monotonic()
    with Rack(n_workers=n_max, n_cpu_hosts=k_max, rate_mbit=args.rate, prefix=args.prefix) as rack:
        link = rack.measure_throughput("w0", "w1", seconds=args.measure_seconds)
        for host, mbit in args.host_rate.items():
            rack.set_rate(host, mbit)
            print(f"comm_rack: {host}'s link reshaped to {mbit:g} Mbit/s", flush=True)
        print(
            f"comm_rack: rack n={n_max} k={k_max} at {args.rate} Mbit/s; measured link "
            f"goodput {link:.1f} Mbit/s ({link / args.rate:.3f} of rate)",
            flush=True,
        )
        meta = {
            **meta,
            "rack": f"{n_max} worker hosts + {k_max} CPU hosts, "
            f"{args.rate} Mbit/s per host, measured goodput {link:.1f} Mbit/s",
        }
        if args.host_rate:
            meta["host_rates"] = ",".join(f"{h}={m:g}" for h, m in args.host_rate.items())
        runner = Runner(rack, args, link)
        for model in args.models:
            for n in args.workers:
                once: Dict[str, Dict[str, Any]] = {}
                for k in args.cpu_hosts:
                    for system in systems:
                        if system in skipped:
                            rows.append(
                                runner.row(model, system, n, k, None, "skipped: " + skipped[system])
                            )
                            continue
                        if system == "gloo":  # k has no meaning for all-reduce: once per n
                            if system not in once:
                                once[system] = runner.run_one(system, model, n, 0, pythons[system])
                            base = once[system]
                            times = None
                            if "time_s" in base:
                                times = [base["time_s"]] * max(1, base["iters"])
                            r = runner.row(
                                model,
                                system,
                                n,
                                k,
                                times,
                                base["status"],
                                "measured once per n (k unused)",
                            )
                            if "time_s" in base:
                                r.update(time_min_s=base["time_min_s"], iters=base["iters"])
                                for col in (
                                    "cpu_s_per_iter",
                                    "mb_per_cpu_s",
                                    "job_cpu_s_per_iter",
                                    "job_mb_per_cpu_s",
                                    "wire_per_model",
                                ):
                                    if col in base:
                                        r[col] = base[col]
                            rows.append(r)
                            continue
                        rows.append(runner.run_one(system, model, n, k, pythons[system]))
                        rc.write_csv(args.out, rows, FIELDS, meta)
    meta["duration"] = f"{time.monotonic() - t0:.0f} s"
    meta["load_at_end"] = rc.load_text()
    rc.write_csv(args.out, rows, FIELDS, meta)
    _print_table(rows)
    print(f"\ncomm_rack: wrote {args.out} ({time.monotonic() - t0:.0f} s)")
    failed = [r for r in rows if r["status"].startswith("failed") and r["system"] == "fastps"]
    return 1 if failed else 0


def _env_pairs(items: Sequence[str]) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.startswith("FASTPS_"):
            raise argparse.ArgumentTypeError(f"--fastps-env wants FASTPS_NAME=value, got {item}")
        out[key] = value
    return out


def _host_rates(p: argparse.ArgumentParser, items: Sequence[str]) -> Dict[str, float]:
    out: Dict[str, float] = {}
    for item in items:
        host, sep, value = item.partition("=")
        try:
            mbit = float(value)
        except ValueError:
            mbit = -1.0
        if not sep or not host or not mbit > 0:
            p.error(f"--host-rate wants HOST=Mbit/s with a rate > 0, got {item!r}")
        out[host] = mbit
    return out


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--models", nargs="+", default=["resnet50"], choices=sorted(rc.MODELS))
    p.add_argument("--workers", "-n", nargs="+", type=int, default=[4])
    p.add_argument("--cpu-hosts", "-k", nargs="+", type=int, default=[0, 1, 2, 4])
    p.add_argument("--rate", type=float, default=1000.0, help="Mbit/s per host link")
    p.add_argument("--systems", nargs="+", default=["fastps", "gloo", "mxnet"], choices=SYSTEMS)
    p.add_argument("--iters", type=int, default=3, help="timed iterations per run")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="fraction of every gradient tensor to move (0 < scale <= 1)",
    )
    p.add_argument(
        "--bucket-mb",
        type=int,
        default=25,
        help="Gloo all_reduce bucket size in MiB, as DDP (0: one call per tensor)",
    )
    p.add_argument(
        "--submit",
        choices=["group", "each"],
        default="group",
        help="fastps: start all tensors in one grouped_push_pull_async (group) or "
        "one push_pull_async per tensor (each)",
    )
    p.add_argument(
        "--fastps-env",
        nargs="*",
        default=[],
        help="extra FASTPS_NAME=value settings for every fastps process",
    )
    p.add_argument(
        "--run-timeout", type=float, default=300.0, help="hard bound in seconds on one system's run"
    )
    p.add_argument(
        "--host-rate",
        nargs="*",
        default=[],
        metavar="HOST=MBIT",
        help="hosts whose link differs from --rate, e.g. w3=500: a straggler's link "
        "(fastps reads its host's rate; add --fastps-env FASTPS_HOST_BANDWIDTHS=w3=500 "
        "to tell the placement)",
    )
    p.add_argument("--measure-seconds", type=float, default=3.0)
    p.add_argument("--prefix", default="fpsr")
    p.add_argument("--base-port", type=int, default=29400)
    p.add_argument("--out", type=Path, default=rc.RESULTS_DIR / "comm.csv")
    p.add_argument(
        "--linkstats",
        type=Path,
        default=None,
        metavar="DIR",
        help="sample every host link every 5 ms during each run into DIR "
        "(benchmarks/rack/linkstat.py) with the workers' iteration spans",
    )
    # child mode (started by the orchestrator inside a host namespace)
    p.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    p.add_argument("--model", default="resnet50", help=argparse.SUPPRESS)
    p.add_argument("--op-timeout", type=int, default=300, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not 1 <= args.iters <= 100 or not 0 <= args.warmup <= 10:
        p.error("--iters must be 1..100 and --warmup 0..10")
    if not 0 < args.scale <= 1:
        p.error("--scale must be in (0, 1]")
    if min(args.workers) < 2 or min(args.cpu_hosts) < 0:
        p.error("need --workers >= 2 and --cpu-hosts >= 0")
    args.fastps_env = _env_pairs(args.fastps_env)
    args.host_rate = _host_rates(p, args.host_rate)
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.child:
        CHILDREN[args.child](args)
        return 0
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
