"""Host lists and process placement for jobs that span machines.

``fastpsrun -H a:4,b:4`` (Horovod's syntax) or ``--hostfile FILE`` (Horovod's ``host:slots``
lines or MPI's ``host slots=N`` lines) name the machines and how many workers each takes.
:func:`place` turns that into one host per worker rank and one per server id, as BytePS
places them: workers fill the slots in the order given; by default one server runs on every
host that got a worker (colocated) plus one on every CPU-only host of ``--server-hosts``.
``--num-servers K`` instead spreads exactly K servers round-robin over the server hosts (or,
without ``--server-hosts``, over the worker hosts). Placement is a pure function of its
inputs, so tests and the SLURM path share it.
"""

from __future__ import annotations

import getpass
import ipaddress
import re
import socket
import threading
from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence, Set, Tuple

from fastps.control.netif import local_addresses
from fastps.errors import FastPSError

__all__ = [
    "HostSlots",
    "Placement",
    "parse_host_list",
    "parse_hostfile",
    "parse_hostfile_text",
    "parse_server_hosts",
    "place",
    "host_label",
    "split_user",
    "is_local_host",
]

# A host name, user@host, an IPv4 address or a bracketed IPv6 address.
_NAME = r"(?:[A-Za-z0-9_.\-]+@)?(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]+)"
_ITEM_RE = re.compile(rf"^({_NAME})(?::(\S+))?$")
_MPI_LINE_RE = re.compile(rf"^({_NAME})((?:\s+\S+)*)$")


@dataclass(frozen=True)
class HostSlots:
    """One machine of a host list and how many workers it may take."""

    name: str  # as ssh reaches it: "node1", "alice@node1", "10.0.0.5", "[fe80::1]"
    slots: int


@dataclass(frozen=True)
class Placement:
    """Where every process of a job runs: ``workers[rank]`` and ``servers[id]`` are host
    names from the host list, ``hosts`` every host used, in host-list order."""

    workers: Tuple[str, ...]
    servers: Tuple[str, ...]
    hosts: Tuple[str, ...]

    def describe(self) -> str:
        """``node1: workers 0-3, server 0; node2: ...`` for the launcher's first line."""
        parts = []
        for host in self.hosts:
            ranks = [r for r, h in enumerate(self.workers) if h == host]
            sids = [s for s, h in enumerate(self.servers) if h == host]
            what = []
            if ranks:
                what.append(("worker " if len(ranks) == 1 else "workers ") + _ranges(ranks))
            if sids:
                what.append(("server " if len(sids) == 1 else "servers ") + _ranges(sids))
            parts.append(f"{host_label(host)}: {', '.join(what)}")
        return "; ".join(parts)


def _ranges(values: Sequence[int]) -> str:
    out: List[str] = []
    start = prev = values[0]
    for v in [*values[1:], None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if v is not None:
            start = prev = v
    return ",".join(out)


def split_user(name: str) -> Tuple[Optional[str], str]:
    """``alice@node1`` -> (``alice``, ``node1``); ``node1`` -> (None, ``node1``)."""
    if "@" in name:
        user, host = name.split("@", 1)
        return user, host
    return None, name


def host_label(name: str) -> str:
    """The host part of a host-list entry, as output prefixes show it."""
    host = split_user(name)[1]
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def _slots(text: str, where: str, name: str) -> int:
    try:
        slots = int(text)
    except ValueError:
        raise FastPSError(f"{where}: host {name!r} has slots {text!r}, expected a number") from None
    if slots < 1:
        raise FastPSError(f"{where}: host {name!r} has {slots} slots, expected >= 1")
    return slots


def _check_unique(hosts: Sequence[HostSlots], where: str) -> None:
    seen = set()
    for h in hosts:
        if h.name in seen:
            raise FastPSError(
                f"{where}: host {h.name!r} is listed twice; give it once with all its slots"
            )
        seen.add(h.name)


def parse_host_list(text: str, where: str = "-H") -> List[HostSlots]:
    """``a:4,b:4`` -> [HostSlots("a", 4), HostSlots("b", 4)]; a host without ``:N`` has one
    slot."""
    hosts = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            raise FastPSError(f"{where} {text!r}: empty host entry")
        m = _ITEM_RE.match(item)
        if m is None:
            raise FastPSError(f"{where}: {item!r} is not host or host:slots")
        name, slots = m.group(1), m.group(2)
        hosts.append(HostSlots(name, _slots(slots, where, name) if slots is not None else 1))
    _check_unique(hosts, where)
    return hosts


def parse_hostfile_text(text: str, where: str) -> List[HostSlots]:
    """Lines of ``host:slots`` (Horovod) or ``host slots=N [max_slots=M]`` (Open MPI);
    ``#`` starts a comment, blank lines are skipped, a bare ``host`` has one slot."""
    hosts = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        at = f"{where} line {lineno}"
        m = _ITEM_RE.match(line)
        if m is not None:
            name, slots = m.group(1), m.group(2)
            hosts.append(HostSlots(name, _slots(slots, at, name) if slots is not None else 1))
            continue
        m = _MPI_LINE_RE.match(line)
        if m is None:
            raise FastPSError(f"{at}: {raw.strip()!r} is not 'host:slots' or 'host slots=N'")
        name, slots_n = m.group(1), 1
        for field in m.group(2).split():
            key, _, value = field.partition("=")
            if key in ("slots", "slot"):
                slots_n = _slots(value, at, name)
            elif key in ("max_slots", "max-slots"):
                continue  # an upper bound for oversubscription; fastpsrun never oversubscribes
            else:
                raise FastPSError(
                    f"{at}: unknown field {field!r} for host {name!r} (expected slots=N)"
                )
        hosts.append(HostSlots(name, slots_n))
    if not hosts:
        raise FastPSError(f"{where}: no hosts in it")
    _check_unique(hosts, where)
    return hosts


def parse_hostfile(path: str) -> List[HostSlots]:
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise FastPSError(f"--hostfile {path}: {exc.strerror or exc}") from None
    return parse_hostfile_text(text, f"--hostfile {path}")


def parse_server_hosts(text: str) -> List[HostSlots]:
    """``--server-hosts c1,c2:2``: CPU-only hosts and how many servers each runs (1)."""
    return parse_host_list(text, "--server-hosts")


def place(
    hosts: Sequence[HostSlots],
    num_workers: int,
    server_hosts: Iterable[HostSlots] = (),
    num_servers: Optional[int] = None,
) -> Placement:
    """Workers fill ``hosts``' slots in order; servers as described in the module doc."""
    if num_workers < 1:
        raise FastPSError(f"-np must be >= 1, got {num_workers}")
    if not hosts:
        raise FastPSError("no hosts to place the job on")
    total = sum(h.slots for h in hosts)
    if num_workers > total:
        listed = ", ".join(f"{h.name}:{h.slots}" for h in hosts)
        raise FastPSError(
            f"-np {num_workers} needs {num_workers} slots but the host list has {total} ({listed})"
        )
    workers: List[str] = []
    for h in hosts:
        take = min(h.slots, num_workers - len(workers))
        workers += [h.name] * take
        if len(workers) == num_workers:
            break
    worker_hosts = list(dict.fromkeys(workers))
    extra = list(server_hosts)
    _check_unique(extra, "--server-hosts")
    servers: List[str] = []
    if num_servers is None:
        servers = list(worker_hosts)
        for h in extra:
            # A server host that also runs workers already has its colocated server; its
            # count beyond that adds more.
            have = 1 if h.name in worker_hosts else 0
            servers += [h.name] * max(0, h.slots - have)
    else:
        if num_servers < 0:
            raise FastPSError(f"--num-servers must be >= 0, got {num_servers}")
        pool = [h.name for h in extra] if extra else worker_hosts
        servers = [pool[i % len(pool)] for i in range(num_servers)]
    order = [h.name for h in hosts] + [h.name for h in extra]
    used = set(workers) | set(servers)
    return Placement(
        tuple(workers), tuple(servers), tuple(n for n in dict.fromkeys(order) if n in used)
    )


def _resolve(name: str, timeout: float) -> Set[str]:
    """Addresses of ``name``, bounded in time (a slow resolver must not stall the launch)."""
    found: Set[str] = set()

    def run() -> None:
        try:
            for info in socket.getaddrinfo(name, None, type=socket.SOCK_STREAM):
                found.add(str(info[4][0]))
        except (OSError, UnicodeError):
            pass

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    return set(found) if not t.is_alive() else set()


def is_local_host(name: str, resolve_timeout: float = 3.0) -> bool:
    """True when a host-list entry names this machine (as this user): such processes start
    directly, without ssh. ``alice@thishost`` is remote unless we are alice."""
    user, _ = split_user(name)
    if user is not None and user != getpass.getuser():
        return False
    host = host_label(name)
    this = socket.gethostname()
    if host.lower() == "localhost" or host in (this, this.split(".")[0]):
        return True
    mine = local_addresses()
    try:
        return str(ipaddress.ip_address(host)) in mine
    except ValueError:
        pass
    return bool(_resolve(host, resolve_timeout) & mine)
