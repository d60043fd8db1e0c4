"""Plots docs/results/sfb-rebuild.csv (benchmarks/sfb_rack.py) as docs/results/sfb.png:
bytes per host and step, and the wait after backward split into network and rebuild.

    python -m benchmarks.plot_sfb
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import rack_common as rc  # noqa: E402


def main() -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = rc.REPO / "docs" / "results"
    _, rows = rc.read_csv(results / "sfb-rebuild.csv")
    rows = [r for r in rows if r["model"] == "vgg16fc" and r["status"] == "ok"]
    if not rows:
        print("plot_sfb: no vgg16fc rows in sfb-rebuild.csv", file=sys.stderr)
        return 1
    names = [r["system"].replace("fastps ", "") for r in rows]
    mb = [float(r["host_mb_per_step"]) for r in rows]
    rebuild = [float(r["rebuild_s"] or 0) for r in rows]
    network = [float(r["sync_wait_s"]) - b for r, b in zip(rows, rebuild)]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4))
    left.bar(names, mb, color="#4477aa")
    left.set_yscale("log")
    left.set_ylabel("MB per host per step")
    left.set_title("VGG-16 FC layers, 4 workers, 1 Gbit/s")
    for i, v in enumerate(mb):
        left.text(i, v, f"{v:.0f}", ha="center", va="bottom")
    right.bar(names, network, color="#4477aa", label="waiting for the network")
    right.bar(names, rebuild, bottom=network, color="#ee6677", label="rebuilding from factors")
    right.set_ylabel("seconds after backward")
    right.set_ylim(0, 1.35 * max(n + b for n, b in zip(network, rebuild)))
    right.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    out = results / "sfb.png"
    fig.savefig(out, dpi=110)
    print(f"plot_sfb: wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
