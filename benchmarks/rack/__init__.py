"""Emulated rack: network namespaces + a bridge + tc shaping, for fastps benchmarks/tests."""

from .rack import (
    SUBNET,
    Host,
    ProcSpec,
    Rack,
    RackError,
    RackProcessError,
    RackTimeoutError,
    StaleRackError,
    cleanup,
    find_stale,
    is_supported,
    netem_supported,
)

__all__ = [
    "SUBNET",
    "Host",
    "ProcSpec",
    "Rack",
    "RackError",
    "RackProcessError",
    "RackTimeoutError",
    "StaleRackError",
    "cleanup",
    "find_stale",
    "is_supported",
    "netem_supported",
]
