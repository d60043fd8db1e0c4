"""The simulator against the emulated rack's stored measurements (docs/results/*.csv).

Every row is one measured scenario (n = 4 worker hosts, k CPU hosts, 1 Gbit/s, ResNet-50)
replayed in the simulator with the measurement's own link goodput. The only fitted number
is ``layer_overhead_s`` for the training rows, fitted on one row (fastps cross-barrier,
k = 0) and then held fixed for the others; the communication rows use no fitted number.

The part-size and straggler rows (docs/results/sim-validation-quiet/) are the median of
repeated runs (the CSVs of every run are stored; the row shows the median, the range and
the loads), simulated with the median of those runs' measured link goodput.

This harness reads the source tree (the CSVs under docs/), so it lives beside the
benchmarks that wrote them, not in the package; the constants it checks stay in the package
as code (``fastps.sim.cluster``: RACK_GOODPUT, RACK_LATENCY_S; ``fastps.sim.pushpull``: the
kernel speed: KERNEL_GBPS), which is all ``python -m fastps.plan`` needs. Run it from the
checkout's root:

    python -m benchmarks.sim_calibration           # the table (docs/results/simulator.md)
    python -m benchmarks.sim_calibration --quick   # the rows CI checks
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from fastps.errors import FastPSError
from fastps.sim import workload
from fastps.sim.allreduce import train_allreduce
from fastps.sim.bound import ring_allreduce
from fastps.sim.cluster import Cluster, layout
from fastps.sim.pushpull import CommOptions
from fastps.sim.training import TrainOptions, communicate, train

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "results"
REPEATED = RESULTS / "sim-validation-quiet"


@dataclass
class Row:
    source: str  # csv file name
    scenario: str
    measured_s: float
    predict: Callable[[], float]
    load: str = ""
    in_ci: bool = False
    predicted_s: Optional[float] = None
    runs: List[float] = field(default_factory=list)  # every run of a repeated row

    @property
    def error(self) -> float:
        assert self.predicted_s is not None
        return self.predicted_s / self.measured_s - 1.0


def read_rows(path: Path) -> List[Dict[str, str]]:
    if not path.exists():
        raise FastPSError(f"stored measurement {path} is missing (the source tree has it)")
    lines = [ln for ln in path.read_text().splitlines() if not ln.startswith("#")]
    return list(csv.DictReader(lines))


def header_field(path: Path, name: str) -> str:
    for ln in path.read_text().splitlines():
        if ln.startswith(f"# {name}:"):
            return ln.split(":", 1)[1].strip()
    return ""


def _comm_time(cl: Cluster, w: workload.Workload, comm: CommOptions, opts: TrainOptions) -> float:
    return communicate(cl, w, comm, opts).iteration_s


def _ring_time(cl: Cluster, w: workload.Workload) -> float:
    return ring_allreduce(layout(cl), w.nbytes)


def _ddp_time(cl: Cluster, w: workload.Workload, overhead: float) -> float:
    return train_allreduce(cl, w, layer_overhead_s=overhead).iteration_s


def _train_time(cl: Cluster, w: workload.Workload, opts: TrainOptions) -> float:
    return train(cl, w, None, opts).iteration_s


def _comm_rows(path: Path, in_ci: Sequence[int], partition: int) -> List[Row]:
    rows = []
    w = workload.load("resnet50")
    load = header_field(path, "load_at_start")
    for r in read_rows(path):
        if r["status"] != "ok" or r["model"] != "resnet50":
            continue
        n, k = int(r["n"]), int(r["k"])
        goodput = float(r["link_goodput_mbit"]) / float(r["rate_mbit"])
        cl = Cluster(workers=n, cpu_machines=k, link_mbit=float(r["rate_mbit"]), goodput=goodput)
        if r["system"] == "fastps":
            opts = TrainOptions(iterations=2, warmup=0)
            comm = CommOptions(partition_bytes=partition)
            pred = partial(_comm_time, cl, w, comm, opts)
            name = f"push_pull n={n} k={k} parts {partition >> 10} KiB"
        elif r["system"] == "gloo" and k == 0:
            pred = partial(_ring_time, cl, w)
            name = f"Gloo all_reduce n={n}"
        else:
            continue
        rows.append(
            Row(
                path.name,
                name,
                float(r["time_s"]),
                pred,
                load,
                in_ci=(r["system"] == "fastps" and k in in_ci),
            )
        )
    return rows


def _parse_rates(text: str) -> Dict[str, float]:
    out: Dict[str, float] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        host, _, mbit = item.partition("=")
        out[host] = float(mbit)
    return out


def repeated_rows(files: Sequence[Path], partition: int, label: str = "") -> List[Row]:
    """One row per (n, k) over the repeated runs in ``files`` (comm_rack CSVs of the same
    command): the median time, simulated with the median measured goodput."""
    if not files:
        raise FastPSError(f"no stored runs for {label or partition} in {REPEATED}")
    times: Dict[Tuple[int, int], List[float]] = {}
    goodputs: List[float] = []
    loads: List[str] = []
    rate, hosts = 1000.0, ""
    for path in files:
        loads.append(header_field(path, "load_at_start").split(" ")[0])
        hosts = header_field(path, "host_rates")
        for r in read_rows(path):
            if r["status"] != "ok" or r["system"] != "fastps" or r["model"] != "resnet50":
                continue
            times.setdefault((int(r["n"]), int(r["k"])), []).append(float(r["time_s"]))
            goodputs.append(float(r["link_goodput_mbit"]))
            rate = float(r["rate_mbit"])
    goodput = statistics.median(goodputs) / rate
    host_mbit = _parse_rates(hosts)
    w = workload.load("resnet50")
    rows = []
    for (n, k), ts in sorted(times.items()):
        cl = Cluster(
            workers=n, cpu_machines=k, link_mbit=rate, goodput=goodput, host_mbit=host_mbit
        )
        opts = TrainOptions(iterations=2, warmup=0)
        pred = partial(_comm_time, cl, w, CommOptions(partition_bytes=partition), opts)
        name = f"push_pull n={n} k={k} parts {partition >> 10} KiB" + (
            f", {label}" if label else ""
        )
        src = files[0].name.rsplit("-r", 1)[0] + f"-r*.csv ({len(files)})"
        load = f"{min(loads, key=float)}-{max(loads, key=float)}"
        rows.append(Row(src, name, statistics.median(ts), pred, load, runs=ts))
    return rows


def fit_layer_overhead(
    cl: Cluster, w: workload.Workload, measured_s: float, mode: str = "cross-barrier"
) -> float:
    """The per-layer host time that makes the simulated iteration match ``measured_s``
    (bisection; the iteration time grows with it)."""

    def run(x: float) -> float:
        return train(
            cl, w, None, TrainOptions(mode=mode, iterations=4, warmup=1, layer_overhead_s=x)
        ).iteration_s

    lo, hi = 0.0, 5e-3
    if run(lo) >= measured_s:
        return 0.0
    for _ in range(12):
        mid = (lo + hi) / 2
        if run(mid) < measured_s:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _emulated_rows(path: Path) -> List[Row]:
    rows_in = read_rows(path)
    alone = next(r for r in rows_in if r["system"] == "compute alone")
    c = float(alone["compute_s"])
    w = workload.load(alone["model"]).with_compute(c)
    goodput = float(alone["goodput_mbit"]) / float(alone["rate_mbit"])
    fit_row = next(r for r in rows_in if r["system"] == "fastps cross-barrier" and r["k"] == "0")
    base = Cluster(workers=int(fit_row["n"]), cpu_machines=0, link_mbit=1000.0, goodput=goodput)
    overhead = fit_layer_overhead(base, w, float(fit_row["iter_s"]))
    out = []
    for r in rows_in:
        system = r["system"]
        if system == "compute alone" or r["status"] != "ok":
            continue
        k = int(r["k"] or 0)
        cl = Cluster(
            workers=int(r["n"]), cpu_machines=k, link_mbit=float(r["rate_mbit"]), goodput=goodput
        )
        if system == "DDP-Gloo":
            pred = partial(_ddp_time, cl, w, overhead)
        else:
            mode = "cross-barrier" if "cross-barrier" in system else "sync"
            prio = "priority off" not in system
            opts = TrainOptions(
                mode=mode, priorities=prio, iterations=4, warmup=1, layer_overhead_s=overhead
            )
            pred = partial(_train_time, cl, w, opts)

        fitted = system == "fastps cross-barrier" and k == 0
        label = f"{r['model']} {system} k={k}" + (" (fitted)" if fitted else "")
        out.append(Row(path.name, label, float(r["iter_s"]), pred, r["load"]))
    out.append(
        Row(path.name, f"fitted layer_overhead_s = {overhead * 1e3:.3f} ms", 1.0, lambda: 1.0)
    )
    return out


def scenarios(quick: bool = False) -> List[Row]:
    rows = _comm_rows(RESULTS / "comm.csv", in_ci=(0, 4), partition=256 << 10)
    if quick:
        return [r for r in rows if r.in_ci]
    rows += _emulated_rows(RESULTS / "emulated.csv")
    for pb in (65536, 262144, 1048576):
        rows += repeated_rows(sorted(REPEATED.glob(f"parts-{pb}-r*.csv")), pb)
    rows += repeated_rows(
        sorted(REPEATED.glob("straggler-w3-500-r*.csv")), 256 << 10, "w3's link 500 Mbit/s"
    )
    return rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="only the rows CI checks")
    args = p.parse_args(argv)
    rows = scenarios(args.quick)
    print("| source | scenario | measured s | runs (min-max) | simulated s | error | load |")
    print("|---|---|---:|---|---:|---:|---|")
    worst = 0.0
    for row in rows:
        row.predicted_s = row.predict()
        if row.scenario.startswith("fitted"):
            print(f"| {row.source} | {row.scenario} | | | | | |")
            continue
        worst = max(worst, abs(row.error))
        spread = f"{len(row.runs)}: {min(row.runs):.3f}-{max(row.runs):.3f}" if row.runs else "1"
        print(
            f"| {row.source} | {row.scenario} | {row.measured_s:.3f} | {spread} | "
            f"{row.predicted_s:.3f} | {100 * row.error:+.1f}% | {row.load} |",
            flush=True,
        )
    print(f"\nlargest error {100 * worst:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
