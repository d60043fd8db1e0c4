"""Server role (summation service): ``python -m fastps.server``.

Reads the ``FASTPS_*`` configuration, starts the C++ server of ``fastps._core``, registers
with the scheduler (advertising the data address), then waits for one of:

* ``shutdown`` from the scheduler (every worker left): stop and exit 0;
* ``abort`` (a peer died, a mismatch, ...): log the reason, stop, exit 1;
* the C++ server reporting an error: tell the scheduler to abort the job, exit 1;
* SIGTERM/SIGINT: tell the scheduler, stop, exit 128+signal.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, List, Optional

from fastps.config import Config, format_addr, parent_pid
from fastps.control import placement
from fastps.control.linkspeed import link_mbit_for
from fastps.control.protocol import ControlClient, EndedBeforeMembership
from fastps.errors import FastPSError
from fastps.timeline import recorder as timeline_recorder

__all__ = ["main", "run_server"]

if TYPE_CHECKING:
    from fastps import _core as _core_types

log = logging.getLogger("fastps.server")

POLL = 0.5  # how often the C++ server's health is checked


class _Terminated(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def server_options(cfg: Config) -> _core_types.ServerOptions:
    """The C++ server's options, every one from ``cfg`` (the one place defaults live)."""
    from fastps import _core

    opts = _core.ServerOptions()
    opts.server_id = cfg.server_id
    opts.num_workers = cfg.num_workers
    opts.job_id = cfg.job_id
    opts.token = cfg.token
    opts.host = cfg.host
    opts.port = cfg.server_port
    opts.engine_threads = cfg.engine_threads
    opts.io_threads = cfg.io_threads
    opts.handshake_timeout_s = cfg.handshake_timeout
    opts.max_pending_handshakes = cfg.max_pending_handshakes
    opts.worker_may_reconnect = cfg.elastic_servers
    opts.round_quorum = cfg.round_quorum
    opts.round_quorum_fraction = cfg.round_quorum_fraction
    opts.quorum_history = cfg.quorum_history
    opts.staleness = cfg.staleness
    opts.nudge = cfg.nudge
    opts.nudge_overdue_us = round(cfg.nudge_overdue * 1e6)
    return opts


def _default_factory() -> Callable[[Config], Any]:
    from fastps import _core

    return lambda cfg: _core.Server(server_options(cfg))


def run_server(
    cfg: Config,
    server_factory: Optional[Callable[[Config], Any]] = None,
    install_signals: bool = False,
) -> int:
    """Runs one server until shutdown or abort; returns the process exit code.

    ``server_factory(cfg)`` creates the data-plane server (default ``fastps._core.Server``
    with :func:`server_options`); it must offer ``start() -> port``, ``stop()`` and
    ``error() -> str``.
    """
    sched_addr = cfg.require_scheduler_addr()
    me = f"server {cfg.server_id} (pid {os.getpid()} on host {cfg.hostname})"
    if server_factory is None:
        try:
            server_factory = _default_factory()
        except ImportError as exc:
            log.error("%s: the C++ core fastps._core is not available: %s", me, exc)
            return 1

    wake = threading.Event()
    state = {"registering": False, "signal": 0}

    def on_signal(signum: int, _frame: object) -> None:
        # Only a plain assignment here: the handler runs in the main thread between two
        # bytecodes, possibly inside wake.wait() holding the Event's lock, and wake.set()
        # would then wait for that lock forever (seen: a parent-death SIGTERM and a second
        # SIGTERM left an orphaned server hung for hours). _serve polls every POLL seconds.
        state["signal"] = signum
        if state["registering"]:
            raise _Terminated(signum)

    if install_signals:
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

    srv = server_factory(cfg)
    client = ControlClient(
        sched_addr,
        cfg.job_id,
        cfg.token,
        timeout=cfg.timeout,
        heartbeat_interval=cfg.heartbeat_interval,
        heartbeat_timeout=cfg.heartbeat_timeout,
    )
    code = 1
    try:
        port = int(srv.start())
        data_addr = format_addr(cfg.host, port)
        client.on_abort(lambda _reason: wake.set())
        client.on_shutdown(lambda _msg: wake.set())
        if cfg.timeline:
            # Recording starts before registering: once the membership is out, workers
            # may push their first round before this server has measured its clock.
            _start_timeline(cfg)
        state["registering"] = True
        try:
            membership = client.register(
                "server",
                cfg.server_id,
                cfg.host,
                cfg.hostname,
                data_addr=data_addr,
                num_workers=cfg.num_workers,
                num_servers=cfg.num_servers,
                rack=cfg.rack,
            )
        finally:
            state["registering"] = False
        _set_rack_route(srv, cfg, membership)
        log.info("%s serving %d workers on %s", me, len(membership.workers), data_addr)
        link, how = link_mbit_for(cfg.link_mbit, cfg.host)
        log.debug("%s: link %.0f Mbit/s (%s)", me, link, how)
        if link > 0 and hasattr(srv, "set_pacing"):
            _, server_rates = placement.membership_pacing(membership, link, cfg.shm)
            # Rates are by position among the servers (ids may have gaps with elastic servers).
            ids = sorted(s.id for s in membership.servers)
            mine = server_rates[ids.index(cfg.server_id)]
            # Under the rack hierarchy the caps guard the racks' uplinks: no bursts there.
            # Before the caps: with bursts, connections stay unpaced until a large backlog.
            if hasattr(srv, "set_pacing_burst") and (
                placement.membership_rack_plan(membership, cfg.shm) is None
            ):
                srv.set_pacing_burst(
                    cfg.pacing_burst_bytes, placement.host_link_bytes_per_s(cfg.hostname, link)
                )
            srv.set_pacing([r / cfg.conns_per_server for r in mine])
            _set_rack_pacing(srv, cfg, membership, link)
        rec = timeline_recorder.active()
        if rec is not None:
            rec.set_clock(client.clock_offset())
            rec.link_mbit = link
        code = _serve(srv, client, wake, state, me, cfg.launcher, cfg.elastic_servers)
    except EndedBeforeMembership as exc:
        log.info("%s: %s", me, exc)
        code = 0
    except _Terminated as exc:
        code = 128 + exc.signum
        log.warning("%s: terminated by %s", me, signal.Signals(exc.signum).name)
    except FastPSError as exc:
        log.error("%s: %s", me, exc)
        code = 1
    finally:
        if hasattr(srv, "pacing_switches"):
            log.debug("%s: its answers' pacing switched %d times", me, srv.pacing_switches())
        try:
            srv.stop()
        except Exception:
            log.exception("%s: stopping the data-plane server failed", me)
        if timeline_recorder.active() is not None:
            try:
                timeline_recorder.stop()
            except OSError as exc:
                log.error("%s: could not write its timeline: %s", me, exc)
        client.close()
    return code


def _set_rack_route(srv: Any, cfg: Config, membership: Any) -> None:
    """Under the rack hierarchy (placement.rack_plan): where this server relays its rack's
    sums, and the rank it pushes them as."""
    plan = placement.membership_rack_plan(membership, cfg.shm)
    if plan is None or cfg.rack not in plan.relay_rank:
        return
    if not hasattr(srv, "set_rack_route"):
        raise FastPSError("this data-plane server cannot relay rack sums (no set_rack_route)")
    servers = [s for s in sorted(membership.servers, key=lambda s: s.id) if s.addr]
    srv.set_rack_route(
        [s.addr for s in servers], list(range(len(servers))), plan.relay_rank[cfg.rack], cfg.rack
    )
    log.info(
        "server %d: rack %r relays to %d owners as worker %d",
        cfg.server_id,
        cfg.rack,
        len(servers),
        plan.relay_rank[cfg.rack],
    )


def _set_rack_pacing(srv: Any, cfg: Config, membership: Any, link_mbit: float) -> None:
    """Under the rack hierarchy: the rates of this server's flows to and from the other
    racks' servers (its rack sums up, its answers to their relays)."""
    rates = placement.membership_rack_pacing(membership, link_mbit, cfg.shm)
    if rates is None or not hasattr(srv, "set_rack_pacing"):
        return
    ids = [s.id for s in sorted(membership.servers, key=lambda s: s.id) if s.addr]
    if cfg.server_id not in ids:
        return
    me = ids.index(cfg.server_id)
    # The owner knows a relay by the relaying server's id (its connection says so).
    by_id = [0.0] * (max(ids) + 1)
    for pos, sid in enumerate(ids):
        by_id[sid] = rates.relay_answer_rates[me][pos]
    srv.set_rack_pacing(by_id, rates.relay_rates[me])
    log.info(
        "server %d: rack pacing at %.0f Mbit/s: sums up %s, answers to relays %s Mbit/s",
        cfg.server_id,
        link_mbit,
        _mbit_list(rates.relay_rates[me]),
        _mbit_list(by_id),
    )


def _mbit_list(rates: Any) -> str:
    """The paced rates of a row in Mbit/s, for a log line."""
    return ", ".join(f"{r * 8 / 1e6:.1f}" for r in rates if r > 0) or "none"


def _start_timeline(cfg: Config) -> None:
    from fastps import _core

    assert cfg.timeline is not None
    timeline_recorder.start(
        {
            "core": _core,
            "path": os.path.abspath(cfg.timeline),
            "role": "server",
            "rank": cfg.server_id,
            "events_per_thread": cfg.timeline_events,
            "hostname": cfg.hostname,
        }
    )


def _serve(
    srv: Any,
    client: ControlClient,
    wake: threading.Event,
    state: dict,
    me: str,
    launcher: str,
    elastic: bool = False,
) -> int:
    while True:
        wake.wait(POLL)
        wake.clear()
        reason = client.abort_reason
        if reason is not None and elastic and client.scheduler_lost:
            # Cut off, not aborted: the scheduler drops a server it cannot hear from and
            # moves its keys, so this process is no server of the job any more, even once
            # its link heals (it never registers again).
            log.error(
                "%s left the job: %s; with elastic servers the scheduler takes a server it "
                "cannot hear from out of the job and moves its keys to the other servers, so "
                "this process serves nothing any more and exits (start a new server to add "
                "one)",
                me,
                reason,
            )
            return 1
        if reason is not None:
            # Under fastpsrun the launcher reports the reason, once; don't repeat it.
            level = logging.INFO if launcher else logging.ERROR
            log.log(level, "%s: job aborted: %s", me, reason)
            return 1
        if client.shutdown_received:
            log.info("%s: shutdown", me)
            return 0
        signum = state["signal"]
        if signum and ("orphaned_at" in state or _orphaned()):
            # The worker that started this server died (its death signal): the scheduler
            # names that worker when its connection drops; a report from here would name
            # this server instead. Wait briefly for the scheduler's verdict, then go.
            since = state.setdefault("orphaned_at", time.monotonic())
            if time.monotonic() - since < ORPHAN_GRACE:
                continue
            log.warning("%s: the worker that started it is gone", me)
            return 128 + signum
        if signum:
            name = signal.Signals(signum).name
            log.warning("%s: terminated by %s", me, name)
            client.send_abort(f"{me} terminated by {name}")
            return 128 + signum
        error = srv.error()
        if error:
            reason = f"{me} failed: {error}"
            log.error("%s", reason)
            client.send_abort(reason)
            return 1


ORPHAN_GRACE = 5.0  # s an orphaned server waits for the scheduler to name the dead worker


def _orphaned(wait: float = 1.0) -> bool:
    """Whether this server was started by a worker (FASTPS_PARENT_PID) that is gone or
    going. The death signal comes when the thread that started the server exits, which may
    be before the rest of that process: give it ``wait`` seconds to be gone."""
    parent = parent_pid()
    if parent is None:
        return False
    deadline = time.monotonic() + wait
    while True:
        if os.getppid() != parent:
            return True
        try:
            with open(f"/proc/{parent}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return True
        except OSError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def _die_with_parent(pid: int) -> None:
    """A server a worker started (``fastps.launch.store_rendezvous``) ends with that worker,
    even when it is SIGKILLed: the kernel's parent-death signal, and a check for a parent
    that died before the signal was armed."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the scheduler's heartbeat still ends it
        log.debug("no parent-death signal on this platform")
    if os.getppid() != pid:
        print(f"fastps server: the worker that started it (pid {pid}) is gone", file=sys.stderr)
        sys.exit(1)


def main(argv: Optional[List[str]] = None) -> None:
    """``python -m fastps.server`` (``--join HOST:PORT``: a CPU-only machine's server joins
    the job whose workers' store listens there; docs/guide/torch-distributed.md)."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--join"] and len(args) != 2:
        print("usage: python -m fastps.server [--join HOST:PORT]", file=sys.stderr)
        sys.exit(2)
    if args[:1] == ["--join"]:
        from fastps.launch import store_rendezvous

        try:
            joined = store_rendezvous.cpu_server_config(args[1])
        except FastPSError as exc:
            print(f"fastps server: {exc}", file=sys.stderr)
            sys.exit(2)
        joined.setup_logging(f"fastps-server-{joined.server_id}")
        sys.exit(run_server(joined, install_signals=True))
    try:
        cfg = Config.from_env({**os.environ, "FASTPS_ROLE": "server"})
        cfg.require_scheduler_addr()
        parent = parent_pid()
    except FastPSError as exc:
        print(f"fastps server: {exc}", file=sys.stderr)
        sys.exit(2)
    if parent is not None:
        _die_with_parent(parent)
    cfg.setup_logging(f"fastps-server-{cfg.server_id}")
    sys.exit(run_server(cfg, install_signals=True))


if __name__ == "__main__":
    main()
