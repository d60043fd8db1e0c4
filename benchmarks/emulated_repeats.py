"""Medians over repeated runs of the training emulator (``train_emulated --repeats N``).

On a shared 2-core machine one run of a cell (model, ratio, system, k) moves by a few
points between runs of the same commit, so a cell is judged by the median of its repeats,
with the spread beside it. The repeats of ``train_emulated`` are whole passes over the
table (every ratio, system and k, then again), so a drift in the machine's load spreads
over every cell instead of landing on one. ``plot_emulated`` draws these medians too.
"""

from __future__ import annotations

import statistics
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from benchmarks import rack_common as rc

CellKey = Tuple[str, str, str, str, str]


def cell_key(row: Mapping[str, Any]) -> CellKey:
    """What makes two rows repeats of one cell: model, embedding gradient, ratio, system, k."""
    return (
        str(row.get("model", "")),
        str(row.get("embedding_grad", "") or ""),
        str(row.get("ratio", "")),
        str(row.get("system", "")),
        str(row.get("k", "")),
    )


def _number(row: Mapping[str, Any], column: str) -> Optional[float]:
    return rc.csv_number(row.get(column))  # a float in a live row, a string read back


def medians(rows: Sequence[Mapping[str, Any]], target: float = 0.9) -> List[Dict[str, Any]]:
    """One summary per cell (compute alone left out), in the order the cells first appear:
    ``runs`` (finished), ``failed`` (runs that did not finish), ``reached`` (finished runs
    at or above ``target``), and over the finished runs the median, minimum and maximum of
    ``frac_ideal`` (None if none finished), the median of ``iter_s`` and, where every
    finished run had DDP beside it, of ``speedup_vs_ddp``."""
    order: List[CellKey] = []
    cells: Dict[CellKey, List[Mapping[str, Any]]] = {}
    failed: Dict[CellKey, int] = {}
    for row in rows:
        if row.get("system") == "compute alone":
            continue  # no ideal of its own
        key = cell_key(row)
        ok = row.get("status") == "ok"
        if ok and _number(row, "frac_ideal") is None:
            continue
        if key not in cells:
            cells[key] = []
            order.append(key)
        if ok:
            cells[key].append(row)
        else:
            failed[key] = failed.get(key, 0) + 1
    out: List[Dict[str, Any]] = []
    for key in order:
        runs = cells[key]
        fr = [_number(r, "frac_ideal") or 0.0 for r in runs]  # empty: every run failed
        iters = [x for x in (_number(r, "iter_s") for r in runs) if x is not None]
        speed = [x for x in (_number(r, "speedup_vs_ddp") for r in runs) if x is not None]
        model, grad, ratio, system, k = key
        out.append(
            {
                "model": model,
                "embedding_grad": grad,
                "ratio": ratio,
                "system": system,
                "k": k,
                "runs": len(runs),
                "failed": failed.get(key, 0),
                "reached": sum(1 for f in fr if f >= target),
                "frac_median": statistics.median(fr) if fr else None,
                "frac_min": min(fr) if fr else None,
                "frac_max": max(fr) if fr else None,
                "iter_median_s": statistics.median(iters) if iters else None,
                "speedup_median": (
                    statistics.median(speed) if speed and len(speed) == len(runs) else None
                ),
            }
        )
    return out


def format_medians(rows: Sequence[Mapping[str, Any]], target: float = 0.9) -> str:
    """The table ``train_emulated`` prints after repeated runs: per cell the median fraction
    of the ideal, its range and how many runs reached ``target``."""
    lines = [
        f"{'model':8s} {'ratio':>5s} {'system':22s} {'k':>2s} {'runs':>4s} {'failed':>6s} "
        f"{'median':>7s} {'min-max':>13s} {'>=' + format(target, 'g'):>5s} {'vs DDP':>7s}"
    ]
    for m in medians(rows, target):
        sp = f"{m['speedup_median']:7.2f}" if m["speedup_median"] is not None else f"{'-':>7s}"
        if m["frac_median"] is None:
            lines.append(
                f"{m['model']:8s} {m['ratio']:>5s} {m['system']:22s} {m['k']:>2s} "
                f"{m['runs']:>4d} {m['failed']:>6d}  no finished run"
            )
            continue
        lines.append(
            f"{m['model']:8s} {m['ratio']:>5s} {m['system']:22s} {m['k']:>2s} {m['runs']:>4d} "
            f"{m['failed']:>6d} "
            f"{m['frac_median']:7.3f} {m['frac_min']:6.3f}-{m['frac_max']:.3f} "
            f"{m['reached']:>2d}/{m['runs']:<2d} {sp}"
        )
    return "\n".join(lines)
