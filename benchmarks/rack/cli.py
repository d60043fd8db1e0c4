"""Manual control of emulated racks (run as root from the repository root).

    python -m benchmarks.rack.cli up --workers 2 --cpu-hosts 1 --rate 1000 --prefix fpsr
    python -m benchmarks.rack.cli status --prefix fpsr
    python -m benchmarks.rack.cli down --prefix fpsr
    python -m benchmarks.rack.cli measure --workers 2 --rate 200 --seconds 2
    python -m benchmarks.rack.cli run --workers 2 --cpu-hosts 1 --rate 1000 --timeout 60 \\
        -- python -c "import os; print(os.environ['FASTPS_HOST'])"

``up`` leaves the rack running after the command exits (enter a host with
``ip netns exec fpsr-w0 bash``); ``down`` removes it.  ``run`` and ``measure`` build a
rack, use it and always tear it down.  In ``run`` argv, ``{name}``, ``{addr}``, ``{role}``,
``{index}`` and ``{ns}`` are replaced per host.
"""

from __future__ import annotations

import argparse
import sys
from typing import Dict, List, Optional, Sequence

from .rack import (
    Rack,
    RackError,
    RackProcessError,
    cleanup,
    find_stale,
    is_supported,
)


def _add_rack_args(p: argparse.ArgumentParser, default_prefix: str = "fpsr") -> None:
    p.add_argument("--workers", type=int, default=2, help="worker hosts w0..w{n-1}")
    p.add_argument("--cpu-hosts", type=int, default=0, help="CPU hosts c0..c{k-1}")
    p.add_argument(
        "--rate",
        type=float,
        default=1000.0,
        help="per-host link rate in Mbit/s, each direction (0 = unshaped)",
    )
    p.add_argument("--delay", type=float, default=0.0, help="one-way delay in ms (netem)")
    p.add_argument("--loss", type=float, default=0.0, help="loss in percent (netem)")
    p.add_argument(
        "--prefix", default=default_prefix, help="name prefix of namespaces (default %(default)s)"
    )


def _make_rack(a: argparse.Namespace) -> Rack:
    return Rack(a.workers, a.cpu_hosts, a.rate, delay_ms=a.delay, loss_pct=a.loss, prefix=a.prefix)


def _print_hosts(rack: Rack) -> None:
    rate = f"{rack.rate_mbit:g} Mbit/s" if rack.rate_mbit else "unshaped"
    print(f"rack {rack.prefix}: {rate}, delay {rack.delay_ms:g} ms, loss {rack.loss_pct:g}%")
    for h in rack.hosts:
        print(f"  {h.name:<5} {h.role:<7} {h.addr:<14} netns {h.ns}")


def _cmd_up(a: argparse.Namespace) -> int:
    rack = _make_rack(a)
    rack.start()
    rack.detach()
    _print_hosts(rack)
    print(f"enter a host:  ip netns exec {rack.hosts[0].ns} bash")
    print(f"remove it:     python -m benchmarks.rack.cli down --prefix {rack.prefix}")
    return 0


def _cmd_down(a: argparse.Namespace) -> int:
    removed = cleanup(a.prefix)
    left = find_stale(a.prefix)
    for item in removed:
        print(f"removed {item}")
    if not removed:
        print(f"nothing with prefix {a.prefix!r} to remove")
    if left:
        print(f"could not remove: {', '.join(left)}", file=sys.stderr)
        return 1
    return 0


def _cmd_status(a: argparse.Namespace) -> int:
    found = find_stale(a.prefix)
    if not found:
        print(f"no rack with prefix {a.prefix!r}")
        return 0
    for item in found:
        print(item)
    return 0


def _cmd_measure(a: argparse.Namespace) -> int:
    with _make_rack(a) as rack:
        _print_hosts(rack)
        mbit = rack.measure_throughput(a.src, a.dst, a.seconds)
        print(f"{a.src} -> {a.dst}: {mbit:.1f} Mbit/s goodput over {a.seconds:g} s")
    return 0


def _fill(arg: str, fields: Dict[str, object]) -> str:
    for key, value in fields.items():
        arg = arg.replace("{" + key + "}", str(value))
    return arg


def _cmd_run(a: argparse.Namespace) -> int:
    argv: List[str] = list(a.command)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        print("run: give a command after --", file=sys.stderr)
        return 2
    with _make_rack(a) as rack:
        _print_hosts(rack)
        names = a.hosts.split(",") if a.hosts else [h.name for h in rack.hosts]
        procs = []
        for name in names:
            h = rack.host(name)
            fields: Dict[str, object] = {
                "name": h.name,
                "addr": h.addr,
                "role": h.role,
                "index": h.index,
                "ns": h.ns,
            }
            procs.append(rack.spawn(h, [_fill(arg, fields) for arg in argv]))
        try:
            rack.run_all(procs, timeout=a.timeout)
            rc = 0
        except RackProcessError as exc:
            print(str(exc).split("\n--- last output ---", 1)[0], file=sys.stderr)
            rc = 1
        for text in rack.logs().values():
            if text:
                sys.stdout.write(text)
    return rc


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.rack.cli", description="emulated rack of network namespaces"
    )
    sub = parser.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("up", help="build a rack and leave it running")
    _add_rack_args(p)
    p.set_defaults(func=_cmd_up)

    p = sub.add_parser("down", help="remove a rack (processes, namespaces, links)")
    p.add_argument("--prefix", default="fpsr")
    p.set_defaults(func=_cmd_down)

    p = sub.add_parser("status", help="list namespaces/links with a prefix")
    p.add_argument("--prefix", default="fpsr")
    p.set_defaults(func=_cmd_status)

    p = sub.add_parser("measure", help="build a rack, measure one TCP stream, tear down")
    _add_rack_args(p)
    p.add_argument("--src", default="w0")
    p.add_argument("--dst", default="w1")
    p.add_argument("--seconds", type=float, default=2.0)
    p.set_defaults(func=_cmd_measure)

    p = sub.add_parser("run", help="build a rack, run a command on hosts, tear down")
    _add_rack_args(p)
    p.add_argument("--hosts", default="", help="comma-separated host names (default: all)")
    p.add_argument("--timeout", type=float, default=300.0, help="hard bound in seconds")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    p.set_defaults(func=_cmd_run)

    a = parser.parse_args(argv)
    if a.cmd in ("up", "measure", "run"):
        ok, why = is_supported()
        if not ok:
            print(f"rack not supported here: {why}", file=sys.stderr)
            return 2
    try:
        return int(a.func(a))
    except (RackError, ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
