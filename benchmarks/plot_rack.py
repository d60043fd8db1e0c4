"""Plots of the rack benchmarks: docs/results/comm.png and train.png.

- comm.png: communication goodput (model bytes / synchronisation time) against the number
  of CPU machines k, one line per system (fastps, Gloo, MXNet KVStore), with the optimum
  of docs/design/rationale.md (BytePS Eq. 6 at the measured link goodput) drawn as a dashed
  line; one panel per model in comm.csv.
- train.png: training samples/s against the per-host bandwidth, one line per system, with
  the linear-scaling ceiling (4 x one worker alone) and the CPU ceiling (4 workers at once,
  no synchronisation) as horizontal lines; one panel per model in train.csv.

    python -m benchmarks.plot_rack [--comm docs/results/comm.csv]
                                   [--train docs/results/train.csv]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import rack_common as rc  # noqa: E402

COLORS = {
    "fastps": "tab:blue",
    "gloo": "tab:orange",
    "mxnet": "tab:green",
    "DDP-Gloo": "tab:orange",
    "fastps k=0": "tab:blue",
    "fastps k=2": "tab:purple",
}
LABELS = {
    "fastps": "fastps",
    "gloo": "Gloo all_reduce (torch.distributed)",
    "mxnet": "MXNet KVStore dist_sync",
}


def _footer(meta: Dict[str, str]) -> str:
    return f"commit {meta.get('commit', '?')}, {meta.get('date', '?')}; {meta.get('machine', '')}"


def plot_comm(csv_path: Path, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    meta, rows = rc.read_csv(csv_path)
    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(6.2 * len(models), 4.6), squeeze=False)
    for ax, model in zip(axes[0], models):
        mrows = [r for r in rows if r["model"] == model]
        n = int(mrows[0]["n"])
        mb = float(mrows[0]["model_mb"])
        bound: Dict[int, float] = {}
        for r in mrows:
            b = rc.csv_number(r["bound_s"])
            if b:
                bound[int(r["k"])] = mb * 8e6 / b / 1e9
        ks = sorted(bound)
        ax.plot(
            ks,
            [bound[k] for k in ks],
            "k--",
            lw=1.5,
            label="optimum 2n(n-1)M/((n²+kn-2k)B), B measured",
        )
        for system in dict.fromkeys(r["system"] for r in mrows):
            pts = sorted(
                (int(r["k"]), rc.csv_number(r["goodput_gbit"]))
                for r in mrows
                if r["system"] == system and r["status"] == "ok"
            )
            pts_ok: List[Tuple[int, float]] = [(k, g) for k, g in pts if g is not None]
            if not pts_ok:
                continue
            style = ":" if system == "gloo" else "-"
            ax.plot(
                [p[0] for p in pts_ok],
                [p[1] for p in pts_ok],
                style,
                marker="o",
                color=COLORS.get(system),
                label=LABELS.get(system, system),
            )
        ax.set_xlabel("CPU machines k")
        ax.set_ylabel("goodput, Gbit/s (model bytes / sync time)")
        ax.set_xticks(ks)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        rate = mrows[0]["rate_mbit"]
        ax.set_title(f"{model} ({mb:.0f} MB), n={n} workers, {float(rate):g} Mbit/s per host")
        ax.legend(fontsize=8, loc="best")
    fig.text(0.01, 0.01, _footer(meta), fontsize=7, color="gray")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_train(csv_path: Path, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    meta, rows = rc.read_csv(csv_path)
    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(6.2 * len(models), 4.6), squeeze=False)
    for ax, model in zip(axes[0], models):
        mrows = [r for r in rows if r["model"] == model]
        rates = sorted(
            {float(r["rate_mbit"]) / 1000 for r in mrows if rc.csv_number(r["rate_mbit"])}
        )
        for r in mrows:
            if r["status"] != "ok" or rc.csv_number(r["rate_mbit"]):
                continue
            y = float(r["samples_per_s"])
            if r["system"].startswith("linear"):
                ax.axhline(
                    y, color="k", ls="--", lw=1.5, label=f"linear scaling ({r['n']} x one worker)"
                )
            else:
                ax.axhline(
                    y,
                    color="gray",
                    ls=":",
                    lw=1.5,
                    label=f"{r['n']} workers, no sync (CPU ceiling, shared cores)",
                )
        for system in dict.fromkeys(r["system"] for r in mrows if rc.csv_number(r["rate_mbit"])):
            pts = sorted(
                (float(r["rate_mbit"]) / 1000, float(r["samples_per_s"]))
                for r in mrows
                if r["system"] == system and r["status"] == "ok" and rc.csv_number(r["rate_mbit"])
            )
            if pts:
                ax.plot(
                    [p[0] for p in pts],
                    [p[1] for p in pts],
                    marker="o",
                    color=COLORS.get(system),
                    label=system,
                )
        ax.set_xlabel("bandwidth per host, Gbit/s")
        ax.set_ylabel("samples/s (all workers)")
        ax.set_xticks(rates)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        first = mrows[0]
        ax.set_title(
            f"{model}-like ({float(first['grad_mb']):.0f} MB grads, batch "
            f"{first['batch']}/worker), n={first['n']}"
        )
        ax.legend(fontsize=8, loc="best")
    fig.text(0.01, 0.01, _footer(meta), fontsize=7, color="gray")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--comm", type=Path, default=rc.RESULTS_DIR / "comm.csv")
    p.add_argument("--train", type=Path, default=rc.RESULTS_DIR / "train.csv")
    p.add_argument("--out-dir", type=Path, default=rc.RESULTS_DIR)
    args = p.parse_args(argv)
    made = 0
    for path, fn, name in (
        (args.comm, plot_comm, "comm.png"),
        (args.train, plot_train, "train.png"),
    ):
        if not path.exists():
            print(f"plot_rack: {path} not found, skipping {name}")
            continue
        fn(path, args.out_dir / name)
        print(f"plot_rack: wrote {args.out_dir / name}")
        made += 1
    return 0 if made else 1


if __name__ == "__main__":
    sys.exit(main())
