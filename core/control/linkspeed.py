"""How fast this host can send: the link rate pacing splits among the job's flows.

``FASTPS_LINK_MBIT=auto`` (the default) asks this module. The rate is that of the network
interface holding the address this process advertises to the job, the smaller of:

- the interface's line rate, ``/sys/class/net/<if>/speed`` (Mbit/s; virtual NICs that do
  not know theirs report -1 and are skipped);
- an egress shaper on it (``tc``: a tbf or netem rate on the root qdisc, or the ceiling
  of the htb class unclassified traffic goes to), as on an emulated or a rate-limited link.

Nothing found (loopback, an unknown address, a NIC that does not say) means no pacing.
Pacing at a rate above the real one is harmless (the caps never bind); one below it
would cap throughput, which is why only these two sources are trusted.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import re
import shutil
import socket
import struct
import subprocess
from typing import List, Optional, Tuple

_SIOCGIFADDR = 0x8915
_UNITS = {  # tc prints bits per second with these suffixes; "bps" suffixes are bytes
    "bit": 1.0,
    "kbit": 1e3,
    "mbit": 1e6,
    "gbit": 1e9,
    "tbit": 1e12,
    "bps": 8.0,
    "kbps": 8e3,
    "mbps": 8e6,
    "gbps": 8e9,
    "tbps": 8e12,
}
_RATE = re.compile(r"\b(rate|ceil)\s+([0-9.]+)([a-zA-Z]*)")
_DEFAULT = re.compile(r"\bdefault\s+(?:0x)?([0-9a-fA-F]+)")


def _ipv4_of(ifname: str) -> Optional[str]:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            req = struct.pack("256s", ifname.encode()[:15])
            res = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, req)
        except OSError:
            return None
    return socket.inet_ntoa(res[20:24])


def _ipv6_interfaces(addr: ipaddress.IPv6Address) -> List[str]:
    try:
        with open("/proc/net/if_inet6") as f:
            rows = [line.split() for line in f]
    except OSError:
        return []
    return [r[5] for r in rows if len(r) >= 6 and r[0] == addr.exploded.replace(":", "")]


def interface_of(addr: str) -> Optional[str]:
    """The name of this host's interface that holds ``addr``, if one does."""
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        try:
            ip = ipaddress.ip_address(socket.gethostbyname(addr))
        except (OSError, ValueError):
            return None
    if isinstance(ip, ipaddress.IPv6Address):
        found = _ipv6_interfaces(ip)
        return found[0] if found else None
    for _, name in socket.if_nameindex():
        if _ipv4_of(name) == str(ip):
            return name
    return None


def _sysfs_number(ifname: str, attribute: str) -> Optional[float]:
    """/sys/class/net/<ifname>/<attribute> as a number, or None when it cannot be read."""
    try:
        with open(f"/sys/class/net/{ifname}/{attribute}") as f:
            return float(f.read().strip())
    except (OSError, ValueError):
        return None


def sysfs_speed_mbit(ifname: str) -> Optional[float]:
    """The line rate the driver reports, or None when it does not know it."""
    speed = _sysfs_number(ifname, "speed")
    return speed if speed is not None and speed > 0 else None


def _to_mbit(number: str, unit: str) -> Optional[float]:
    factor = _UNITS.get(unit.lower() or "bit")
    if factor is None:
        return None
    try:
        return float(number) * factor / 1e6
    except ValueError:
        return None


def parse_tc_rate(qdiscs: str, classes: str) -> Optional[float]:
    """The egress cap (Mbit/s) described by ``tc qdisc show`` and ``tc class show`` text."""
    caps: List[float] = []
    default_class: Optional[str] = None
    for line in qdiscs.splitlines():
        if " root " not in f" {line} ":
            continue
        if line.startswith("qdisc htb"):
            m = _DEFAULT.search(line)
            handle = line.split()[2].rstrip(":")
            if m:
                default_class = f"{handle}:{int(m.group(1), 16):x}"
        for _, number, unit in _RATE.findall(line):  # tbf, netem rate on the root qdisc
            mbit = _to_mbit(number, unit)
            if mbit:
                caps.append(mbit)
    if default_class is not None:
        for line in classes.splitlines():
            parts = line.split()
            if len(parts) < 3 or parts[:2] != ["class", "htb"] or parts[2] != default_class:
                continue
            found = {kind: _to_mbit(n, u) for kind, n, u in _RATE.findall(line)}
            cap = found.get("ceil") or found.get("rate")
            if cap:
                caps.append(cap)
    return min(caps) if caps else None


def tc_rate_mbit(ifname: str) -> Optional[float]:
    """The rate an egress shaper on ``ifname`` allows, or None (no shaper, no ``tc``)."""
    tc = shutil.which("tc") or next(
        (p for p in ("/usr/sbin/tc", "/sbin/tc") if os.path.exists(p)), None
    )
    if tc is None:
        return None
    out = []
    for what in ("qdisc", "class"):
        try:
            p = subprocess.run(
                [tc, what, "show", "dev", ifname], capture_output=True, text=True, timeout=5
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        out.append(p.stdout if p.returncode == 0 else "")
    return parse_tc_rate(out[0], out[1])


def detect_link_mbit(addr: str) -> Tuple[float, str]:
    """(Mbit/s, how it was found) for the link holding ``addr``; 0 when unknown."""
    try:
        if ipaddress.ip_address(addr).is_loopback:
            return 0.0, f"{addr} is loopback"
    except ValueError:
        pass
    ifname = interface_of(addr)
    if ifname is None:
        return 0.0, f"no interface of this host holds {addr}"
    found = []
    speed = sysfs_speed_mbit(ifname)
    if speed:
        found.append((speed, f"{ifname} line rate"))
    shaped = tc_rate_mbit(ifname)
    if shaped:
        found.append((shaped, f"tc shaper on {ifname}"))
    if not found:
        return 0.0, f"{ifname} does not report its speed"
    mbit, how = min(found)
    return mbit, how


# Per frame on an Ethernet link: IPv4 and TCP headers with timestamps (52 bytes) inside the
# MTU, the Ethernet header (14) outside it, as a shaper counts a frame (tc: the frame without
# preamble, FCS and gap). IPv6 or a real wire's preamble carry less payload per byte: a cap
# computed from this fraction is then a little above the payload rate, which is harmless.
_TCP_IP_HEADERS = 52
_ETHERNET_HEADER = 14
DEFAULT_MTU = 1500


def payload_fraction_for_mtu(mtu: int) -> float:
    """TCP payload bytes per byte a link carries, in full frames of ``mtu`` bytes."""
    if mtu <= _TCP_IP_HEADERS:
        raise ValueError(f"an MTU of {mtu} bytes leaves no room for a TCP segment")
    return (mtu - _TCP_IP_HEADERS) / (mtu + _ETHERNET_HEADER)


def interface_mtu(ifname: str) -> Optional[int]:
    """The interface's MTU, or None when it cannot be read."""
    mtu = _sysfs_number(ifname, "mtu")
    return int(mtu) if mtu is not None and mtu > _TCP_IP_HEADERS else None


def payload_fraction(addr: str) -> float:
    """payload_fraction_for_mtu for the interface holding ``addr`` (MTU 1500 when unknown):
    the pacing caps are counted in payload bytes, link rates in frames."""
    ifname = interface_of(addr)
    mtu = interface_mtu(ifname) if ifname is not None else None
    return payload_fraction_for_mtu(mtu or DEFAULT_MTU)


def link_mbit_for(stated: Optional[float], addr: str) -> Tuple[float, str]:
    """The rate pacing uses: the stated one (FASTPS_LINK_MBIT), else the detected one.

    A detected rate is this host's only; that is enough, because a process paces only the
    flows leaving its own host (a worker its pushes, a server its answers).
    """
    if stated is not None:
        return stated, "FASTPS_LINK_MBIT" if stated > 0 else "pacing off (FASTPS_LINK_MBIT=0)"
    return detect_link_mbit(addr)
