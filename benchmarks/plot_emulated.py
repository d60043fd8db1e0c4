"""Plot of the GPU-profile emulator's table (benchmarks/train_emulated.py CSVs).

One column per model; the top row is each system's fraction of the ideal per-iteration
time max(C, communication bound at k) against the number of CPU hosts k, the bottom row
its speedup over DDP-Gloo at the same ratio. Colour = system, marker and line style =
compute-to-communication ratio. The training-speed targets are drawn as dashed lines (0.9 of the
ideal; 1.25x DDP). Several CSVs (one per model block) go into one figure; a row that did
not finish (status other than "ok") is left out; repeated runs of a cell (``--repeats``)
are drawn as their median.

    python -m benchmarks.plot_emulated docs/results/emulated-issue14-*.csv \
        --out docs/results/emulated-issue14.png
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import rack_common as rc  # noqa: E402

SYSTEM_COLORS = {
    "fastps cross-barrier": "tab:blue",
    "fastps sync step": "tab:purple",
    "fastps cb, priority off": "tab:green",
    "DDP-Gloo": "tab:orange",
}
RATIO_STYLES = {"0.5": ("v", ":"), "1": ("o", "-"), "2": ("^", "--"), "ref": ("s", "-.")}
FRACTION_TARGET = 0.9
SPEEDUP_TARGET = 1.25
REQUIRED = ("model", "ratio", "system", "k", "frac_ideal", "speedup_vs_ddp", "status")


def _ratio_key(ratio: str) -> str:
    """'1.0' and '1' are one ratio; 'ref' stays as it is."""
    value = rc.csv_number(ratio)
    return ratio if value is None else f"{value:g}"


def load(paths: Sequence[Path]) -> Tuple[List[Dict[str, str]], List[str]]:
    """Every finished system row of the CSVs (compute-alone rows dropped) and a footer
    line per file (commit, date, goodput)."""
    rows: List[Dict[str, str]] = []
    footers: List[str] = []
    for path in paths:
        meta, file_rows = rc.read_csv(path)
        missing = [c for c in REQUIRED if file_rows and c not in file_rows[0]]
        if missing:
            raise SystemExit(
                f"plot_emulated: {path} is not a train_emulated CSV "
                f"(no column {', '.join(missing)})"
            )
        footers.append(
            f"{path.name}: commit {meta.get('commit', '?')}, {meta.get('date', '?')}, "
            f"goodput {meta.get('goodput', '?')}"
        )
        for row in file_rows:
            if row.get("status") != "ok" or row.get("system") == "compute alone":
                continue
            if rc.csv_number(row.get("frac_ideal")) is None:
                continue
            rows.append(row)
    return rows, footers


def measured_ks(rows: Sequence[Dict[str, str]], model: str) -> List[float]:
    """The numbers of CPU hosts the model was measured at."""
    ks = {rc.csv_number(r["k"]) for r in rows if r["model"] == model}
    return sorted(k for k in ks if k is not None)


def series(
    rows: Sequence[Dict[str, str]], model: str, column: str
) -> Dict[Tuple[str, str], List[Tuple[float, float]]]:
    """(system, ratio) -> sorted [(k, value)]; DDP has no k of its own (it rings over the
    workers; its rows say k = 0), so its one value per ratio is drawn across every k. Runs
    repeated (``train_emulated --repeats``, or several CSVs of one cell) give their median."""
    ks = measured_ks(rows, model)
    values: Dict[Tuple[str, str], Dict[float, List[float]]] = {}
    for r in rows:
        if r["model"] != model:
            continue
        value = rc.csv_number(r.get(column))
        if value is None:
            continue
        key = (r["system"], _ratio_key(r["ratio"]))
        k = rc.csv_number(r.get("k"))
        spans = k is None or r["system"] == "DDP-Gloo"
        per_k = values.setdefault(key, {})
        for kk in ks if spans else [k]:
            per_k.setdefault(kk, []).append(value)
    return {
        key: sorted((k, statistics.median(vs)) for k, vs in per_k.items())
        for key, per_k in values.items()
    }


def plot(rows: Sequence[Dict[str, str]], footers: Sequence[str], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in rows))
    if not models:
        raise SystemExit("plot_emulated: no finished rows in the CSVs")
    fig, axes = plt.subplots(
        2, len(models), figsize=(max(4.6 * len(models), 10.0), 7.6), squeeze=False, sharex=True
    )
    panels = (
        ("frac_ideal", "fraction of ideal max(C, bound)", FRACTION_TARGET),
        ("speedup_vs_ddp", "speedup over DDP-Gloo", SPEEDUP_TARGET),
    )
    for col, model in enumerate(models):
        for row_i, (column, label, target) in enumerate(panels):
            ax = axes[row_i][col]
            for (system, ratio), points in sorted(series(rows, model, column).items()):
                if column == "speedup_vs_ddp" and system == "DDP-Gloo":
                    continue
                marker, style = RATIO_STYLES.get(ratio, ("x", "-"))
                ax.plot(
                    [p[0] for p in points],
                    [p[1] for p in points],
                    marker=marker,
                    linestyle=style,
                    color=SYSTEM_COLORS.get(system, "tab:gray"),
                    label=f"{system}, ratio {ratio}",
                )
            ax.axhline(target, color="black", linestyle="--", linewidth=0.8)
            ax.grid(True, alpha=0.3)
            if row_i == 0:
                ax.set_title(model)
                ax.set_ylim(0.4, 1.05)
            else:
                ax.set_xlabel("CPU hosts k (n = 4 worker hosts)")
            if col == 0:
                ax.set_ylabel(label)
            ax.set_xticks(measured_ks(rows, model))
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower right", ncol=3, fontsize=7, frameon=False)
    fig.text(0.01, 0.005, "\n".join(footers), fontsize=6, va="bottom")
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"plot_emulated: wrote {out}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("csv", nargs="+", type=Path, help="train_emulated CSVs")
    p.add_argument("--out", type=Path, default=Path("docs/results/emulated-issue14.png"))
    args = p.parse_args(argv)
    rows, footers = load(args.csv)
    plot(rows, footers, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
