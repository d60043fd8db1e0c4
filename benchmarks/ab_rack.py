"""Two commits side by side on the emulated rack: the guard before a data-path change merges.

Builds each revision into its own directory (``git archive`` + ``pip wheel``, cached by
commit under ``--cache``), then runs one benchmark under each, interleaved in one run
(A B, B A, A B, ...) so that both see the same machine, and prints per cell the median
time of each, the paired ratio B/A (median and range over repeats) and each one's fraction
of the bound. A ratio above 1 means B is slower.

    python -m benchmarks.ab_rack --a HEAD~1 --b HEAD                   # comm_rack, k=0 1 2 4
    python -m benchmarks.ab_rack --a main --b WORKTREE --repeats 7     # uncommitted changes
    python -m benchmarks.ab_rack --a c6d1685 --b HEAD --bench emulated \\
        -- --models resnet50 --ratios 1 -k 0 2 --steps 10
    python -m benchmarks.ab_rack --a HEAD~1 --b HEAD --bench latency --repeats 7  # loopback
    python -m benchmarks.ab_rack --a HEAD --b HEAD --b-env FASTPS_PARTITION_BYTES=262144

``WORKTREE`` is the tracked files as they are now (``git stash create``; untracked files are
not in it). Arguments after ``--`` go to the benchmark (``benchmarks/comm_rack.py``,
``benchmarks/train_emulated.py`` or ``benchmarks/bench_latency.py``); the defaults are
ResNet-50's gradient set, fastps only, n = 4 at 1 Gbit/s. The rack benchmarks need root
(network namespaces); the latency one runs on loopback.

How a revision is run without the tree's editable install: a venv without packages of its
own whose one ``.pth`` line appends this interpreter's site-packages (plain path lines do not
run the ``.pth`` files found there, so the editable finder stays out), and ``PYTHONPATH``
puts the revision's built package first. The benchmark code is always this tree's.
"""

from __future__ import annotations

import argparse
import csv
import shutil
import statistics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

REPO = Path(__file__).resolve().parents[1]

# Per benchmark: its module, the columns that name a cell, the time column, the fraction
# column, and arguments that keep the run on fastps alone unless the caller says otherwise.
BENCHES = {
    "comm": (
        "benchmarks.comm_rack",
        ("model", "system", "n", "k"),
        "time_s",
        "frac_bound",
        ["--systems", "fastps", "--iters", "5", "--warmup", "1"],
    ),
    "emulated": (
        "benchmarks.train_emulated",
        ("model", "ratio", "system", "k"),
        "iter_s",
        "frac_ideal",
        ["--systems", "fastps-cb"],
    ),
    # Loopback, no root: the round trip of one small tensor (median and p99 in microseconds).
    "latency": (
        "benchmarks.bench_latency",
        ("size_bytes", "system"),
        "median_us",
        "p99_us",
        ["--systems", "fastps", "--repeats", "1"],
    ),
}


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def resolve(rev: str) -> Tuple[str, str]:
    """(commit, label) of a revision; WORKTREE is the tracked files as they are now."""
    if rev == "WORKTREE":
        sha = _git("stash", "create") or _git("rev-parse", "HEAD")
        return sha, "worktree"
    try:
        sha = _git("rev-parse", "--verify", f"{rev}^{{commit}}")
    except subprocess.CalledProcessError:
        sys.exit(f"ab_rack: {rev!r} is not a commit of {REPO}")
    return sha, rev


def build(sha: str, cache: Path) -> Path:
    """The directory to put on PYTHONPATH for commit `sha` (built once, then reused)."""
    root = cache / sha[:12]
    site = root / "site"
    done = root / "built"
    if done.exists():
        return site
    shutil.rmtree(root, ignore_errors=True)
    src, wheels = root / "src", root / "wheel"
    src.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", sha], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    t0 = time.monotonic()
    print(f"ab_rack: building {sha[:12]} (pip wheel; minutes on 2 cores)", flush=True)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(wheels), str(src)], check=True)
    wheel = next(wheels.glob("fastps-*.whl"))
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)], check=True)
    shutil.rmtree(src)
    done.write_text(f"{sha}\n")
    print(f"ab_rack: built {sha[:12]} in {time.monotonic() - t0:.0f} s", flush=True)
    return site


def bare_python(cache: Path) -> Path:
    """A venv interpreter that sees this interpreter's packages but not its editable fastps."""
    venv = cache / "venv"
    py = venv / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    parents = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(purelib, "_ab_parent_site.pth").write_text("".join(f"{p}\n" for p in sorted(parents)))
    return py


# Per benchmark, a column of CPU efficiency (more is better) shown beside the time when the
# runs wrote it: comm_rack's megabytes synchronised per CPU-second of the job's own
# processes (benchmarks/cpu_account.py, JobCpuSampler), which other load barely moves.
CPU_COLUMNS = {"comm": "job_mb_per_cpu_s"}


def read_cells(
    path: Path, keys: Sequence[str], tcol: str, fcol: str, ccol: str = ""
) -> Dict[Tuple[str, ...], Tuple[float, float, float]]:
    with path.open() as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    out: Dict[Tuple[str, ...], Tuple[float, float, float]] = {}
    for r in rows:
        if r.get("status", "ok") != "ok" or not r.get(tcol):
            continue
        frac = float(r[fcol]) if r.get(fcol) else float("nan")
        cpu = float(r[ccol]) if ccol and r.get(ccol) else float("nan")
        out[tuple(r[k] for k in keys)] = (float(r[tcol]), frac, cpu)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: List[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--a", required=True, help="baseline revision (a commit, a branch, HEAD~1)")
    p.add_argument("--b", required=True, help="revision under test (or WORKTREE)")
    p.add_argument("--bench", choices=sorted(BENCHES), default="comm")
    p.add_argument("--repeats", type=int, default=5, help="runs of each revision (interleaved)")
    p.add_argument(
        "--a-env",
        nargs="*",
        default=[],
        metavar="NAME=VALUE",
        help="environment of A's runs only (a setting against the default: --a X --b X)",
    )
    p.add_argument("--b-env", nargs="*", default=[], metavar="NAME=VALUE", help="B's only")
    p.add_argument("--cache", type=Path, default=Path("/tmp/fastps-ab"))
    p.add_argument("--out", type=Path, default=None, help="CSV of every run's cells")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error(f"--repeats must be >= 1, got {args.repeats}")
    side_env = [_env_pairs(p, args.a_env), _env_pairs(p, args.b_env)]
    module, keys, tcol, fcol, defaults = BENCHES[args.bench]
    bench_args = extra or defaults
    if args.bench == "comm" and not any(a in ("-k", "--cpu-hosts") for a in bench_args):
        bench_args = [*bench_args, "-k", "0", "1", "2", "4"]

    args.cache.mkdir(parents=True, exist_ok=True)
    revs = [resolve(args.a), resolve(args.b)]
    for side in (0, 1):
        if side_env[side]:
            sha, label = revs[side]
            env_text = " ".join(f"{k}={v}" for k, v in side_env[side].items())
            revs[side] = (sha, f"{label} {env_text}")
    if revs[0][0] == revs[1][0] and side_env[0] == side_env[1]:
        print(f"ab_rack: note: A and B are the same commit {revs[0][0][:12]} (an A/A run)")
    sites = [build(sha, args.cache) for sha, _ in revs]
    py = bare_python(args.cache)
    runs_dir = args.cache / "runs" / time.strftime("%Y%m%d-%H%M%S")
    runs_dir.mkdir(parents=True)

    # cells[key][side] = [(time, frac, cpu) per repeat]
    cells: Dict[Tuple[str, ...], List[List[Tuple[float, float, float]]]] = {}
    ccol = CPU_COLUMNS.get(args.bench, "")
    t_start = time.monotonic()
    for rep in range(args.repeats):
        order = (0, 1) if rep % 2 == 0 else (1, 0)
        for side in order:
            sha, label = revs[side]
            out = runs_dir / f"{'AB'[side]}-{rep}.csv"
            cmd = [str(py), "-m", module, *bench_args, "--out", str(out)]
            env = {**_environ(), "PYTHONPATH": str(sites[side]), "PYTHONNOUSERSITE": "1"}
            env.update(side_env[side])
            print(f"ab_rack: repeat {rep + 1}/{args.repeats}, {'AB'[side]} = {label}", flush=True)
            proc = subprocess.run(cmd, cwd=str(REPO), env=env, capture_output=True, text=True)
            if proc.returncode != 0 or not out.exists():
                sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
                print(f"ab_rack: the {label} run failed (exit {proc.returncode})", file=sys.stderr)
                return 1
            for key, val in read_cells(out, keys, tcol, fcol, ccol).items():
                cells.setdefault(key, [[], []])[side].append(val)

    print()
    print(f"A = {revs[0][1]} ({revs[0][0][:12]}), B = {revs[1][1]} ({revs[1][0][:12]}), ")
    print(
        f"{args.bench}: {module} {' '.join(bench_args)}; {args.repeats} repeats each, "
        f"interleaved ({time.monotonic() - t_start:.0f} s)"
    )
    head = f"{'  '.join(f'{k:>8}' for k in keys)}  {'A':>7} {'B':>7}  {'B/A':>6} {'range':>13}"
    cpu_head = f"  {'A cpu':>7} {'B cpu':>7} {'B/A cpu':>7}" if ccol else ""
    print(f"{head}  {'A ' + fcol:>10} {'B ' + fcol:>10}{cpu_head}   ({tcol}: medians over repeats)")
    if ccol:
        print(f"(cpu: {ccol}, more is better; B/A cpu: median of the paired ratios)")
    rows = []
    for key in sorted(cells, key=lambda c: tuple(_sortable(x) for x in c)):
        a, b = cells[key]
        if not a or not b:
            continue
        paired = [tb[0] / ta[0] for ta, tb in zip(a, b)]
        ma, mb = statistics.median(t[0] for t in a), statistics.median(t[0] for t in b)
        fa, fb = statistics.median(t[1] for t in a), statistics.median(t[1] for t in b)
        ca, cb = statistics.median(t[2] for t in a), statistics.median(t[2] for t in b)
        cpu_pairs = [tb[2] / ta[2] for ta, tb in zip(a, b)]
        cratio = statistics.median(cpu_pairs)
        ratio = statistics.median(paired)
        rows.append(
            (*key, ma, mb, ratio, min(paired), max(paired), fa, fb, ca, cb, cratio, len(paired))
        )
        cpu_text = f"  {ca:7.1f} {cb:7.1f} {cratio:7.3f}" if ccol else ""
        print(
            f"{'  '.join(f'{k:>8}' for k in key)}  {ma:7.3f} {mb:7.3f}  {ratio:6.3f} "
            f"{min(paired):6.3f}-{max(paired):6.3f}  {fa:10.3f} {fb:10.3f}{cpu_text}"
        )
    if args.out:
        with args.out.open("w", newline="") as f:
            f.write(f"# command: python -m benchmarks.ab_rack {' '.join(sys.argv[1:])}\n")
            f.write(f"# A: {revs[0][1]} {revs[0][0]}\n# B: {revs[1][1]} {revs[1][0]}\n")
            f.write(f"# date: {time.strftime('%Y-%m-%d %H:%M:%SZ', time.gmtime())}\n")
            w = csv.writer(f)
            w.writerow(
                [*keys, f"a_{tcol}", f"b_{tcol}", "b_over_a", "min", "max"]
                + [f"a_{fcol}", f"b_{fcol}", "a_cpu", "b_cpu", "b_over_a_cpu", "pairs"]
            )
            for r in rows:
                w.writerow([f"{x:.5g}" if isinstance(x, float) else x for x in r])
        print(f"ab_rack: wrote {args.out}")
    print(f"ab_rack: every run's CSV is in {runs_dir}")
    return 0


def _env_pairs(p: argparse.ArgumentParser, items: Sequence[str]) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            p.error(f"--a-env/--b-env want NAME=VALUE, got {item!r}")
        out[key] = value
    return out


def _environ() -> Dict[str, str]:
    import os

    env = dict(os.environ)
    env.pop("VIRTUAL_ENV", None)
    return env


def _sortable(x: str) -> Tuple[int, float, str]:
    try:
        return (0, float(x), "")
    except ValueError:
        return (1, 0.0, x)


if __name__ == "__main__":
    sys.exit(main())
