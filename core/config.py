"""Configuration of a fastps process, read from ``FASTPS_*`` environment variables.

This module is the only reader of ``FASTPS_*`` variables (``tests/unit/test_config_reads.py``
holds the rest of the package to that), and each variable has its one default here.
:meth:`Config.from_env` reads them all at start-up. Settings asked for before a whole
``Config`` can be built, or read again when an object is made (a plugin's optimizer asks
``FASTPS_SFB`` each time), have a small function of their own below (:func:`sfb_mode`,
:func:`cross_barrier`, :func:`elastic_timeout`, ...), which ``from_env`` uses too.

Every variable is documented, with its default, in ``docs/reference/configuration.md``. A value that
cannot be parsed or is out of range raises :class:`~fastps.errors.ConfigError` (a
FastPSError) naming the variable and the value, so a typo fails at start-up instead of deep
inside a job.

Rank and world size fall back to the variables of other launchers when the ``FASTPS_``
ones are unset, in this order: torchrun (``RANK``/``WORLD_SIZE``), Open MPI
(``OMPI_COMM_WORLD_RANK``/``OMPI_COMM_WORLD_SIZE``) and SLURM (``SLURM_PROCID``/
``SLURM_NTASKS``).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import os
import re
import socket
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence, Tuple, TypeVar

from fastps.control.netif import interface_address
from fastps.errors import ConfigError, FastPSError

__all__ = [
    "Config",
    "ROLES",
    "SFB_MODES",
    "cross_barrier",
    "elastic_addr",
    "elastic_defer_join",
    "elastic_discovery_interval",
    "elastic_drain_timeout",
    "elastic_id",
    "elastic_inplace",
    "elastic_job_id",
    "elastic_timeout",
    "gc_freeze",
    "host_bandwidths",
    "job_token",
    "launched_by",
    "link_mbit",
    "network_interface",
    "rack_uplinks",
    "sfb_mode",
    "stated_host",
    "stated_job_id",
    "stated_role",
    "topology_spec",
    "parse_addr",
    "format_addr",
    "parse_size",
    "is_loopback_host",
    "default_advertised_host",
    "validate_job_id",
]

ROLES = ("worker", "server", "scheduler")
DEFAULT_ROLE = "worker"

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

# Parts and the per-server credit. On one host (shared memory) the work is memory-bound:
# a 1 MiB part is still in cache when the next stage (the owner's sum, the copies out)
# reads it, 10-15% faster than 4 MiB parts with 2-4 workers (docs/performance.md §2).
# Across a network a part is answered only once every worker's copy crossed a link, so
# small parts start the results flowing sooner (docs/performance.md, rack sweep). In training
# with cross-barrier updates a part also sets how long the next forward pass's first layers
# wait behind parts already on the wire: ResNet-50 on the emulated rack, network-bound
# (compute = half the bound), k = 2: 512 KiB parts 0.70 of the ideal, 256 KiB 0.86-0.87,
# 128 KiB 0.90, 64 KiB 0.91; push_pull alone is the same at 128 and 256 KiB (97-98% of
# the bound at every k; docs/performance.md §9). None: chosen at init.
LOCAL_PARTITION_BYTES = 1 * MiB
NETWORK_PARTITION_BYTES = 128 * KiB
# Under the rack hierarchy a relayed part is stored and forwarded four times (push, rack sum
# up, owner's answer, fan-out) before its pushers hear back, each hop a whole part: smaller
# parts keep the stages overlapped. 2 racks x 4 hosts at 50 Mbit/s: 256 KiB parts reached
# 0.87 of the bound, 128 KiB 0.92, 64 KiB 0.94, 32 KiB 0.96 (docs/performance.md §20).
RACK_PARTITION_BYTES = 64 * KiB
# Across a network the credit (unwritten bytes per server handed to the transport) is at
# least this (4 of the default parts): the push thread then wakes once per half a credit
# written and hands the transport several parts at once, instead of one futex wake-up and
# two context switches per part. ResNet-50's gradient set on the rack: 5-15% more megabytes
# per CPU-second of the job at the same time; training cells the same within the
# run-to-run spread (docs/results/comm-cpu-2026-11-30.md).
NETWORK_CREDIT_BYTES = 512 * KiB
DEFAULT_WINDOW_BYTES = 1 * MiB  # unanswered bytes more urgent than the next part, per server
# A nudge moves a part ahead only once it has waited this long in the worker's queue (0: at
# once). The simulator (ResNet-50, 30% jitter) favoured 10 ms at the balanced point (0.926 of
# the ideal against 0.890 at once); on the rack 10 ms lost there instead (0.889 / 0.891
# against 0.924 / 0.919 at once, paired runs, docs/performance.md §9), so at once it stays.
DEFAULT_NUDGE_MIN_WAIT = 0.0
# A part half its pushers have pushed for this long is nudged at a missing pusher when that
# pusher pushes another part to the same server (it skipped it: its order diverged); a
# pusher just behind in the same order pushes it sooner (docs/design/architecture.md).
DEFAULT_NUDGE_OVERDUE = 0.05
# Tensor fusion (csrc/worker/fusion.h): gradients smaller than this travel packed with their
# neighbours in the priority order, in buckets of at most this size (and at most one part),
# so a model of many small tensors costs a few parts instead of one per tensor
# (docs/performance.md, "Tensor fusion"). 0: off.
DEFAULT_FUSION_THRESHOLD = 256 * KiB
DEFAULT_NOTSENT_LOWAT = 128 * KiB  # unsent bytes the kernel may hold per connection
# Pacing splits a host's link as if all its flows sent at once, which holds while a worker
# has a large backlog (a whole gradient set in flight). A short burst (one small bucket)
# runs alone in its phase: its pushes, then the servers' answers. Paced at their share, each
# phase used half the link (digits and the CIFAR-like task at 100 Mbit/s: 1.3-1.4x slower
# steps than unpaced). Below this many bytes still to send, a worker's pushes go at the host
# link's rate instead, and until a backlog first reaches it the connections are not paced at
# all: a socket Linux paces once stays paced, below any cap, at its own estimate of the rate
# (docs/results/pacing-burst-2026-11-30.md). 0: always paced.
DEFAULT_PACING_BURST_BYTES = 1 * MiB
DEFAULT_SHM_BYTES = 256 << 20  # per worker; pages are only used while parts are in flight
MAX_PARTITION_BYTES = 256 * MiB  # kMaxPartBytes in csrc/transport/wire.h: larger frames are refused
DEFAULT_CONNS_PER_SERVER = 1
# Closed quorum rounds a server keeps per part for late pushers (docs/guide/async.md).
DEFAULT_QUORUM_HISTORY = 8
MODES = ("sync", "async")
DEFAULT_ENGINE_THREADS = 2  # summing threads per server on a host with more than 2 cores
DEFAULT_IO_THREADS = 1  # network threads per server


def default_engine_threads(cores: Optional[int] = None) -> int:
    """Summing threads per server when ``FASTPS_ENGINE_THREADS`` is unset.

    0 (each part summed on the I/O thread that received it) on a host with at most 2 usable
    cores: a 128 KiB part sums in less time than waking another thread for it takes, and on
    2 cores that thread competes with the network stack. The emulated rack (2 cores for 8
    hosts, ResNet-50 at ratio 1/2, k = 4) measured 0.867-0.893 of the ideal against
    0.824-0.891 with 2 threads (docs/performance.md, section 9). More cores: 2 threads.
    """
    if cores is None:
        cores = len(os.sched_getaffinity(0))
    return 0 if cores <= 2 else DEFAULT_ENGINE_THREADS


DEFAULT_TIMEOUT = 120.0
DEFAULT_HANDSHAKE_TIMEOUT = 5.0  # for a new connection to authenticate (servers, scheduler)
# Handshakes a server runs side by side; past it the oldest is turned away as busy (and the
# worker retries), so no number of silent peers delays a legitimate one (docs/design/hardening.md).
DEFAULT_MAX_PENDING_HANDSHAKES = 64
DEFAULT_OP_TIMEOUT = 300.0
DEFAULT_HEARTBEAT_INTERVAL = 1.0
DEFAULT_HEARTBEAT_TIMEOUT = 10.0
DEFAULT_LOG_LEVEL = "WARNING"
# The standalone scheduler (python -m fastps.scheduler) logs who registered and what it
# waits for unless FASTPS_LOG_LEVEL says otherwise (Config.scheduler_log_level).
DEFAULT_SCHEDULER_LOG_LEVEL = "INFO"
# Timeline events each recording thread's ring holds between drains (32 bytes each; the
# recorder drains every 0.2 s, so 256 Ki events absorb ~1.3 M parts/s per thread).
DEFAULT_TIMELINE_EVENTS = 256 * 1024
DEFAULT_STALL_WARNING = 60.0  # s a tensor may wait for ranks that did not submit it
# Sufficient-factor broadcasting (FASTPS_SFB; fastps.collectives.sfb, docs/guide/sfb.md).
SFB_MODES = ("off", "auto", "on")
DEFAULT_SFB = "off"
# Elastic mode (docs/guide/elastic.md): how long a worker's rendezvous waits (Horovod's default),
# and how often fastpsrun's driver runs the host discovery script (at least every
# MIN_DISCOVERY_INTERVAL s: the script is a process start, the CPU must not spin on it).
DEFAULT_ELASTIC_TIMEOUT = 600.0
DISCOVERY_INTERVAL = 1.0
MIN_DISCOVERY_INTERVAL = 0.05
# How long a worker whose host left the discovery output may take to reach its next commit
# (it leaves there, without a rollback of the others) before it is stopped (0: at once).
DEFAULT_ELASTIC_DRAIN_TIMEOUT = 60.0

# Fallback variables, in order of preference, when the FASTPS_ one is unset.
# Open MPI's before SLURM's: the ranks mpirun starts inside a batch script also inherit the
# script's own SLURM_PROCID (0) and SLURM_NTASKS.
RANK_FALLBACKS = ("RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")
SIZE_FALLBACKS = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS")

_JOB_ID_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([kKmMgG]?)(i?[bB])?\s*$")
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

T = TypeVar("T")


def _bad(var: str, value: str, why: str) -> ConfigError:
    return ConfigError(f"invalid {var}={value!r}: {why}")


def _quorum(text: Optional[str]) -> Tuple[int, float]:
    """FASTPS_ROUND_QUORUM: a count k (1..n) or a fraction in (0, 1] of the pushers."""
    if text is None or not text.strip():
        return 0, 0.0
    value = text.strip()
    try:
        if "." in value:
            frac = float(value)
            if not 0.0 < frac <= 1.0:
                raise ValueError
            return 0, frac
        k = int(value)
    except ValueError:
        raise _bad(
            "FASTPS_ROUND_QUORUM", value, "expected a count of workers (3) or a fraction (0.75)"
        ) from None
    # The launcher reads this too, before it knows the job's size: servers refuse a k
    # above their worker count (csrc/server/options.cc).
    if k < 1:
        raise _bad("FASTPS_ROUND_QUORUM", value, "must be >= 1")
    return k, 0.0


def parse_addr(text: str, var: str = "address") -> Tuple[str, int]:
    """Parses ``host:port`` (``[v6addr]:port`` for IPv6) into ``(host, port)``."""
    value = text.strip()
    if value.startswith("["):
        end = value.find("]")
        if end < 0 or value[end + 1 : end + 2] != ":":
            raise _bad(var, text, "expected [ipv6]:port")
        host, port_text = value[1:end], value[end + 2 :]
    else:
        host, sep, port_text = value.rpartition(":")
        if not sep:
            raise _bad(var, text, "expected host:port")
        if ":" in host:
            raise _bad(var, text, "write IPv6 addresses as [addr]:port")
    if not host:
        raise _bad(var, text, "missing host")
    try:
        port = int(port_text)
    except ValueError:
        raise _bad(var, text, "port is not an integer") from None
    if not 0 <= port <= 65535:
        raise _bad(var, text, "port out of range 0..65535")
    return host, port


def validate_job_id(job_id: str, var: str = "FASTPS_JOB_ID") -> str:
    """Checks a job id is safe to embed in file and shared-memory names."""
    if not _JOB_ID_RE.match(job_id):
        raise _bad(var, job_id, "use 1-64 characters from A-Z a-z 0-9 _ . -")
    return job_id


def format_addr(host: str, port: int) -> str:
    """Inverse of :func:`parse_addr`."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_size(text: str, var: str = "size") -> int:
    """Parses a byte count: ``4194304``, ``4M``, ``4MiB``, ``512k`` (powers of 1024)."""
    m = _SIZE_RE.match(text)
    if not m:
        raise _bad(var, text, "expected a byte count such as 4194304, 512K or 4MiB")
    mult = {"": 1, "k": KiB, "m": MiB, "g": GiB}[m.group(2).lower()]
    return int(m.group(1)) * mult


def is_loopback_host(host: str) -> bool:
    """True for ``localhost``, ``127.x.y.z``, ``::1`` and the bind-all ``0.0.0.0``/``::``."""
    if host.lower() == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return ip.is_loopback or ip.is_unspecified


def _route_source(target: str) -> Optional[str]:
    """The local address the kernel would use to reach ``target`` (a UDP ``connect`` sends
    no packet), or None."""
    try:
        infos = socket.getaddrinfo(target, 9, type=socket.SOCK_DGRAM)
        family, _, _, _, sockaddr = infos[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(sockaddr)
            local = str(s.getsockname()[0])
        ip = ipaddress.ip_address(local)
    except (OSError, ValueError, IndexError):
        return None
    return None if ip.is_unspecified else local


def _resolved_hostname() -> Optional[str]:
    """This machine's host name resolved to an address, unless that is loopback."""
    try:
        local = socket.gethostbyname(socket.gethostname())
        return None if ipaddress.ip_address(local).is_loopback else local
    except (OSError, ValueError):
        return None


def default_advertised_host(scheduler_host: Optional[str]) -> str:
    """The address a process advertises when ``FASTPS_HOST`` is unset.

    ``127.0.0.1`` when the scheduler is local (or unknown). Otherwise, in order: the local
    address that routes to the scheduler; this machine's host name resolved (if that is not
    a loopback address, as Debian's ``127.0.1.1`` entry is); the address of the default
    route; ``127.0.0.1``.
    """
    if scheduler_host is None or is_loopback_host(scheduler_host):
        return "127.0.0.1"
    return (
        _route_source(scheduler_host)
        or _resolved_hostname()
        or _route_source("192.0.2.1")  # TEST-NET-1: only the routing table is consulted
        or "127.0.0.1"
    )


class _Env:
    """Typed reads of one environment mapping, with errors that name the variable."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env

    def raw(self, var: str) -> Optional[str]:
        value = self.env.get(var)
        if value is None or value.strip() == "":
            return None
        return value.strip()

    def first(self, names: Tuple[str, ...]) -> Tuple[Optional[str], Optional[str]]:
        for name in names:
            value = self.raw(name)
            if value is not None:
                return name, value
        return None, None

    def convert(self, var: str, value: str, fn: Callable[[str], T], what: str) -> T:
        try:
            return fn(value)
        except (ValueError, TypeError):
            raise _bad(var, value, f"expected {what}") from None

    def integer(
        self, names: Tuple[str, ...], default: int, minimum: Optional[int] = None
    ) -> Tuple[int, Optional[str]]:
        var, value = self.first(names)
        if var is None or value is None:
            return default, None
        result = self.convert(var, value, int, "an integer")
        if minimum is not None and result < minimum:
            raise _bad(var, value, f"must be >= {minimum}")
        return result, var

    def size(self, var: str, default: int) -> int:
        value = self.raw(var)
        if value is None:
            return default
        result = parse_size(value, var)
        if result <= 0:
            raise _bad(var, value, "must be > 0")
        return result

    def optional_size(self, var: str) -> Optional[int]:
        return None if self.raw(var) is None else self.size(var, 0)

    def size0(self, var: str, default: int) -> int:
        """A size that may be 0 (meaning: no limit)."""
        value = self.raw(var)
        if value is None:
            return default
        result = parse_size(value, var)
        if result < 0:
            raise _bad(var, value, "must be >= 0")
        return result

    def rate_or_auto(self, var: str) -> Optional[float]:
        """A link rate in Mbit/s (0: off), or None for "auto" or unset."""
        value = self.raw(var)
        if value is None or value.strip().lower() == "auto":
            return None
        result = self.convert(var, value, float, 'a rate in Mbit/s or "auto"')
        if not result >= 0 or result == float("inf"):
            raise _bad(var, value, 'must be "auto" or a finite rate in Mbit/s >= 0')
        return result

    def switch(self, var: str, default: bool) -> bool:
        """An on/off variable: 1/0, true/false, yes/no, on/off (any case); unset: default."""
        value = self.optional_switch(var)
        return default if value is None else value

    def optional_switch(self, var: str) -> Optional[bool]:
        """An on/off variable, None when unset (the caller's default applies)."""
        raw = self.raw(var)
        if raw is None:
            return None
        text = raw.lower()
        if text not in ("0", "1", "false", "true", "no", "yes", "off", "on"):
            raise _bad(var, text, "expected 1/0 (true/false, yes/no, on/off)")
        return text in ("1", "true", "yes", "on")

    def seconds(self, var: str, default: float) -> float:
        value = self.raw(var)
        if value is None:
            return default
        result = self.convert(var, value, float, "a number of seconds")
        if not result > 0 or result == float("inf"):
            raise _bad(var, value, "must be a finite number of seconds > 0")
        return result

    def seconds0(self, var: str, default: float, zero: str = "off") -> float:
        """Seconds, where 0 means ``zero`` ("off" unless the variable says otherwise)."""
        value = self.raw(var)
        if value is None:
            return default
        result = self.convert(var, value, float, "a number of seconds")
        if not result >= 0 or result == float("inf"):
            raise _bad(var, value, f"must be a finite number of seconds >= 0 (0: {zero})")
        return result


def _read(env: Optional[Mapping[str, str]]) -> _Env:
    return _Env(os.environ if env is None else env)


# ------------------------------------------------------------------------------------------
# One variable at a time: for what is asked before a whole Config can be built (the role of
# ``python -m fastps``, an elastic worker's rendezvous before it knows its rank), or again
# whenever an object is made (a plugin's optimizer). ``env``: default ``os.environ``, read
# at the call. Config.from_env reads the same variables through these.


def stated_role(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """FASTPS_ROLE (one of ROLES), or None when unset (a worker, for Config)."""
    e = _read(env)
    raw = e.raw("FASTPS_ROLE")
    if raw is None:
        return None
    if raw.lower() not in ROLES:
        raise _bad("FASTPS_ROLE", raw, f"expected one of {ROLES}")
    return raw.lower()


def stated_job_id(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """FASTPS_JOB_ID, checked (:func:`validate_job_id`), or None when unset (Config then
    derives one from the scheduler's port)."""
    job_id = _read(env).raw("FASTPS_JOB_ID")
    return None if job_id is None else validate_job_id(job_id)


def job_token(env: Optional[Mapping[str, str]] = None) -> str:
    """FASTPS_TOKEN, the job's shared secret, as given ("" when unset)."""
    return _read(env).env.get("FASTPS_TOKEN", "")


def stated_host(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """FASTPS_HOST, the address this process advertises, or None when unset (Config then
    asks FASTPS_IFACE, else :func:`default_advertised_host`)."""
    return _read(env).raw("FASTPS_HOST")


def network_interface(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """FASTPS_IFACE: the interface whose IPv4 address to advertise, or None."""
    return _read(env).raw("FASTPS_IFACE")


def launched_by(env: Optional[Mapping[str, str]] = None) -> str:
    """FASTPS_LAUNCHER: the launcher that started this process and reports an abort's
    reason itself ("fastpsrun"), or "" (the process says it)."""
    return _read(env).raw("FASTPS_LAUNCHER") or ""


def link_mbit(env: Optional[Mapping[str, str]] = None) -> Optional[float]:
    """FASTPS_LINK_MBIT: every host's link rate in Mbit/s (0: unpaced), None for ``auto``
    (the default: each process reads its own link, ``fastps.control.linkspeed``)."""
    return _read(env).rate_or_auto("FASTPS_LINK_MBIT")


def host_bandwidths(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """FASTPS_HOST_BANDWIDTHS as written (``host=Mbit/s,...``; parsed and checked by
    ``fastps.control.placement.parse_bandwidths``), or None."""
    return _read(env).raw("FASTPS_HOST_BANDWIDTHS")


def rack_uplinks(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """FASTPS_RACK_UPLINKS as written (``rack=Mbit/s,...``; parsed and checked by
    ``fastps.control.placement.parse_rack_rates``), or None."""
    return _read(env).raw("FASTPS_RACK_UPLINKS")


def topology_spec(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """FASTPS_TOPOLOGY as written (parsed by ``fastps.worker.topology``), or None: ask
    ``nvidia-smi topo -m``."""
    return _read(env).raw("FASTPS_TOPOLOGY")


def sfb_mode(env: Optional[Mapping[str, str]] = None) -> str:
    """FASTPS_SFB: ``off`` (the default), ``auto`` or ``on`` (docs/guide/sfb.md)."""
    e = _read(env)
    raw = e.raw("FASTPS_SFB")
    if raw is None:
        return DEFAULT_SFB
    if raw.lower() not in SFB_MODES:
        raise _bad("FASTPS_SFB", raw, f"expected one of {', '.join(SFB_MODES)}")
    return raw.lower()


def cross_barrier(env: Optional[Mapping[str, str]] = None) -> Optional[bool]:
    """FASTPS_CROSS_BARRIER: on or off, or None when unset: then each plugin's own default
    applies (on for torch, off for Keras and MXNet; ``fastps.collectives.basics``)."""
    return _read(env).optional_switch("FASTPS_CROSS_BARRIER")


def gc_freeze(env: Optional[Mapping[str, str]] = None) -> bool:
    """FASTPS_GC_FREEZE: freeze the heap after the first torch step and at a worker's exit
    (default on)."""
    return _read(env).switch("FASTPS_GC_FREEZE", True)


def elastic_addr(env: Optional[Mapping[str, str]] = None) -> str:
    """FASTPS_ELASTIC_ADDR: host:port of the elastic driver's rendezvous service; set (by
    fastpsrun) only in an elastic worker. "" otherwise."""
    return _read(env).raw("FASTPS_ELASTIC_ADDR") or ""


def elastic_id(env: Optional[Mapping[str, str]] = None) -> str:
    """FASTPS_ELASTIC_ID: this elastic worker's slot, ``host:index`` ("" when unset)."""
    return _read(env).raw("FASTPS_ELASTIC_ID") or ""


def elastic_job_id(env: Optional[Mapping[str, str]] = None) -> str:
    """FASTPS_ELASTIC_JOB_ID: the elastic job's id, which keys the rendezvous service's MAC
    (each generation's FASTPS_JOB_ID adds ``-g<k>``); "" when unset."""
    return _read(env).raw("FASTPS_ELASTIC_JOB_ID") or ""


def elastic_timeout(env: Optional[Mapping[str, str]] = None) -> float:
    """FASTPS_ELASTIC_TIMEOUT: seconds an elastic worker's rendezvous may wait."""
    return _read(env).seconds("FASTPS_ELASTIC_TIMEOUT", DEFAULT_ELASTIC_TIMEOUT)


def elastic_inplace(env: Optional[Mapping[str, str]] = None) -> str:
    """FASTPS_ELASTIC_INPLACE: ``""`` (off, the default), ``"commit"`` (``1``: a worker lost
    in the first step after a commit is replaced in place) or ``"any"`` (in any step)."""
    raw = _read(env).raw("FASTPS_ELASTIC_INPLACE")
    value = (raw or "0").lower()
    if value in ("0", "false", "no", "off"):
        return ""
    if value == "any":
        return "any"
    if value in ("1", "true", "yes", "on", "commit"):
        return "commit"
    raise _bad("FASTPS_ELASTIC_INPLACE", value, "use 1 (the first step after a commit), any, or 0")


def elastic_discovery_interval(env: Optional[Mapping[str, str]] = None) -> float:
    """FASTPS_ELASTIC_DISCOVERY_INTERVAL: seconds between runs of the host discovery
    script, at least MIN_DISCOVERY_INTERVAL."""
    e = _read(env)
    raw = e.raw("FASTPS_ELASTIC_DISCOVERY_INTERVAL")
    if raw is None:
        return DISCOVERY_INTERVAL
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise _bad("FASTPS_ELASTIC_DISCOVERY_INTERVAL", raw, "expected a number of seconds > 0")
    return max(value, MIN_DISCOVERY_INTERVAL)


def elastic_drain_timeout(env: Optional[Mapping[str, str]] = None) -> float:
    """FASTPS_ELASTIC_DRAIN_TIMEOUT: seconds a worker whose host left the discovery output
    may take to reach its next commit, where it leaves without a rollback of the others;
    after that it is stopped (the others roll back). 0: stopped at once."""
    return _read(env).seconds0("FASTPS_ELASTIC_DRAIN_TIMEOUT", DEFAULT_ELASTIC_DRAIN_TIMEOUT)


def elastic_defer_join(env: Optional[Mapping[str, str]] = None) -> bool:
    """FASTPS_ELASTIC_DEFER_JOIN: a new worker interrupts the others at the first commit
    after it asked to join, not after it was discovered (default off)."""
    return _read(env).switch("FASTPS_ELASTIC_DEFER_JOIN", False)


# ------------------------------------------------------------------------------------------
# Jobs started by another launcher (torchrun, Lightning, Ray, Spark): the store the launcher
# set up is the rendezvous (fastps.launch.store_rendezvous, docs/guide/torch-distributed.md).

# The variables torchrun (and torch's env:// rendezvous) sets for every process.
TORCH_LAUNCH_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
# Where a process's rank and world size come from when MASTER_ADDR and MASTER_PORT are set,
# as (rank, size) pairs in order of preference: torchrun's, then Open MPI's (mpirun sets them
# in the ranks it starts only), then SLURM's (srun's tasks; SLURM_PROCID and SLURM_NTASKS are
# also inherited by whatever a batch script starts, mpirun's ranks included, so they count
# last). A pair counts only when both of its variables are set.
LAUNCH_RANK_VARS = (
    ("RANK", "WORLD_SIZE"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("SLURM_PROCID", "SLURM_NTASKS"),
)
DEFAULT_SERVERS_PER_HOST = 1
DEFAULT_STORE_TIMEOUT = 1800.0  # torch's default process-group timeout (30 min)


def _launch_rank_vars(e: _Env) -> Optional[Tuple[str, str]]:
    """The first (rank, size) pair of LAUNCH_RANK_VARS with both variables set, or None."""
    for rank_var, size_var in LAUNCH_RANK_VARS:
        if e.raw(rank_var) is not None and e.raw(size_var) is not None:
            return rank_var, size_var
    return None


def torch_launched(env: Optional[Mapping[str, str]] = None) -> bool:
    """Whether this process was started by torchrun or another launcher that sets
    MASTER_ADDR and MASTER_PORT and a rank and world size (RANK and WORLD_SIZE, else
    OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE from mpirun, else SLURM_PROCID and
    SLURM_NTASKS from srun), and not by fastpsrun (no FASTPS_SCHEDULER_ADDR): then
    ``init()`` joins through the store at MASTER_ADDR:MASTER_PORT. Without MASTER_ADDR and
    MASTER_PORT, mpirun's and srun's variables only number the workers of a job whose
    scheduler was started by hand (``Config.from_env``)."""
    e = _read(env)
    return (
        e.raw("FASTPS_SCHEDULER_ADDR") is None
        and e.raw("MASTER_ADDR") is not None
        and e.raw("MASTER_PORT") is not None
        and _launch_rank_vars(e) is not None
    )


def torch_launch_settings(env: Optional[Mapping[str, str]] = None) -> Tuple[str, int, int, int]:
    """MASTER_ADDR, MASTER_PORT, and the rank and world size from the first pair of
    LAUNCH_RANK_VARS that is set (RANK and WORLD_SIZE when none is), checked (errors name
    the variable)."""
    e = _read(env)
    addr = e.raw("MASTER_ADDR") or ""
    port, _ = e.integer(("MASTER_PORT",), 0, minimum=1)
    if port > 65535:
        raise _bad("MASTER_PORT", str(port), "port out of range 1..65535")
    rank_var, size_var = _launch_rank_vars(e) or LAUNCH_RANK_VARS[0]
    size, _ = e.integer((size_var,), 1, minimum=1)
    rank, _ = e.integer((rank_var,), 0, minimum=0)
    if rank >= size:
        raise _bad(rank_var, str(rank), f"must be < {size_var} ({size})")
    return addr, port, rank, size


def scheduler_given(env: Optional[Mapping[str, str]] = None) -> bool:
    """Whether FASTPS_SCHEDULER_ADDR is set (a fastpsrun job, or roles started by hand)."""
    return _read(env).raw("FASTPS_SCHEDULER_ADDR") is not None


def servers_per_host(env: Optional[Mapping[str, str]] = None) -> int:
    """FASTPS_SERVERS_PER_HOST: summation servers the first process of each worker host
    starts in a job joined through a store (default 1; 0: CPU server hosts only)."""
    value, _ = _read(env).integer(("FASTPS_SERVERS_PER_HOST",), DEFAULT_SERVERS_PER_HOST, minimum=0)
    return value


def cpu_servers(env: Optional[Mapping[str, str]] = None) -> int:
    """FASTPS_CPU_SERVERS: how many servers on CPU-only machines a job joined through a store
    waits for (each started with ``python -m fastps.server --join ADDR:PORT``; default 0)."""
    value, _ = _read(env).integer(("FASTPS_CPU_SERVERS",), 0, minimum=0)
    return value


def stated_log_level(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """FASTPS_LOG_LEVEL as given (upper case), or None when unset."""
    raw = _read(env).raw("FASTPS_LOG_LEVEL")
    return raw.upper() if raw is not None else None


def run_function_channel(env: Optional[Mapping[str, str]] = None) -> Tuple[str, int, str, int]:
    """For a worker of ``fastps.run()``: FASTPS_RUN_ADDR (the caller's result store,
    host:port), FASTPS_RUN_SECRET (the key its messages are signed with) and the rank
    (FASTPS_RANK)."""
    e = _read(env)
    addr = e.raw("FASTPS_RUN_ADDR")
    secret = e.raw("FASTPS_RUN_SECRET")
    if addr is None or secret is None:
        raise ConfigError(
            "FASTPS_RUN_ADDR and FASTPS_RUN_SECRET are not set: this program is started by "
            "fastps.run(), not by hand"
        )
    host, port = parse_addr(addr, "FASTPS_RUN_ADDR")
    rank, _ = e.integer(("FASTPS_RANK",), 0, minimum=0)
    return host, port, secret, rank


def parent_pid(env: Optional[Mapping[str, str]] = None) -> Optional[int]:
    """FASTPS_PARENT_PID: the process whose death ends this server (set for the servers a
    worker starts itself), or None."""
    raw = _read(env).raw("FASTPS_PARENT_PID")
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise _bad("FASTPS_PARENT_PID", raw, "expected a process id") from None


@dataclass(frozen=True)
class Config:
    """Settings of one fastps process (see ``docs/reference/configuration.md``)."""

    role: str = DEFAULT_ROLE
    scheduler_addr: Optional[Tuple[str, int]] = None
    job_id: str = ""
    token: str = ""
    num_workers: int = 1
    num_servers: int = 1
    rank: int = 0
    server_id: int = 0
    server_port: int = 0
    host: str = "127.0.0.1"
    # FASTPS_IFACE: the interface whose address ``host`` is when FASTPS_HOST is unset.
    iface: Optional[str] = None
    hostname: str = ""
    # FASTPS_RACK: the rack this process is in (rack-level hierarchy, docs/guide/rack-hierarchy.md);
    # "" everywhere: one flat job.
    rack: str = ""
    partition_bytes: Optional[int] = None
    credit_bytes: Optional[int] = None
    window_bytes: int = DEFAULT_WINDOW_BYTES
    fusion_threshold: int = DEFAULT_FUSION_THRESHOLD
    # The default gradient compressor (FASTPS_COMPRESSION, a spec such as "topk:0.01:ef";
    # "" = none) and the smallest tensor it applies to (docs/guide/compression.md).
    compression: str = ""
    compression_min_bytes: int = 0
    notsent_lowat: int = DEFAULT_NOTSENT_LOWAT
    # FASTPS_PACING_BURST_BYTES: below this backlog a worker's pushes are paced at its
    # host's link rate rather than at their share of it (0: always at the share).
    pacing_burst_bytes: int = DEFAULT_PACING_BURST_BYTES
    # Every host's link rate in Mbit/s (FASTPS_LINK_MBIT); > 0 paces each flow at its
    # share of it (placement.pacing_plan), 0 leaves flows unpaced, None ("auto", the
    # default): each process reads its own host's rate (core/control/linkspeed.py).
    link_mbit: Optional[float] = None
    shm: bool = True
    # Servers nudge a part's last pusher once every other copy is in, and a pusher that
    # skipped a part half in for nudge_overdue seconds (FASTPS_NUDGE, FASTPS_NUDGE_OVERDUE).
    nudge: bool = True
    nudge_overdue: float = DEFAULT_NUDGE_OVERDUE
    nudge_min_wait: float = DEFAULT_NUDGE_MIN_WAIT  # seconds queued before a nudge counts
    # The network thread pushes the parts that freed credit admits (FASTPS_PUSH_FROM_IO;
    # off: the push thread takes every part, one wake-up per one or two parts).
    push_from_io: bool = True
    # Servers may leave and join the running job (FASTPS_ELASTIC_SERVERS; docs/guide/elastic.md).
    elastic_servers: bool = False
    shm_bytes: int = DEFAULT_SHM_BYTES
    conns_per_server: int = DEFAULT_CONNS_PER_SERVER
    engine_threads: int = dataclasses.field(default_factory=default_engine_threads)
    io_threads: int = DEFAULT_IO_THREADS
    timeout: float = DEFAULT_TIMEOUT
    handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT
    max_pending_handshakes: int = DEFAULT_MAX_PENDING_HANDSHAKES
    op_timeout: float = DEFAULT_OP_TIMEOUT
    heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL
    heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT
    log_level: str = DEFAULT_LOG_LEVEL
    log_level_source: Optional[str] = None  # "FASTPS_LOG_LEVEL" when set; None: the default
    # Where the job's merged timeline goes (FASTPS_TIMELINE); None: no timeline.
    timeline: Optional[str] = None
    timeline_events: int = DEFAULT_TIMELINE_EVENTS
    # The stall inspector (FASTPS_STALL_WARNING_S / FASTPS_STALL_SHUTDOWN_S; 0 = off).
    stall_warning: float = DEFAULT_STALL_WARNING
    stall_shutdown: float = 0.0
    # Which variable rank / num_workers came from (e.g. "SLURM_PROCID"); None = default.
    rank_source: Optional[str] = None
    num_workers_source: Optional[str] = None
    # Beyond lock-step (docs/guide/async.md). FASTPS_ROUND_QUORUM: a count (round_quorum) or a
    # fraction of the pushers (round_quorum_fraction); 0: every pusher. FASTPS_MODE: "sync"
    # or "async"; FASTPS_STALENESS: async SSP bound (-1, unset: unbounded).
    round_quorum: int = 0
    round_quorum_fraction: float = 0.0
    quorum_history: int = DEFAULT_QUORUM_HISTORY
    # FASTPS_QUORUM_CATCH_UP=1: a worker behind applies the rounds that closed without it
    # at once, so it makes fewer step() calls than its peers: only for loops that count
    # applied rounds (docs/guide/async.md, "Catch-up"); off, every rank's i-th step is round i.
    quorum_catch_up: bool = False
    mode: str = "sync"
    staleness: int = -1
    # Who started this process (FASTPS_LAUNCHER, "fastpsrun"): it reports an abort's reason
    # once, so the process does not repeat it. "": started by hand or by another engine.
    launcher: str = ""
    # Placement inputs, as written (fastps.control.placement parses them):
    # FASTPS_HOST_BANDWIDTHS (host=Mbit/s,...) and FASTPS_RACK_UPLINKS (rack=Mbit/s,...).
    host_bandwidths: Optional[str] = None
    rack_uplinks: Optional[str] = None
    # FASTPS_TOPOLOGY: this host's GPU/PCIe layout (fastps.worker.topology); None: ask
    # nvidia-smi.
    topology: Optional[str] = None
    # The plugins' options (docs/reference/configuration.md): FASTPS_SFB,
    # FASTPS_CROSS_BARRIER (None: the plugin's default, fastps.collectives.basics) and
    # FASTPS_GC_FREEZE (torch).
    sfb: str = DEFAULT_SFB
    cross_barrier: Optional[bool] = None
    gc_freeze: bool = True
    # Elastic mode (docs/guide/elastic.md). Set by fastpsrun's elastic driver in each worker:
    # FASTPS_ELASTIC_ADDR (its rendezvous service; "" means not an elastic worker),
    # FASTPS_ELASTIC_ID (the worker's slot), FASTPS_ELASTIC_JOB_ID, FASTPS_ELASTIC_TIMEOUT.
    # FASTPS_ELASTIC_INPLACE: "", "commit" or "any". The driver's own:
    # FASTPS_ELASTIC_DISCOVERY_INTERVAL, FASTPS_ELASTIC_DEFER_JOIN and
    # FASTPS_ELASTIC_DRAIN_TIMEOUT.
    elastic_addr: str = ""
    elastic_id: str = ""
    elastic_job_id: str = ""
    elastic_timeout: float = DEFAULT_ELASTIC_TIMEOUT
    elastic_inplace: str = ""
    elastic_discovery_interval: float = DISCOVERY_INTERVAL
    elastic_defer_join: bool = False
    elastic_drain_timeout: float = DEFAULT_ELASTIC_DRAIN_TIMEOUT

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None) -> Config:
        """Reads the configuration from ``env`` (default: ``os.environ``)."""
        e = _read(env)

        role = stated_role(e.env) or DEFAULT_ROLE

        addr_text = e.raw("FASTPS_SCHEDULER_ADDR")
        scheduler_addr = parse_addr(addr_text, "FASTPS_SCHEDULER_ADDR") if addr_text else None
        if scheduler_addr is not None and scheduler_addr[1] == 0 and role != "scheduler":
            raise _bad("FASTPS_SCHEDULER_ADDR", addr_text or "", "port 0 is only for the scheduler")

        job_id = stated_job_id(e.env)
        if job_id is None:
            job_id = f"job{scheduler_addr[1]}" if scheduler_addr else "fastps"

        token = job_token(e.env)

        num_workers, nw_src = e.integer(("FASTPS_NUM_WORKERS", *SIZE_FALLBACKS), 1, minimum=1)
        num_servers, _ = e.integer(("FASTPS_NUM_SERVERS",), 1, minimum=0)
        rank, rank_src = e.integer(("FASTPS_RANK", *RANK_FALLBACKS), 0, minimum=0)
        server_id, _ = e.integer(("FASTPS_SERVER_ID",), 0, minimum=0)
        server_port, _ = e.integer(("FASTPS_SERVER_PORT",), 0, minimum=0)
        if server_port > 65535:
            raise _bad("FASTPS_SERVER_PORT", str(server_port), "port out of range 0..65535")

        if role == "worker" and rank >= num_workers:
            raise FastPSError(
                f"invalid {rank_src or 'FASTPS_RANK'}={rank}: must be < the number of workers "
                f"({nw_src or 'FASTPS_NUM_WORKERS'}={num_workers})"
            )
        elastic_servers = e.switch("FASTPS_ELASTIC_SERVERS", False)
        # A server that joins a running job may take an id past the first ones.
        if role == "server" and server_id >= max(num_servers, 1) and not elastic_servers:
            raise FastPSError(
                f"invalid FASTPS_SERVER_ID={server_id}: must be < FASTPS_NUM_SERVERS={num_servers}"
            )

        iface = network_interface(e.env)
        host = (
            stated_host(e.env)
            or (interface_address(iface) if iface else None)
            or default_advertised_host(scheduler_addr[0] if scheduler_addr else None)
        )
        hostname = e.raw("FASTPS_HOSTNAME") or socket.gethostname()
        rack = (e.raw("FASTPS_RACK") or "").strip()

        conns, _ = e.integer(("FASTPS_CONNS_PER_SERVER",), DEFAULT_CONNS_PER_SERVER, minimum=1)
        threads, _ = e.integer(("FASTPS_ENGINE_THREADS",), default_engine_threads(), minimum=0)
        io_threads, _ = e.integer(("FASTPS_IO_THREADS",), DEFAULT_IO_THREADS, minimum=1)

        heartbeat_interval = e.seconds("FASTPS_HEARTBEAT_INTERVAL", DEFAULT_HEARTBEAT_INTERVAL)
        heartbeat_timeout = e.seconds("FASTPS_HEARTBEAT_TIMEOUT", DEFAULT_HEARTBEAT_TIMEOUT)
        if heartbeat_timeout <= heartbeat_interval:
            raise FastPSError(
                f"invalid FASTPS_HEARTBEAT_TIMEOUT={heartbeat_timeout:g}: must exceed "
                f"FASTPS_HEARTBEAT_INTERVAL={heartbeat_interval:g}"
            )

        shm = e.switch("FASTPS_SHM", True)
        nudge = e.switch("FASTPS_NUDGE", True)
        nudge_min_wait = e.seconds0("FASTPS_NUDGE_MIN_WAIT", DEFAULT_NUDGE_MIN_WAIT, "at once")
        nudge_overdue = e.seconds0("FASTPS_NUDGE_OVERDUE", DEFAULT_NUDGE_OVERDUE, "at once")
        push_from_io = e.switch("FASTPS_PUSH_FROM_IO", True)

        partition_bytes = e.optional_size("FASTPS_PARTITION_BYTES")
        if partition_bytes is not None and partition_bytes > MAX_PARTITION_BYTES:
            raise _bad(
                "FASTPS_PARTITION_BYTES",
                str(e.raw("FASTPS_PARTITION_BYTES")),
                f"at most {MAX_PARTITION_BYTES} bytes (256 MiB) per part",
            )

        level_source = "FASTPS_LOG_LEVEL" if e.raw("FASTPS_LOG_LEVEL") else None
        level = (e.raw("FASTPS_LOG_LEVEL") or DEFAULT_LOG_LEVEL).upper()
        if level not in _LOG_LEVELS:
            raise _bad("FASTPS_LOG_LEVEL", e.raw("FASTPS_LOG_LEVEL") or "", f"one of {_LOG_LEVELS}")

        timeline_events, _ = e.integer(
            ("FASTPS_TIMELINE_EVENTS",), DEFAULT_TIMELINE_EVENTS, minimum=1024
        )
        stall_warning = e.seconds0("FASTPS_STALL_WARNING_S", DEFAULT_STALL_WARNING)
        stall_shutdown = e.seconds0("FASTPS_STALL_SHUTDOWN_S", 0.0)
        quorum, quorum_fraction = _quorum(e.raw("FASTPS_ROUND_QUORUM"))
        quorum_history, _ = e.integer(("FASTPS_QUORUM_HISTORY",), DEFAULT_QUORUM_HISTORY, minimum=1)
        quorum_catch_up = e.switch("FASTPS_QUORUM_CATCH_UP", False)
        mode = (e.raw("FASTPS_MODE") or "sync").strip().lower()
        if mode not in MODES:
            raise _bad("FASTPS_MODE", e.raw("FASTPS_MODE") or "", f"expected one of {MODES}")
        staleness, _ = e.integer(("FASTPS_STALENESS",), -1, minimum=0)

        return cls(
            role=role,
            scheduler_addr=scheduler_addr,
            job_id=job_id,
            token=token,
            num_workers=num_workers,
            num_servers=num_servers,
            rank=rank,
            server_id=server_id,
            server_port=server_port,
            host=host,
            iface=iface,
            hostname=hostname,
            rack=rack,
            partition_bytes=partition_bytes,
            credit_bytes=e.optional_size("FASTPS_CREDIT_BYTES"),
            window_bytes=e.size0("FASTPS_WINDOW_BYTES", DEFAULT_WINDOW_BYTES),
            fusion_threshold=e.size0("FASTPS_FUSION_THRESHOLD", DEFAULT_FUSION_THRESHOLD),
            compression=(e.raw("FASTPS_COMPRESSION") or "").strip(),
            compression_min_bytes=e.size0("FASTPS_COMPRESSION_MIN_BYTES", 0),
            notsent_lowat=e.size0("FASTPS_NOTSENT_LOWAT", DEFAULT_NOTSENT_LOWAT),
            pacing_burst_bytes=e.size0("FASTPS_PACING_BURST_BYTES", DEFAULT_PACING_BURST_BYTES),
            link_mbit=link_mbit(e.env),
            shm=shm,
            nudge=nudge,
            nudge_min_wait=nudge_min_wait,
            nudge_overdue=nudge_overdue,
            push_from_io=push_from_io,
            elastic_servers=elastic_servers,
            shm_bytes=e.size("FASTPS_SHM_BYTES", DEFAULT_SHM_BYTES),
            conns_per_server=conns,
            engine_threads=threads,
            io_threads=io_threads,
            timeout=e.seconds("FASTPS_TIMEOUT", DEFAULT_TIMEOUT),
            handshake_timeout=e.seconds("FASTPS_HANDSHAKE_TIMEOUT", DEFAULT_HANDSHAKE_TIMEOUT),
            op_timeout=e.seconds("FASTPS_OP_TIMEOUT", DEFAULT_OP_TIMEOUT),
            heartbeat_interval=heartbeat_interval,
            heartbeat_timeout=heartbeat_timeout,
            log_level=level,
            log_level_source=level_source,
            timeline=e.raw("FASTPS_TIMELINE") or None,
            timeline_events=timeline_events,
            stall_warning=stall_warning,
            stall_shutdown=stall_shutdown,
            rank_source=rank_src,
            num_workers_source=nw_src,
            round_quorum=quorum,
            round_quorum_fraction=quorum_fraction,
            quorum_history=quorum_history,
            quorum_catch_up=quorum_catch_up,
            mode=mode,
            staleness=staleness,
            launcher=launched_by(e.env),
            host_bandwidths=host_bandwidths(e.env),
            rack_uplinks=rack_uplinks(e.env),
            topology=topology_spec(e.env),
            sfb=sfb_mode(e.env),
            cross_barrier=cross_barrier(e.env),
            gc_freeze=gc_freeze(e.env),
            elastic_addr=elastic_addr(e.env),
            elastic_id=elastic_id(e.env),
            elastic_job_id=elastic_job_id(e.env),
            elastic_timeout=elastic_timeout(e.env),
            elastic_inplace=elastic_inplace(e.env),
            elastic_discovery_interval=elastic_discovery_interval(e.env),
            elastic_defer_join=elastic_defer_join(e.env),
            elastic_drain_timeout=elastic_drain_timeout(e.env),
        )

    def part_sizes(self, hostnames: Sequence[str], racks: bool = False) -> Tuple[int, int]:
        """(partition, credit) bytes for a job whose workers and servers run on these hosts.

        Set values win; otherwise LOCAL_PARTITION_BYTES when all are on one host,
        RACK_PARTITION_BYTES under the rack hierarchy (``racks``), else
        NETWORK_PARTITION_BYTES. The credit defaults to the partition size, raised to
        NETWORK_CREDIT_BYTES across a network without the rack hierarchy. Every worker sees
        the same membership, so every worker cuts tensors the same way.
        """
        network = len(set(hostnames)) > 1
        auto = NETWORK_PARTITION_BYTES if network else LOCAL_PARTITION_BYTES
        if racks and network:
            auto = RACK_PARTITION_BYTES
        partition = self.partition_bytes or auto
        credit = max(partition, NETWORK_CREDIT_BYTES) if network and not racks else partition
        return partition, self.credit_bytes or credit

    def require_scheduler_addr(self) -> Tuple[str, int]:
        """The scheduler address, or a clear error when ``FASTPS_SCHEDULER_ADDR`` is unset."""
        if self.scheduler_addr is None:
            raise FastPSError(
                "FASTPS_SCHEDULER_ADDR is not set: start the job with fastpsrun, or set it to "
                "the scheduler's host:port (see docs/reference/configuration.md)"
            )
        return self.scheduler_addr

    def scheduler_log_level(self) -> str:
        """The standalone scheduler's log level: FASTPS_LOG_LEVEL when set, else
        DEFAULT_SCHEDULER_LOG_LEVEL (it says who registered and what it waits for)."""
        return self.log_level if self.log_level_source else DEFAULT_SCHEDULER_LOG_LEVEL

    def replace(self, **changes: object) -> Config:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def setup_logging(self, prefix: str = "fastps") -> None:
        """Configures the ``fastps`` loggers at ``log_level`` (only if not configured yet)."""
        logger = logging.getLogger("fastps")
        logger.setLevel(self.log_level)
        if not logger.handlers and not logging.getLogger().handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter(f"{prefix} %(levelname)s %(name)s: %(message)s"))
            logger.addHandler(handler)
