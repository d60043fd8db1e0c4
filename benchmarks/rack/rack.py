"""An emulated rack: one network namespace per host, joined by a bridge, links shaped by tc.

Layout for ``Rack(n_workers=2, n_cpu_hosts=1, rate_mbit=..., prefix="fpsr")``::

    netns fpsr-sw : bridge "br0" with ports w0, w1, c0   (the switch; no IP address)
    netns fpsr-w0 : lo, eth0 198.18.1.1/16   <-veth->  port "w0" in fpsr-sw
    netns fpsr-w1 : lo, eth0 198.18.1.2/16   <-veth->  port "w1" in fpsr-sw
    netns fpsr-c0 : lo, eth0 198.18.2.1/16   <-veth->  port "c0" in fpsr-sw

Two-level racks (``racks=2, uplink_mbit=...``): each rack gets its own switch namespace
(``fpsr-sw0``, ``fpsr-sw1``, ...) whose bridge takes that rack's hosts (hosts are split
over the racks in order, workers and CPU hosts alike), and a core switch ``fpsr-sw``
whose bridge takes one uplink veth per rack (port ``uplink`` in the rack switch, ``r<k>`` in
the core), shaped in both directions at ``uplink_mbit``. 4 hosts at 1000 Mbit/s behind a
1000 Mbit/s uplink is 4:1 oversubscribed. ``env_for`` adds ``FASTPS_RACK=r<k>``.

Nothing is created in the root namespace, so no rack traffic can be forwarded to a real
interface: the host namespaces have exactly one route (the 198.18.0.0/16 subnet on eth0)
and the switch namespace has no addresses at all.

Each host's link is shaped in both directions: an HTB class at ``rate_mbit`` on the
host-side ``eth0`` (the host's egress) and another on the switch-side port (the host's
ingress).  Optional netem delay/loss sits under the host-side class only, so the one-way
host-to-host latency is ``delay_ms`` and the loss per path is ``loss_pct``.

See docs/design/rack.md for usage and caveats.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

__all__ = [
    "Host",
    "ProcSpec",
    "Rack",
    "RackError",
    "RackProcessError",
    "RackTimeoutError",
    "StaleRackError",
    "SUBNET",
    "cleanup",
    "find_stale",
    "is_supported",
    "netem_supported",
]

SUBNET = "198.18.0.0/16"
_PREFIX_LEN = 16
_WORKER_NET = "198.18.1."
_CPU_NET = "198.18.2."
_MAX_HOSTS_PER_ROLE = 250
_HOST_IF = "eth0"
_BRIDGE = "br0"
_UPLINK = "uplink"  # a rack switch's port to the core ("up" would read as a keyword)
_PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{0,9}$")
_CMD_TIMEOUT = 20.0
_LOG_CAP_CHARS = 8 * 1024 * 1024  # per host; oldest lines are dropped beyond this

HostRef = Union["Host", str]


class RackError(RuntimeError):
    """Any failure to build, use or tear down a rack."""


class StaleRackError(RackError):
    """Namespaces or links with this rack's prefix already exist."""

    def __init__(self, prefix: str, leftovers: Sequence[str]) -> None:
        self.prefix = prefix
        self.leftovers = list(leftovers)
        super().__init__(
            f"stale rack objects with prefix {prefix!r} exist: {', '.join(self.leftovers)}. "
            "Another rack with this prefix is running, or an earlier run was killed before "
            "it could clean up. If no rack is running, remove them with:\n"
            f"    python -m benchmarks.rack.cli down --prefix {prefix}"
        )


class RackProcessError(RackError):
    """A process run by ``Rack.run_all`` exited with a non-zero status."""

    def __init__(
        self, message: str, returncodes: Dict[str, Optional[int]], logs: Dict[str, str]
    ) -> None:
        self.returncodes = returncodes
        self.logs = logs
        super().__init__(message)


class RackTimeoutError(RackProcessError):
    """``Rack.run_all`` hit its time bound; every process was killed."""


@dataclasses.dataclass(frozen=True)
class Host:
    """One emulated machine."""

    name: str  # "w0", "c1", ...
    ns: str  # network namespace, e.g. "fpsr-w0"
    addr: str  # IPv4 address on eth0, e.g. "198.18.1.1"
    role: str  # "worker" or "cpu"
    index: int  # position within its role
    rack: str = ""  # "r0", "r1", ... in a two-level rack; "" in a single one


@dataclasses.dataclass
class ProcSpec:
    """A command to start on a host, for ``Rack.run_all``."""

    host: HostRef
    argv: Sequence[str]
    env: Optional[Mapping[str, str]] = None
    cwd: Optional[str] = None
    label: Optional[str] = None


# --------------------------------------------------------------------------- helpers


def _run(
    argv: Sequence[str],
    *,
    check: bool = True,
    timeout: float = _CMD_TIMEOUT,
    stdin: Optional[str] = None,
) -> subprocess.CompletedProcess:
    try:
        res = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, input=stdin
        )
    except subprocess.TimeoutExpired as exc:
        raise RackError(f"command timed out after {timeout}s: {' '.join(argv)}") from exc
    if check and res.returncode != 0:
        raise RackError(
            f"command failed ({res.returncode}): {' '.join(argv)}\n{res.stderr.strip()}"
        )
    return res


def _validate_prefix(prefix: str) -> None:
    if not _PREFIX_RE.match(prefix):
        raise ValueError(
            f"bad rack prefix {prefix!r}: use 1-10 lowercase letters/digits, starting "
            "with a letter (e.g. 'fpsr')"
        )


def _list_netns() -> List[str]:
    res = _run(["ip", "netns", "list"], check=False)
    names = []
    for line in res.stdout.splitlines():
        parts = line.split()
        if parts:
            names.append(parts[0])
    return names


def _list_root_links() -> List[str]:
    res = _run(["ip", "-o", "link", "show"], check=False)
    names = []
    for line in res.stdout.splitlines():
        # "4: name@peer: <...> ..."
        fields = line.split(":", 2)
        if len(fields) >= 2:
            names.append(fields[1].strip().split("@", 1)[0])
    return names


def find_stale(prefix: str) -> List[str]:
    """Namespaces (``netns NAME``) and root-namespace links (``link NAME``) owned by prefix."""
    _validate_prefix(prefix)
    mark = prefix + "-"
    found = [f"netns {n}" for n in _list_netns() if n.startswith(mark)]
    found += [f"link {n}" for n in _list_root_links() if n.startswith(mark)]
    return found


def _ns_pids(ns: str) -> List[int]:
    res = _run(["ip", "netns", "pids", ns], check=False)
    return [int(tok) for tok in res.stdout.split() if tok.isdigit()]


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            state = fh.read().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _kill_ns_processes(ns: str, grace: float = 1.0) -> List[int]:
    """SIGTERM, then SIGKILL, every process whose network namespace is ns."""
    pids = [p for p in _ns_pids(ns) if p != os.getpid()]
    if not pids:
        return []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(_pid_alive(p) for p in pids):
            time.sleep(0.02)
        if not any(_pid_alive(p) for p in pids):
            break
    return pids


def cleanup(prefix: str) -> List[str]:
    """Remove everything a rack with this prefix may have left: processes, netns, links.

    Returns what was removed.  Safe to call when nothing exists.
    """
    _validate_prefix(prefix)
    mark = prefix + "-"
    removed: List[str] = []
    namespaces = [n for n in _list_netns() if n.startswith(mark)]
    for ns in namespaces:
        _kill_ns_processes(ns)
    # Host namespaces first: deleting them removes their veths from the switch too.
    namespaces.sort(key=lambda n: n.endswith("-sw"))
    for ns in namespaces:
        res = _run(["ip", "netns", "del", ns], check=False)
        if res.returncode == 0:
            removed.append(f"netns {ns}")
    for link in _list_root_links():
        if link.startswith(mark):
            res = _run(["ip", "link", "del", link], check=False)
            if res.returncode == 0:
                removed.append(f"link {link}")
    return removed


@functools.lru_cache(maxsize=1)
def is_supported() -> Tuple[bool, str]:
    """Whether racks can be built here: root, ``ip`` and ``tc``, netns + veth + bridge + htb."""
    if sys.platform != "linux":
        return False, f"needs Linux network namespaces (platform is {sys.platform})"
    if os.geteuid() != 0:
        return False, "needs root (network namespaces and tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return False, (
                f"'{tool}' not found; install iproute2 (sh benchmarks/rack/setup_deps.sh)"
            )
    ns = f"fpsprobe{os.getpid()}"
    try:
        steps = [
            ["ip", "netns", "add", ns],
            ["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"],
            ["ip", "-n", ns, "link", "add", "pa", "type", "veth", "peer", "name", "pb"],
            ["ip", "-n", ns, "link", "add", "pbr", "type", "bridge"],
            ["ip", "-n", ns, "link", "set", "pb", "master", "pbr"],
            ["tc", "-n", ns, "qdisc", "add", "dev", "pa", "root", "handle", "1:", "htb"],
        ]
        for argv in steps:
            res = _run(argv, check=False, timeout=10)
            if res.returncode != 0:
                return False, f"probe failed: {' '.join(argv)}: {res.stderr.strip()}"
    except (OSError, RackError) as exc:
        return False, f"probe failed: {exc}"
    finally:
        _run(["ip", "netns", "del", ns], check=False, timeout=10)
    return True, "ok"


@functools.lru_cache(maxsize=1)
def netem_supported() -> Tuple[bool, str]:
    """Whether the kernel has the netem qdisc (needed for delay_ms / loss_pct)."""
    ok, why = is_supported()
    if not ok:
        return ok, why
    ns = f"fpsprobe{os.getpid()}"
    try:
        _run(["ip", "netns", "add", ns], timeout=10)
        _run(
            ["ip", "-n", ns, "link", "add", "pa", "type", "veth", "peer", "name", "pb"], timeout=10
        )
        res = _run(
            ["tc", "-n", ns, "qdisc", "add", "dev", "pa", "root", "netem", "delay", "1ms"],
            check=False,
            timeout=10,
        )
        if res.returncode != 0:
            return False, (
                "the kernel has no netem qdisc (CONFIG_NET_SCH_NETEM), so "
                f"delay_ms/loss_pct cannot be emulated: {res.stderr.strip()}"
            )
    except (OSError, RackError) as exc:
        return False, f"netem probe failed: {exc}"
    finally:
        _run(["ip", "netns", "del", ns], check=False, timeout=10)
    return True, "ok"


def _tc_rate(mbit: float) -> str:
    return f"{max(1, int(round(mbit * 1000)))}kbit"


def _htb_burst_bytes(mbit: float) -> int:
    # Enough tokens for ~1 ms at rate, and never less than one 64 KiB GSO segment, so a
    # single large segment does not make HTB overshoot/undershoot when timers are coarse.
    return max(64 * 1024, int(mbit * 1e6 / 8 * 0.001))


# --------------------------------------------------------------------------- logs


class _LogBook:
    def __init__(self, hosts: Sequence[str]) -> None:
        self._lock = threading.Lock()
        self._lines: Dict[str, List[str]] = {h: [] for h in hosts}
        self._chars: Dict[str, int] = {h: 0 for h in hosts}

    def add(self, host: str, line: str) -> None:
        with self._lock:
            lines = self._lines.setdefault(host, [])
            lines.append(line)
            self._chars[host] = self._chars.get(host, 0) + len(line)
            while self._chars[host] > _LOG_CAP_CHARS and len(lines) > 1:
                self._chars[host] -= len(lines.pop(0))

    def text(self) -> Dict[str, str]:
        with self._lock:
            return {h: "".join(lines) for h, lines in self._lines.items()}

    def tail(self, n: int) -> str:
        with self._lock:
            out = []
            for lines in self._lines.values():
                out.extend(lines[-n:])
        return "".join(out)


def _pump(stream: Any, book: _LogBook, host: str, tag: str) -> None:
    try:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", errors="replace")
            if not line.endswith("\n"):
                line += "\n"
            book.add(host, f"{tag} {line}")
    except (OSError, ValueError):
        pass
    finally:
        try:
            stream.close()
        except OSError:
            pass


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            proc.send_signal(sig)
        except ProcessLookupError:
            pass


def _stop_processes(procs: Sequence[subprocess.Popen], grace: float) -> None:
    live = [p for p in procs if p.poll() is None]
    if not live:
        return
    for p in live:
        _signal_group(p, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(p.poll() is None for p in live):
        time.sleep(0.02)
    for p in live:
        _signal_group(p, signal.SIGKILL)
    for p in live:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


# --------------------------------------------------------------------------- throughput

_RECV_SCRIPT = r"""
import json, socket, sys, time
addr, limit, warmup = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((addr, 0))
srv.listen(1)
print(srv.getsockname()[1], flush=True)
srv.settimeout(limit)
conn, _ = srv.accept()
conn.settimeout(limit)
deadline = time.monotonic() + limit
buf = bytearray(1 << 20)
total = 0
first = last = mark_t = None
mark_b = 0
while time.monotonic() < deadline:
    n = conn.recv_into(buf)
    if not n:
        break
    now = time.monotonic()
    total += n
    last = now
    if first is None:
        first = now
    elif mark_t is None and now - first >= warmup:
        mark_t, mark_b = now, total
conn.close()
print(json.dumps({"bytes": total, "first": first, "last": last,
                  "mark_t": mark_t, "mark_b": mark_b}), flush=True)
"""

_SEND_SCRIPT = r"""
import socket, sys, time
addr, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
s = socket.create_connection((addr, port), timeout=10)
s.settimeout(max(10.0, seconds))
chunk = b"\0" * (256 * 1024)
deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    s.sendall(chunk)
s.shutdown(socket.SHUT_WR)
s.close()
"""


# --------------------------------------------------------------------------- the rack


class Rack:
    """An emulated rack of worker and CPU hosts behind one shaped switch.

    Use as a context manager; teardown runs on exit, on exceptions, on SIGINT/SIGTERM
    (while the rack is up) and at interpreter exit.
    """

    def __init__(
        self,
        n_workers: int,
        n_cpu_hosts: int,
        rate_mbit: Optional[float],
        delay_ms: float = 0,
        loss_pct: float = 0,
        prefix: str = "fpsr",
        racks: int = 1,
        uplink_mbit: Optional[float] = None,
    ) -> None:
        _validate_prefix(prefix)
        if not 1 <= racks <= 16:
            raise ValueError("racks must be in 1..16")
        if racks > 1 and (n_workers and n_workers < racks):
            raise ValueError(f"{racks} racks need at least {racks} worker hosts")
        if not 0 <= n_workers <= _MAX_HOSTS_PER_ROLE:
            raise ValueError(f"n_workers must be in 0..{_MAX_HOSTS_PER_ROLE}")
        if not 0 <= n_cpu_hosts <= _MAX_HOSTS_PER_ROLE:
            raise ValueError(f"n_cpu_hosts must be in 0..{_MAX_HOSTS_PER_ROLE}")
        if n_workers + n_cpu_hosts == 0:
            raise ValueError("a rack needs at least one host")
        if delay_ms < 0 or not 0 <= loss_pct <= 100:
            raise ValueError("delay_ms must be >= 0 and loss_pct in [0, 100]")
        self.n_workers = n_workers
        self.n_cpu_hosts = n_cpu_hosts
        self.rate_mbit = rate_mbit if rate_mbit and rate_mbit > 0 else None
        self.delay_ms = float(delay_ms)
        self.loss_pct = float(loss_pct)
        self.prefix = prefix
        self.switch_ns = f"{prefix}-sw"
        self.racks = racks
        self.uplink_mbit = uplink_mbit if uplink_mbit and uplink_mbit > 0 else None

        def rack_of(i: int, n: int) -> str:
            return f"r{i * racks // n}" if racks > 1 else ""

        hosts = [
            Host(
                f"w{i}",
                f"{prefix}-w{i}",
                f"{_WORKER_NET}{i + 1}",
                "worker",
                i,
                rack_of(i, n_workers),
            )
            for i in range(n_workers)
        ]
        hosts += [
            Host(f"c{j}", f"{prefix}-c{j}", f"{_CPU_NET}{j + 1}", "cpu", j, rack_of(j, n_cpu_hosts))
            for j in range(n_cpu_hosts)
        ]
        self.hosts: List[Host] = hosts
        self._by_name = {h.name: h for h in hosts}
        self._logs = _LogBook([h.name for h in hosts])
        self._lock = threading.RLock()
        self._procs: List[subprocess.Popen] = []
        self._proc_names: Dict[int, str] = {}  # pid -> "host" or "host/label"
        self._readers: List[threading.Thread] = []
        self._created_ns: List[str] = []
        self._up = False
        self._closing = False
        self._detached = False
        self._saved_handlers: Dict[int, Any] = {}
        self._pending_signal: Optional[Tuple[int, Any]] = None
        self.teardown_problems: List[str] = []

    # ----------------------------------------------------------------- lookups

    @property
    def workers(self) -> List[Host]:
        return [h for h in self.hosts if h.role == "worker"]

    @property
    def cpu_hosts(self) -> List[Host]:
        return [h for h in self.hosts if h.role == "cpu"]

    @property
    def is_up(self) -> bool:
        return self._up

    def host(self, ref: HostRef) -> Host:
        if isinstance(ref, Host):
            if self._by_name.get(ref.name) != ref:
                raise KeyError(f"host {ref.name} is not part of rack {self.prefix}")
            return ref
        try:
            return self._by_name[ref]
        except KeyError:
            raise KeyError(
                f"no host {ref!r} in rack {self.prefix} (hosts: {', '.join(self._by_name)})"
            ) from None

    def env_for(self, host: HostRef) -> Dict[str, str]:
        """A copy of os.environ plus FASTPS_HOST / FASTPS_HOSTNAME for this host."""
        h = self.host(host)
        env = dict(os.environ)
        env["FASTPS_HOST"] = h.addr
        env["FASTPS_HOSTNAME"] = h.name
        if h.rack:
            env["FASTPS_RACK"] = h.rack
        return env

    def switch_of(self, h: Host) -> str:
        """The namespace of the switch a host's link ends in."""
        return f"{self.prefix}-s{h.rack[1:]}" if h.rack else self.switch_ns

    # ----------------------------------------------------------------- lifecycle

    def __enter__(self) -> Rack:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> Rack:
        """Build the rack.  Refuses (StaleRackError) if objects with this prefix exist."""
        with self._lock:
            if self._up:
                raise RackError(f"rack {self.prefix} is already up")
            ok, why = is_supported()
            if not ok:
                raise RackError(f"cannot build a rack here: {why}")
            if self.delay_ms > 0 or self.loss_pct > 0:
                ok, why = netem_supported()
                if not ok:
                    raise RackError(f"cannot emulate delay/loss here: {why}")
            stale = find_stale(self.prefix)
            if stale:
                raise StaleRackError(self.prefix, stale)
            self._closing = False
            self._up = True
            self._install_handlers()
            atexit.register(self._atexit)
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def detach(self) -> None:
        """Leave the rack up after this process exits (used by ``cli up``).

        Removes the signal handlers and the atexit hook; spawned processes are not tracked
        any more.  Remove the rack later with ``cli down --prefix PREFIX``.
        """
        with self._lock:
            self._detached = True
            self._restore_handlers()
            atexit.unregister(self._atexit)

    def close(self) -> None:
        """Tear everything down.  Idempotent; never raises for cleanup failures."""
        with self._lock:
            if not self._up or self._closing or self._detached:
                return
            self._closing = True
        problems: List[str] = []
        try:
            _stop_processes(self._procs, grace=1.0)
            namespaces = [h.ns for h in self.hosts]
            namespaces += [
                f"{self.prefix}-s{k}" for k in range(self.racks if self.racks > 1 else 0)
            ]
            namespaces.append(self.switch_ns)
            for ns in namespaces:
                if ns in self._created_ns:
                    _kill_ns_processes(ns)
            for ns in namespaces:
                if ns in self._created_ns:
                    res = _run(["ip", "netns", "del", ns], check=False)
                    if res.returncode != 0:
                        problems.append(f"ip netns del {ns}: {res.stderr.strip()}")
            self._created_ns.clear()
            left = find_stale(self.prefix)
            if left:
                cleanup(self.prefix)
                left = find_stale(self.prefix)
                if left:
                    problems.append("left behind: " + ", ".join(left))
            for t in self._readers:
                t.join(timeout=2.0)
        except BaseException as exc:  # keep going: teardown must finish
            problems.append(f"teardown error: {exc!r}")
        finally:
            with self._lock:
                self._up = False
                self._closing = False
                self._restore_handlers()
                atexit.unregister(self._atexit)
            self.teardown_problems = problems
            if problems:
                print(
                    f"[rack {self.prefix}] teardown problems:\n  "
                    + "\n  ".join(problems)
                    + f"\n  fix with: python -m benchmarks.rack.cli down --prefix "
                    f"{self.prefix}",
                    file=sys.stderr,
                )
        pending, self._pending_signal = self._pending_signal, None
        if pending is not None:
            self._chain_signal(pending[0], None, pending[1])

    def _atexit(self) -> None:
        self.close()

    # ----------------------------------------------------------------- signals

    def _install_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            prev = signal.getsignal(sig)
            if prev is signal.SIG_IGN or prev is None:
                continue
            self._saved_handlers[sig] = prev
            signal.signal(sig, self._on_signal)

    def _restore_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, prev in list(self._saved_handlers.items()):
            if signal.getsignal(sig) == self._on_signal:
                signal.signal(sig, prev)
            del self._saved_handlers[sig]

    def _on_signal(self, signum: int, frame: Any) -> None:
        prev = self._saved_handlers.get(signum, signal.SIG_DFL)
        if self._closing:
            # Teardown is running (e.g. a second Ctrl-C): finish it, then deliver.
            self._pending_signal = (signum, prev)
            return
        self.close()
        self._chain_signal(signum, frame, prev)

    @staticmethod
    def _chain_signal(signum: int, frame: Any, prev: Any = signal.SIG_DFL) -> None:
        if callable(prev):
            prev(signum, frame)
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt
        elif prev == signal.SIG_DFL:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    # ----------------------------------------------------------------- building

    def _ns_add(self, ns: str) -> None:
        _run(["ip", "netns", "add", ns])
        self._created_ns.append(ns)

    def _build(self) -> None:
        sw = self.switch_ns
        self._ns_add(sw)
        _run(["ip", "-n", sw, "link", "set", "lo", "up"])
        _run(
            [
                "ip",
                "-n",
                sw,
                "link",
                "add",
                _BRIDGE,
                "type",
                "bridge",
                "stp_state",
                "0",
                "forward_delay",
                "0",
            ]
        )
        _run(["ip", "-n", sw, "link", "set", _BRIDGE, "up"])
        for k in range(self.racks if self.racks > 1 else 0):
            self._add_rack_switch(k)
        for h in self.hosts:
            sw = self.switch_of(h)
            self._ns_add(h.ns)
            # No IPv6: the only way out of a host is IPv4 on the rack subnet.
            _run(
                [
                    "ip",
                    "netns",
                    "exec",
                    h.ns,
                    "sysctl",
                    "-q",
                    "-w",
                    "net.ipv6.conf.all.disable_ipv6=1",
                    "net.ipv6.conf.default.disable_ipv6=1",
                ],
                check=False,
            )
            _run(["ip", "-n", h.ns, "link", "set", "lo", "up"])
            _run(
                [
                    "ip",
                    "link",
                    "add",
                    _HOST_IF,
                    "netns",
                    h.ns,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    h.name,
                    "netns",
                    sw,
                ]
            )
            _run(["ip", "-n", sw, "link", "set", h.name, "master", _BRIDGE])
            self._shape(h)
            _run(["ip", "-n", h.ns, "addr", "add", f"{h.addr}/{_PREFIX_LEN}", "dev", _HOST_IF])
            _run(["ip", "-n", sw, "link", "set", h.name, "up"])
            _run(["ip", "-n", h.ns, "link", "set", _HOST_IF, "up"])

    def _add_bridge(self, ns: str) -> None:
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        _run(
            [
                "ip",
                "-n",
                ns,
                "link",
                "add",
                _BRIDGE,
                "type",
                "bridge",
                "stp_state",
                "0",
                "forward_delay",
                "0",
            ]
        )
        _run(["ip", "-n", ns, "link", "set", _BRIDGE, "up"])

    def _add_rack_switch(self, k: int) -> None:
        """Rack k's switch and its uplink to the core, shaped both ways at uplink_mbit."""
        ns = f"{self.prefix}-s{k}"
        self._ns_add(ns)
        self._add_bridge(ns)
        core = f"r{k}"
        _run(
            [
                "ip",
                "link",
                "add",
                _UPLINK,
                "netns",
                ns,
                "type",
                "veth",
                "peer",
                "name",
                core,
                "netns",
                self.switch_ns,
            ]
        )
        _run(["ip", "-n", ns, "link", "set", _UPLINK, "master", _BRIDGE])
        _run(["ip", "-n", self.switch_ns, "link", "set", core, "master", _BRIDGE])
        if self.uplink_mbit is not None:
            self._shape_dev(ns, _UPLINK, self.uplink_mbit, [])
            self._shape_dev(self.switch_ns, core, self.uplink_mbit, [])
        _run(["ip", "-n", ns, "link", "set", _UPLINK, "up"])
        _run(["ip", "-n", self.switch_ns, "link", "set", core, "up"])

    def _shape_dev(self, ns: str, dev: str, mbit: float, extra: List[str]) -> None:
        """An HTB class at mbit on dev's egress, with extra (netem) or a FIFO under it."""
        tc = ["tc", "-n", ns]
        rate = _tc_rate(mbit)
        burst = str(_htb_burst_bytes(mbit))
        _run([*tc, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "1"])
        _run(
            [
                *tc,
                "class",
                "add",
                "dev",
                dev,
                "parent",
                "1:",
                "classid",
                "1:1",
                "htb",
                "rate",
                rate,
                "ceil",
                rate,
                "burst",
                burst,
                "cburst",
                burst,
            ]
        )
        leaf = ["netem", *extra] if extra else ["pfifo", "limit", "1000"]
        _run([*tc, "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", *leaf])

    def _shape(self, h: Host) -> None:
        netem: List[str] = []
        if self.delay_ms > 0:
            netem += ["delay", f"{self.delay_ms:g}ms"]
        if self.loss_pct > 0:
            netem += ["loss", f"{self.loss_pct:g}%"]
        if netem:
            netem += ["limit", "100000"]
        for ns, dev, extra in ((h.ns, _HOST_IF, netem), (self.switch_of(h), h.name, [])):
            tc = ["tc", "-n", ns]
            if self.rate_mbit is None:
                if extra:
                    _run([*tc, "qdisc", "add", "dev", dev, "root", "netem", *extra])
                continue
            rate = _tc_rate(self.rate_mbit)
            burst = str(_htb_burst_bytes(self.rate_mbit))
            _run([*tc, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "1"])
            _run(
                [
                    *tc,
                    "class",
                    "add",
                    "dev",
                    dev,
                    "parent",
                    "1:",
                    "classid",
                    "1:1",
                    "htb",
                    "rate",
                    rate,
                    "ceil",
                    rate,
                    "burst",
                    burst,
                    "cburst",
                    burst,
                ]
            )
            if extra:
                _run(
                    [
                        *tc,
                        "qdisc",
                        "add",
                        "dev",
                        dev,
                        "parent",
                        "1:1",
                        "handle",
                        "10:",
                        "netem",
                        *extra,
                    ]
                )
            else:
                _run(
                    [
                        *tc,
                        "qdisc",
                        "add",
                        "dev",
                        dev,
                        "parent",
                        "1:1",
                        "handle",
                        "10:",
                        "pfifo",
                        "limit",
                        "1000",
                    ]
                )

    def set_rate(self, host: HostRef, mbit: float) -> None:
        """Reshapes one host's link (both directions) to ``mbit``: a host with a slower
        link than the rest of the rack. Only for a rack built with a rate."""
        self._require_up()
        if self.rate_mbit is None:
            raise RackError(f"rack {self.prefix} has unshaped links: no rate to change")
        if not mbit > 0:
            raise ValueError(f"host rate must be > 0 Mbit/s, got {mbit!r}")
        h = self.host(host)
        rate, burst = _tc_rate(mbit), str(_htb_burst_bytes(mbit))
        for ns, dev in ((h.ns, _HOST_IF), (self.switch_of(h), h.name)):
            _run(
                [
                    *("tc", "-n", ns, "class", "change", "dev", dev, "parent", "1:"),
                    *("classid", "1:1", "htb", "rate", rate, "ceil", rate),
                    *("burst", burst, "cburst", burst),
                ]
            )

    # ----------------------------------------------------------------- processes

    def _require_up(self) -> None:
        if not self._up or self._closing:
            raise RackError(f"rack {self.prefix} is not up")

    def _popen(
        self,
        h: Host,
        argv: Sequence[str],
        env: Optional[Mapping[str, str]],
        cwd: Optional[str],
        stdout: Any,
    ) -> subprocess.Popen:
        with self._lock:
            self._require_up()
            proc = subprocess.Popen(
                ["ip", "netns", "exec", h.ns, *argv],
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                cwd=cwd,
                start_new_session=True,
            )
            self._procs.append(proc)
            return proc

    def spawn(
        self,
        host: HostRef,
        argv: Sequence[str],
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        label: Optional[str] = None,
    ) -> subprocess.Popen:
        """Start argv inside host's namespace; its stdout+stderr go to ``logs()[host]``.

        The environment is ``env_for(host)`` updated with ``env`` (plus
        PYTHONUNBUFFERED=1 unless set), so FASTPS_HOST/FASTPS_HOSTNAME are always there.
        Each log line is prefixed ``[host]`` or ``[host/label]``.  The process runs in
        its own session; teardown kills it and anything else left in the namespace.
        """
        h = self.host(host)
        full_env = self.env_for(h)
        if env is not None:
            full_env.update(env)
        full_env.setdefault("PYTHONUNBUFFERED", "1")
        proc = self._popen(h, argv, full_env, cwd, subprocess.PIPE)
        name = f"{h.name}/{label}" if label else h.name
        tag = f"[{name}]"
        reader = threading.Thread(
            target=_pump,
            args=(proc.stdout, self._logs, h.name, tag),
            name=f"rack-log-{h.name}-{proc.pid}",
            daemon=True,
        )
        reader.start()
        with self._lock:
            self._readers.append(reader)
            self._proc_names[proc.pid] = name
        return proc

    def logs(self) -> Dict[str, str]:
        """Collected output of spawned processes, host name -> text (every host present)."""
        return self._logs.text()

    def run_all(
        self,
        specs: Sequence[Union[subprocess.Popen, ProcSpec]],
        timeout: float,
        check: bool = True,
        fail_grace: float = 2.0,
    ) -> List[Optional[int]]:
        """Wait for processes (spawning any ProcSpec first) with a hard time bound.

        On timeout every listed process is killed and RackTimeoutError is raised with the
        collected output.  With check=True, the first non-zero exit gives the others
        ``fail_grace`` seconds to finish, then kills them and raises RackProcessError.
        Returns the exit codes in order.
        """
        procs: List[subprocess.Popen] = []
        names: List[str] = []
        try:
            for i, spec in enumerate(specs):
                if isinstance(spec, ProcSpec):
                    proc = self.spawn(spec.host, spec.argv, spec.env, spec.cwd, spec.label)
                else:
                    proc = spec
                procs.append(proc)
                names.append(f"{i}:{self._proc_names.get(proc.pid, f'pid{proc.pid}')}")
        except BaseException:
            _stop_processes(procs, grace=0.5)
            raise
        deadline = time.monotonic() + timeout
        failed_at: Optional[float] = None
        try:
            while True:
                codes = [p.poll() for p in procs]
                if all(c is not None for c in codes):
                    break
                now = time.monotonic()
                if check and failed_at is None and any(c not in (None, 0) for c in codes):
                    failed_at = now
                if failed_at is not None and now - failed_at >= fail_grace:
                    break
                if now >= deadline:
                    break
                time.sleep(0.02)
        except BaseException:
            _stop_processes(procs, grace=0.5)
            raise
        codes = [p.poll() for p in procs]
        timed_out = any(c is None for c in codes) and failed_at is None
        _stop_processes(procs, grace=0.5)
        self._join_readers(1.0)
        by_name = dict(zip(names, codes))
        if timed_out:
            raise RackTimeoutError(
                f"rack {self.prefix}: processes still running after {timeout}s, killed: "
                f"{[n for n, c in by_name.items() if c is None]}\n"
                f"--- last output ---\n{self._logs.tail(60)}",
                by_name,
                self.logs(),
            )
        if check and any(c not in (None, 0) for c in codes):
            raise RackProcessError(
                f"rack {self.prefix}: process failure, exit codes {by_name} "
                f"(None = killed after another failed)\n"
                f"--- last output ---\n{self._logs.tail(60)}",
                by_name,
                self.logs(),
            )
        return codes

    def _join_readers(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self._lock:
            readers = list(self._readers)
        for t in readers:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        with self._lock:
            self._readers = [t for t in self._readers if t.is_alive()]

    # ----------------------------------------------------------------- measurement

    def measure_throughput(
        self,
        src_host: HostRef,
        dst_host: HostRef,
        seconds: float = 2.0,
        warmup: Optional[float] = None,
    ) -> float:
        """One TCP stream src -> dst for ``seconds``; returns received goodput in Mbit/s.

        The first ``warmup`` seconds (default: min(0.5, seconds/4)) are not counted, so the
        figure excludes slow start and the shaper's initial burst.
        """
        src, dst = self.host(src_host), self.host(dst_host)
        if src == dst:
            raise ValueError("src and dst must be different hosts")
        if not 0 < seconds <= 120:
            raise ValueError("seconds must be in (0, 120]")
        if warmup is None:
            warmup = min(0.5, seconds / 4)
        limit = seconds + 15.0
        recv = self._popen(
            dst,
            [sys.executable, "-c", _RECV_SCRIPT, dst.addr, f"{limit}", f"{warmup}"],
            None,
            None,
            subprocess.PIPE,
        )
        send: Optional[subprocess.Popen] = None
        try:
            assert recv.stdout is not None
            port_line = _readline_bounded(recv, 10.0)
            if not port_line.strip().isdigit():
                raise RackError(f"throughput receiver did not start: {port_line!r}")
            send = self._popen(
                src,
                [sys.executable, "-c", _SEND_SCRIPT, dst.addr, port_line.strip(), f"{seconds}"],
                None,
                None,
                subprocess.PIPE,
            )
            try:
                s_out, _ = send.communicate(timeout=limit)
                r_out, _ = recv.communicate(timeout=limit)
            except subprocess.TimeoutExpired as exc:
                raise RackError(f"throughput measurement {src.name}->{dst.name} timed out") from exc
            if send.returncode != 0 or recv.returncode != 0:
                raise RackError(
                    f"throughput measurement {src.name}->{dst.name} failed: sender "
                    f"rc={send.returncode} {s_out!r}, receiver rc={recv.returncode} {r_out!r}"
                )
            stats = json.loads(r_out.decode().strip().splitlines()[-1])
        finally:
            _stop_processes([p for p in (send, recv) if p is not None], grace=0.5)
        if stats["mark_t"] is None or stats["last"] <= stats["mark_t"]:
            raise RackError(
                f"throughput measurement {src.name}->{dst.name}: too little data "
                f"({stats['bytes']} bytes)"
            )
        bits = (stats["bytes"] - stats["mark_b"]) * 8
        return bits / (stats["last"] - stats["mark_t"]) / 1e6


def _readline_bounded(proc: subprocess.Popen, timeout: float) -> str:
    """Read one line from proc.stdout, giving up after timeout seconds."""
    result: List[bytes] = []

    def reader() -> None:
        assert proc.stdout is not None
        result.append(proc.stdout.readline())

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        _stop_processes([proc], grace=0.2)
        t.join(2.0)
        raise RackError(f"no output within {timeout}s from {proc.args!r}")
    return result[0].decode(errors="replace") if result else ""
