"""Throughput of the summation kernel (fastps._core.sum_to) per dtype and SIMD level.

For each dtype, on buffers of --mib MiB each, this measures
  * fastps  sum_to(c, a, b) on every SIMD level the CPU supports,
  * numpy   np.add(a, b, out=c) (numpy has no bfloat16: reported as n/a),
  * bound   the memory bandwidth one core gets for streaming traffic,
            measured in the same run with libc's streaming routines on the
            same buffers, as the larger of
              copy:      np.copyto(c, a) (memcpy), 2 x bytes / t_copy;
              read+write: 3 x bytes / (t_memcmp(a, a_copy) + t_memset(c)),
                         i.e. the two reads and the one write of a sum done
                         by libc's read-only and write-only loops.
Bytes counted for sums: 3 x buffer bytes (two reads, one write). On a core
whose bandwidth is limited by outstanding misses rather than by DRAM (common
in VMs), a three-stream sum can move bytes faster than either probe, so
fastps/bound can exceed 1.

The machine may be shared (a VM with noisy neighbours), so measurements are
interleaved: each round times every variant once, and each number is the
median over --repeats rounds (after one warm-up round). Ratios therefore
compare numbers taken in the same time window. Before each timed call an
untimed read of unrelated memory evicts the buffers, so every variant starts
from the same (cold) cache state.

    python benchmarks/bench_sum.py [--mib 64] [--repeats 9] [--json out.json]
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

try:
    from fastps import _core
except ImportError as e:  # pragma: no cover
    sys.exit(f"fastps._core is not importable ({e}); build it with `pip install -e .` first")

STORAGE = {
    "float32": np.float32,
    "float64": np.float64,
    "float16": np.float16,
    "bfloat16": np.uint16,  # bit patterns; numpy has no bfloat16
    "int32": np.int32,
    "int64": np.int64,
}
DEFAULT_DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64"]
LEVELS = ["avx512", "avx2", "scalar"]


_LIBC = ctypes.CDLL(None)
_LIBC.memcmp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
_LIBC.memcmp.restype = ctypes.c_int
_LIBC.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
_LIBC.memset.restype = ctypes.c_void_p


def interleaved_medians(probes: dict, repeats: int) -> dict:
    """probes: name -> (setup, fn). Each round runs setup() untimed, then times fn()."""
    times = {name: [] for name in probes}
    for rnd in range(repeats + 1):  # round 0 is the warm-up
        for name, (setup, fn) in probes.items():
            setup()
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            if rnd:
                times[name].append(dt)
    return {name: statistics.median(t) for name, t in times.items()}


def make_buffers(dtype: str, nbytes: int, rng: np.random.Generator):
    n = nbytes // np.dtype(STORAGE[dtype]).itemsize
    if dtype == "bfloat16":
        f = rng.standard_normal(n, dtype=np.float32)
        a = (f.view(np.uint32) >> 16).astype(np.uint16)
        b = a[::-1].copy()
    elif np.issubdtype(STORAGE[dtype], np.floating):
        a = rng.standard_normal(n).astype(STORAGE[dtype])
        b = rng.standard_normal(n).astype(STORAGE[dtype])
    else:
        a = rng.integers(-1000, 1000, n, dtype=STORAGE[dtype])
        b = rng.integers(-1000, 1000, n, dtype=STORAGE[dtype])
    c = np.ones_like(a)  # touched, so no page faults inside the timing
    return n, a, b, c


def supported_levels() -> list[str]:
    original = _core.simd_level()
    found = [lvl for lvl in LEVELS if _core.set_simd_level(lvl)]
    _core.set_simd_level(original)
    return found


def bench_dtype(dtype: str, nbytes: int, levels: list[str], repeats: int, rng) -> list[dict]:
    n, a, b, c = make_buffers(dtype, nbytes, rng)
    a_copy = a.copy()
    size = a.nbytes
    pa, pb, pc, pa2 = a.ctypes.data, b.ctypes.data, c.ctypes.data, a_copy.ctypes.data
    # Before every timed call, read 2 x buffer bytes of unrelated memory, so each
    # variant starts with the buffers out of cache and no dirty destination
    # lines left behind by the previous variant (whose write-back would
    # otherwise be charged to the next one).
    scrub_a = np.ones(size, dtype=np.uint8)
    scrub_b = np.ones(size, dtype=np.uint8)
    ps_a, ps_b = scrub_a.ctypes.data, scrub_b.ctypes.data

    def scrub():
        _LIBC.memcmp(ps_a, ps_b, size)

    def read2():
        if _LIBC.memcmp(pa, pa2, size) != 0:
            raise RuntimeError("memcmp probe: copies differ")

    def sum_on(level):
        def setup():
            _core.set_simd_level(level)
            scrub()

        return (setup, lambda: _core.sum_to(pc, pa, pb, n, dtype))

    probes = {
        "read2": (scrub, read2),
        "write": (scrub, lambda: _LIBC.memset(pc, 0, size)),
        "copy": (scrub, lambda: np.copyto(c, a)),
    }
    if dtype != "bfloat16":
        probes["numpy"] = (scrub, lambda: np.add(a, b, out=c))
    for level in levels:
        probes[level] = sum_on(level)
    med = interleaved_medians(probes, repeats)

    read_write = 3 * size / (med["read2"] + med["write"]) / 1e9
    copy = 2 * size / med["copy"] / 1e9
    bound = max(copy, read_write)
    numpy_gbs = 3 * size / med["numpy"] / 1e9 if "numpy" in med else None
    rows = []
    for level in levels:
        gbs = 3 * size / med[level] / 1e9
        rows.append(
            {
                "dtype": dtype,
                "level": level,
                "fastps_gbs": gbs,
                "numpy_gbs": numpy_gbs,
                "bound_gbs": bound,
                "copy_gbs": copy,
                "read_write_gbs": read_write,
                "read2_gbs": 2 * size / med["read2"] / 1e9,
                "write_gbs": size / med["write"] / 1e9,
                "fastps_over_bound": gbs / bound,
                "fastps_over_numpy": gbs / numpy_gbs if numpy_gbs else None,
            }
        )
    # Check one result per level, so a broken kernel cannot post a fast number.
    for level in levels:
        _core.set_simd_level(level)
        c.fill(0)
        _core.sum_to(pc, pa, pb, n, dtype)
        if dtype != "bfloat16" and not np.array_equal(c, a + b):
            raise RuntimeError(f"sum_to gave a wrong {dtype} result on {level}")
    return rows


def run(args) -> dict:
    nbytes = args.mib << 20
    rng = np.random.default_rng(0)
    levels = [lvl for lvl in supported_levels() if lvl in args.levels]
    original = _core.simd_level()
    rows = []
    load_before = os.getloadavg()
    try:
        for dtype in args.dtypes:
            rows += bench_dtype(dtype, nbytes, levels, args.repeats, rng)
    finally:
        _core.set_simd_level(original)
    return {
        "benchmark": "sum_to",
        "date": datetime.date.today().isoformat(),
        "buffer_mib": args.mib,
        "repeats": args.repeats,
        "bytes_counted": "sum: 3 x buffer (2 reads + 1 write)",
        "bound": "max(copy: 2 x buffer / t(np.copyto), read_write: 3 x buffer / "
        "(t(memcmp of two buffers) + t(memset of one)))",
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "cpus": os.cpu_count(),
            "numpy": np.__version__,
            "default_simd_level": original,
            # Other processes on the machine disturb bandwidth numbers: recorded.
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
        },
        "rows": rows,
    }


def fmt(x, spec):
    return "n/a" if x is None else format(x, spec)


def print_table(result: dict) -> None:
    head = [
        "dtype",
        "level",
        "fastps GB/s",
        "numpy GB/s",
        "bound GB/s",
        "fastps/bound",
        "fastps/numpy",
    ]
    lines = [head]
    for r in result["rows"]:
        lines.append(
            [
                r["dtype"],
                r["level"],
                fmt(r["fastps_gbs"], ".1f"),
                fmt(r["numpy_gbs"], ".1f"),
                fmt(r["bound_gbs"], ".1f"),
                fmt(r["fastps_over_bound"], ".2f"),
                fmt(r["fastps_over_numpy"], ".2f"),
            ]
        )
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for row in lines[1:]:
        print("| " + " | ".join(row) + " |")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=64, help="size of each buffer in MiB (64)")
    p.add_argument("--repeats", type=int, default=9, help="timed rounds per number (9)")
    p.add_argument("--dtypes", nargs="+", default=DEFAULT_DTYPES, choices=list(STORAGE))
    p.add_argument("--levels", nargs="+", default=LEVELS, choices=LEVELS)
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be positive")
    result = run(args)
    print(
        f"sum_to on {args.mib} MiB buffers, median of {args.repeats} interleaved rounds; "
        f"default level {result['machine']['default_simd_level']}; "
        "bound = max(copy 2B/t, 3B/(t memcmp(2 bufs) + t memset(1 buf))); "
        f"load average before/after {result['machine']['loadavg_before'][0]:.2f}"
        f"/{result['machine']['loadavg_after'][0]:.2f}"
    )
    print_table(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
