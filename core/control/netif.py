"""This machine's network interfaces and addresses (Linux, standard library only).

``--network-interface IFACE`` / ``FASTPS_IFACE`` makes every process advertise the IPv4
address of that interface on its own machine, and the launcher needs to know which host-list
entries name this machine (those start without ssh).
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
from typing import Set

from fastps.errors import FastPSError

__all__ = ["interface_address", "local_addresses"]

_SIOCGIFADDR = 0x8915


def _ipv4_of(sock: socket.socket, name: str) -> str:
    req = struct.pack("256s", name.encode()[:15])
    res = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, req)
    return socket.inet_ntoa(res[20:24])


def interface_address(name: str, var: str = "FASTPS_IFACE") -> str:
    """The IPv4 address of interface ``name``, or an error listing the interfaces there are."""
    names = [n for _, n in socket.if_nameindex()]
    if name not in names:
        raise FastPSError(
            f"{var}={name}: no such network interface on {socket.gethostname()} "
            f"(interfaces: {', '.join(names) or 'none'})"
        )
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            return _ipv4_of(s, name)
        except OSError:
            raise FastPSError(
                f"{var}={name}: interface {name} on {socket.gethostname()} has no IPv4 address"
            ) from None


def local_addresses() -> Set[str]:
    """Every IPv4 and IPv6 address of this machine's interfaces, loopback included."""
    out = {"127.0.0.1", "::1"}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                out.add(_ipv4_of(s, name))
            except OSError:
                pass
    try:
        with open("/proc/net/if_inet6", encoding="ascii") as fh:
            for line in fh:
                hexaddr = line.split()[0]
                out.add(str(ipaddress.IPv6Address(bytes.fromhex(hexaddr))))
    except (OSError, ValueError, IndexError):
        pass
    return out
