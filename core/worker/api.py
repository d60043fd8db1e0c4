"""The worker-side API: init, push_pull, broadcast, barrier and friends.

One process-wide state holds the scheduler connection (control plane, Python) and the C++
worker (data plane). The C++ worker never blocks the caller except in ``wait``; every wait
is bounded by ``FASTPS_OP_TIMEOUT``.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import itertools
import logging
import math
import os
import sys
import threading
import time
import traceback
from types import ModuleType
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
from fastps.config import MODES, Config, launched_by, topology_spec, torch_launched
from fastps.control import elastic_wire as _elastic_wire
from fastps.control import placement
from fastps.control.linkspeed import link_mbit_for, payload_fraction
from fastps.control.protocol import ControlClient, Membership
from fastps.elastic import rendezvous as _elastic_rendezvous
from fastps.errors import FastPSAbort, FastPSError, FastPSTimeoutError, WorkerLostError
from fastps.timeline import recorder as timeline_recorder
from fastps.worker import compression as _compression
from fastps.worker.buffers import RawBuffer, raw_buffer
from fastps.worker.exit_heap import freeze_heap_at_exit
from fastps.worker.stall import StallInspector, SubmissionCounts
from fastps.worker.waitable import Waitable

if TYPE_CHECKING:
    from fastps import _core as _core_types

log = logging.getLogger("fastps.worker")


class Session:
    def __init__(
        self,
        cfg: Config,
        client: Optional[ControlClient],
        membership: Optional[Membership],
        worker: _core_types.Worker,
    ) -> None:
        self.cfg = cfg
        self.client = client
        self.membership = membership
        self.worker = worker
        self.names = itertools.count()
        self.barriers = itertools.count()
        # This worker's latest declaration of each tensor and how many came before it.
        self.declared: Dict[str, Tuple[Tuple[Tuple[int, ...], str, int, str], int]] = {}
        self.lock = threading.Lock()
        self.failed: Optional[str] = None
        self.stall: Optional[StallInspector] = None
        # For fastpsrun --progress: push_pulls per name, the most of any name (one per step
        # for a gradient), and bytes submitted.
        self.counts = SubmissionCounts()
        self.link_mbit = 0.0  # this host's link rate (0: unknown or unpaced)
        self.bytes = 0
        # push_pulls submitted in this session: in-place replacement (elastic/inplace.py)
        # tells its step's own from the program's other collectives since a commit.
        self.submitted = 0
        # Handles nobody waits for any more (Handle.abandon): what they keep alive, until
        # the core finishes them. Reentrant: a finalizer may abandon while its thread
        # holds it.
        self.abandoned: List[Handle] = []
        self.abandoned_lock = threading.RLock()
        # Gradients' sums are quorum rounds (FASTPS_ROUND_QUORUM; docs/guide/async.md). Not with
        # elastic servers: a rerouted round is redone whole, by every worker.
        self.quorum = (
            bool(cfg.round_quorum or cfg.round_quorum_fraction) and not cfg.elastic_servers
        )


_state: Optional[Session] = None
_init_lock = threading.Lock()


def _core() -> ModuleType:
    try:
        from fastps import _core as core
    except ImportError as exc:  # pragma: no cover - only on a broken install
        raise FastPSError(f"the fastps C++ core is not built or cannot load: {exc}") from None
    return core


def init(config: Optional[Config] = None, mode: Optional[str] = None) -> None:
    """Joins the job: registers with the scheduler and connects to every server.

    Without FASTPS_SCHEDULER_ADDR and with one worker, runs as a single process (every
    collective returns its input), like Horovod without a launcher. ``mode``: "sync" or
    "async" (docs/guide/async.md), overriding FASTPS_MODE.
    """
    global _state
    with _init_lock:
        if _state is not None:
            return
        if config is None and _elastic_wire.enabled():
            cfg = _elastic_rendezvous.join()  # the next generation of an elastic job
        elif config is None and torch_launched():
            # Started by torchrun (or a launcher like it), not fastpsrun: the job forms
            # through torch's store (fastps.launch.store_rendezvous).
            from fastps.launch import store_rendezvous

            cfg = store_rendezvous.join_from_env()
        else:
            cfg = config or Config.from_env()
        if mode is not None:
            if mode not in MODES:
                raise FastPSError(f"init(mode={mode!r}): expected one of {MODES}")
            cfg = cfg.replace(mode=mode)
        cfg.setup_logging("fastps")
        core = _core()
        client: Optional[ControlClient] = None
        membership: Optional[Membership] = None
        servers: List[str] = []
        weights: List[float] = []
        local_ranks: List[int] = []
        local_servers: List[bool] = []
        num_hosts = 0
        pacing: List[float] = []
        burst_rate = 0.0
        rack_plan: Optional[placement.RackPlan] = None
        hosts: List[str] = [cfg.hostname]
        link = 0.0
        if cfg.scheduler_addr is None:
            if cfg.num_workers != 1:
                cfg.require_scheduler_addr()
        else:
            client = ControlClient(
                cfg.scheduler_addr,
                cfg.job_id,
                cfg.token,
                timeout=cfg.timeout,
                heartbeat_interval=cfg.heartbeat_interval,
                heartbeat_timeout=cfg.heartbeat_timeout,
            )
            membership = client.register(
                "worker",
                cfg.rank,
                cfg.host,
                cfg.hostname,
                num_workers=cfg.num_workers,
                num_servers=cfg.num_servers,
                rack=cfg.rack,
            )
            rack_plan = placement.membership_rack_plan(membership, cfg.shm)
            servers = [s.addr for s in membership.servers if s.addr]
            weights = placement.membership_weights(membership)
            local_ranks, local_servers, num_hosts = _locality(membership, cfg.rank)
            link, how = link_mbit_for(cfg.link_mbit, cfg.host)
            log.debug("worker %d: link %.0f Mbit/s (%s)", cfg.rank, link, how)
            worker_rates, _ = placement.membership_pacing(
                membership, link, cfg.shm, payload_fraction=payload_fraction(cfg.host)
            )
            pacing = worker_rates[cfg.rank]
            # Under the rack hierarchy the caps guard the racks' uplinks: no bursts there.
            if rack_plan is None:
                burst_rate = placement.host_link_bytes_per_s(cfg.hostname, link)
            hosts = [w.hostname for w in membership.workers]
            hosts += [s.hostname for s in membership.servers]
        opts = worker_options(
            cfg,
            hosts,
            servers=servers,
            server_weights=weights,
            pacing_bytes_per_s=pacing,
            pacing_burst_bytes_per_s=burst_rate,
            local_ranks=local_ranks,
            local_servers=local_servers,
            num_hosts=num_hosts,
            racks=rack_plan is not None,
        )
        if rack_plan is not None:
            opts.relay_via = rack_plan.relay_via[cfg.rank]
            opts.owner_pushers = rack_plan.owner_pushers
            opts.rack_pushers = rack_plan.rack_pushers[cfg.rank]
        try:
            rerouting = client is not None and membership is not None and cfg.elastic_servers
            if rerouting:
                assert client is not None and membership is not None
                worker = _rerouting_worker(cfg, client, membership, link)
            else:
                worker = core.Worker(opts)
            if client is not None:
                # Before start(): an abort while connecting (a peer died) must end the wait.
                # The scheduler reports the reason itself, so the worker logs it quietly.
                client.on_abort(lambda reason: worker.abort(reason, True))
            if not rerouting:
                worker.start()
        except (RuntimeError, ValueError) as exc:
            if client is not None:
                # A peer that died shows here as a lost connection; the scheduler's abort,
                # naming the process by pid and host, is usually a moment behind.
                deadline = time.monotonic() + 1.0
                while client.abort_reason is None and time.monotonic() < deadline:
                    time.sleep(0.02)
                reason = client.abort_reason
                if reason is None:
                    client.send_abort(f"worker {cfg.rank} could not start: {exc}")
                client.close()
                if reason is not None:
                    raise FastPSAbort(reason) from None
            kind = FastPSTimeoutError if isinstance(exc, FastPSTimeoutError) else FastPSError
            raise kind(f"worker {cfg.rank}: {exc}") from None
        _state = Session(cfg, client, membership, worker)
        _state.link_mbit = link
        if (cfg.round_quorum or cfg.round_quorum_fraction) and not _state.quorum and cfg.rank == 0:
            log.warning(
                "FASTPS_ROUND_QUORUM is ignored with elastic servers (FASTPS_ELASTIC_SERVERS=1): "
                "a rerouted round is redone by every worker, so every round waits for all"
            )
        if client is not None and cfg.stall_warning > 0:
            _state.stall = StallInspector(
                client,
                cfg.rank,
                cfg.stall_warning,
                cfg.stall_shutdown,
                _state.counts,
                functools.partial(_stall_closers, _state),
            )
        if client is not None:
            client.set_heartbeat_stats(functools.partial(_progress_counters, _state, link))
        if cfg.timeline:
            start_timeline(cfg.timeline)
        atexit.register(shutdown)
        freeze_heap_at_exit()
        _install_excepthook()


def _stall_closers(st: Session) -> Optional[int]:
    """The fewest submitting ranks that may finish a round of a sum on this worker (None:
    every rank). Under quorum rounds a round closes with k pushers, where a pusher is a
    worker, or a host (a rack) summing its workers first: it pushes only once all of them
    submitted, so k pushers mean at least k submitting ranks, and a fraction f of the
    pushers at least ceil(f * the fewest pushers there may be). Async exchanges finish
    alone (1)."""
    cfg = st.cfg
    if cfg.mode == "async":
        return 1
    # Off with elastic servers (Session.quorum): every round waits for all there.
    if not st.quorum:
        return None
    if cfg.round_quorum:
        return int(cfg.round_quorum)
    pushers = cfg.num_workers
    members = st.membership.workers if st.membership is not None else []
    if cfg.shm and members:
        pushers = min(pushers, len({w.hostname for w in members}))
    if any(w.rack for w in members):
        pushers = min(pushers, len({w.rack for w in members}))
    return max(1, math.ceil(cfg.round_quorum_fraction * pushers))


def _rerouting_worker(
    cfg: Config, client: ControlClient, membership: Membership, link: float
) -> Any:
    """With FASTPS_ELASTIC_SERVERS: a data plane that survives servers leaving and joining
    (core/worker/rerouting.py), one core per server epoch. Its cores use TCP only
    and no fusion: a redone round must be a push_pull of its own."""
    from fastps.worker.rerouting import ReroutingWorker

    workers = [dataclasses.asdict(w) for w in membership.workers]
    core_cfg = dataclasses.replace(cfg, shm=False, fusion_threshold=0)

    def build(servers: List[Dict[str, Any]], epoch: int) -> Any:
        m = Membership.from_message({"workers": workers, "servers": servers})
        # Its cores push flat (not through rack relays): rack pacing would not fit them.
        rates, _ = placement.membership_pacing(
            m, link, False, rack_routes=False, payload_fraction=payload_fraction(cfg.host)
        )
        opts = worker_options(
            core_cfg,
            [w.hostname for w in m.workers] + [s.hostname for s in m.servers],
            servers=[s.addr for s in m.servers if s.addr],
            server_weights=placement.membership_weights(m),
            pacing_bytes_per_s=rates[cfg.rank],
            pacing_burst_bytes_per_s=placement.host_link_bytes_per_s(cfg.hostname, link),
            local_ranks=[cfg.rank],
        )
        core = _core().Worker(opts)
        core.start()
        log.debug("worker %d: core of server epoch %d started", cfg.rank, epoch)
        return core

    servers = [dataclasses.asdict(s) for s in membership.servers]
    # A completed round's copy must outlive the scheduler's notice of a dead server.
    keep = 2 * cfg.heartbeat_timeout + 30.0
    return ReroutingWorker(build, client, servers, cfg.rank, cfg.op_timeout, keep)


def _progress_counters(st: Session, link_mbit: float) -> Dict[str, Any]:
    """What this worker's heartbeats carry for fastpsrun --progress (core/launch/progress.py)."""
    return {
        "steps": st.counts.most,
        "bytes": st.bytes,
        "host": st.cfg.hostname,
        "link_mbit": link_mbit,
    }


def worker_options(
    cfg: Config,
    hosts: Sequence[str],
    *,
    servers: Sequence[str] = (),
    server_weights: Sequence[float] = (),
    pacing_bytes_per_s: Sequence[float] = (),
    pacing_burst_bytes_per_s: float = 0.0,
    local_ranks: Sequence[int] = (),
    local_servers: Sequence[bool] = (),
    num_hosts: int = 0,
    racks: bool = False,
) -> _core_types.WorkerOptions:
    """The C++ worker's options: settings from ``cfg`` (the one place defaults live), the
    rest from the membership. ``hosts``: every process's host name, and ``racks``: whether
    the job runs the rack hierarchy, for the part size."""
    opts = _core().WorkerOptions()
    opts.rank = cfg.rank
    opts.num_workers = cfg.num_workers
    opts.job_id = cfg.job_id
    opts.token = cfg.token
    opts.partition_bytes, opts.credit_bytes = cfg.part_sizes(hosts, racks)
    opts.window_bytes = cfg.window_bytes
    opts.nudge_min_wait_us = round(cfg.nudge_min_wait * 1e6)
    opts.push_from_io = cfg.push_from_io
    opts.fusion_threshold = cfg.fusion_threshold
    opts.notsent_lowat = cfg.notsent_lowat
    opts.conns_per_server = cfg.conns_per_server
    opts.connect_timeout_s = cfg.timeout
    opts.shm = cfg.shm
    opts.shm_bytes = cfg.shm_bytes
    opts.quorum = bool(cfg.round_quorum or cfg.round_quorum_fraction)
    opts.servers = list(servers)
    opts.server_weights = [float(w) for w in server_weights]
    opts.pacing_bytes_per_s = [float(r) for r in pacing_bytes_per_s]
    opts.pacing_burst_bytes = cfg.pacing_burst_bytes
    opts.pacing_burst_bytes_per_s = float(pacing_burst_bytes_per_s)
    opts.local_ranks = list(local_ranks)
    opts.local_servers = list(local_servers)
    opts.num_hosts = num_hosts
    return opts


def _locality(membership: Membership, rank: int) -> Tuple[List[int], List[bool], int]:
    """(ranks of the workers on this host, whether each server is on this host, number of
    hosts with workers). Hosts are told apart by FASTPS_HOSTNAME, so tests can emulate them."""
    me = membership.worker(rank).hostname
    local_ranks = sorted(w.rank for w in membership.workers if w.hostname == me)
    local_servers = [s.hostname == me for s in membership.servers if s.addr]
    num_hosts = len({w.hostname for w in membership.workers})
    return local_ranks, local_servers, num_hosts


# The plugins' sources (fastps.torch, ...): frames there are fastps's, not the user's.
def _our_folders() -> Tuple[str, ...]:
    """Where fastps's own code lies: the package, and each plugin loaded (in a source
    checkout the plugins are folders of their own)."""
    names = ("fastps", "fastps.torch", "fastps.tensorflow", "fastps.mxnet")
    files = [getattr(sys.modules.get(n), "__file__", None) for n in names]
    return tuple(os.path.dirname(os.path.abspath(f)) for f in files if f)


def _install_excepthook() -> None:
    previous = sys.excepthook

    def hook(tp: Any, value: Any, tb: Any) -> None:
        st = _state
        launcher = st.cfg.launcher if st is not None else launched_by()
        if isinstance(value, FastPSAbort) and launcher:
            # Another process's failure, which fastpsrun reports once: say only where it hit.
            ours = _our_folders()
            frames = [f for f in traceback.extract_tb(tb) if not f.filename.startswith(ours)]
            at = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
            rank_text = f"worker {st.cfg.rank}" if st is not None else "this worker"
            sys.stderr.write(f"fastps: {rank_text} stopped{at}: the job was aborted\n")
            return
        if st is not None and st.failed is None:
            st.failed = f"worker {st.cfg.rank} raised {tp.__name__}: {value}"
        previous(tp, value, tb)

    sys.excepthook = hook


def shutdown() -> None:
    """Leaves the job. A process that failed tells the scheduler, so peers stop too."""
    global _state
    with _init_lock:
        st = _state
        _state = None
    if st is None:
        return
    if st.stall is not None:
        st.stall.close()
    st.worker.shutdown()
    if timeline_recorder.active() is not None:
        try:
            timeline_recorder.stop()
        except OSError as exc:
            log.error("could not write this worker's timeline: %s", exc)
    if st.client is not None:
        if st.failed:
            st.client.send_abort(st.failed)
        st.client.close()


def start_timeline(path: str) -> None:
    """Records this worker's share of the job's timeline, for ``path`` (docs/guide/timeline.md).

    The clock offset to the scheduler is measured now, so every process's events line up.
    """
    st = _st()
    active = timeline_recorder.active()
    if active is not None:
        raise FastPSError(f"a timeline is already being recorded (to {active.path})")
    clock = (0, 0)
    if st.client is not None:
        clock = st.client.clock_offset()
    timeline_recorder.start(
        {
            "core": _core(),
            "path": os.path.abspath(path),
            "role": "worker",
            "rank": st.cfg.rank,
            "events_per_thread": st.cfg.timeline_events,
            "clock": clock,
            "hostname": st.cfg.hostname,
            "link_mbit": st.link_mbit,
        }
    )


def stop_timeline() -> Optional[str]:
    """Stops recording; writes this worker's share and returns the file (None if off)."""
    return timeline_recorder.stop()


def is_initialized() -> bool:
    return _state is not None


def _st() -> Session:
    if _state is None:
        raise FastPSError("fastps is not initialized: call fastps.init() first")
    return _state


def session() -> Session:
    """The current core session (raises if fastps is not initialized). There is one per
    ``init()``, and one per elastic generation: plugins key what belongs to a session (op
    ids, fusion plans, checks passed) on its identity."""
    return _st()


def session_or_none() -> Optional[Session]:
    """The current core session, or None outside ``init()`` / ``shutdown()``."""
    return _state


def config() -> Config:
    """The configuration of the current session (raises if fastps is not initialized)."""
    return _st().cfg


def rank() -> int:
    return _st().cfg.rank


def mode() -> str:
    """The training mode, sync or async (docs/guide/async.md): FASTPS_MODE or init(mode=...)."""
    return _st().cfg.mode


def size() -> int:
    return _st().cfg.num_workers


def _me() -> Any:
    st = _st()
    return st.membership.worker(st.cfg.rank) if st.membership else None


def local_rank() -> int:
    me = _me()
    return me.local_rank if me else 0


def local_size() -> int:
    me = _me()
    return me.local_size if me else 1


def _hosts() -> List[str]:
    st = _st()
    if not st.membership:
        return ["localhost"]
    seen: Dict[str, None] = {}
    for w in st.membership.workers:
        seen.setdefault(w.hostname, None)
    return list(seen)


def cross_rank() -> int:
    me = _me()
    return _hosts().index(me.hostname) if me else 0


def cross_size() -> int:
    return len(_hosts())


def server_weights() -> List[float]:
    """Share of the model bytes each server sums (BytePS Eq. 1/2 from the membership)."""
    st = _st()
    if not st.membership:
        return []
    return placement.membership_weights(st.membership)


def local_plan() -> Optional[str]:
    """The topology-aware local aggregation plan for this host (BytePS §4.2.3), from
    FASTPS_TOPOLOGY or ``nvidia-smi topo -m``; None on a host without GPUs."""
    from fastps.worker import topology

    plan = topology.host_plan(topology_spec())
    return plan.describe() if plan else None


def data_path_stats() -> Dict[str, Any]:
    """How this worker's parts travelled so far: pushes through shared memory or TCP, parts
    it summed as its host's local owner, contributions handed to local owners, routed pushes
    (``pushed_routed``), parts pushed early because a server was waiting for this worker's
    copy only (``nudged``), and every byte its data-plane sockets sent and received, headers
    included (``socket_bytes_sent``, ``socket_bytes_received``)."""
    return dict(_st().worker.stats())


def num_servers() -> int:
    st = _st()
    return len(st.membership.servers) if st.membership else 0


class Handle(Waitable):
    """A running push_pull. ``synchronize()`` waits and returns the output.

    ``lag`` once it returned: under quorum rounds, how many of the tensor's rounds closed
    after the one answered (the rounds this worker fell behind by; catch them up with
    ``fastps.catch_up``, docs/guide/async.md "Catch-up"); else 0. -1 before the wait returned."""

    def __init__(
        self, st: Session, hid: Optional[int], name: str, out: Any, keep: Sequence[Any]
    ) -> None:
        self._st = st
        self._id = hid  # None while it waits in a submission batch
        self.name = name
        self._out = out
        self._keep = list(keep)
        self._done = False
        self._batch: Optional[_Batch] = None
        self._error: Optional[BaseException] = None
        # Its round for the stall inspector, which tracks what this worker waits for.
        self._round = 0
        self.lag = -1

    def _tracked(self, rnd: int) -> Handle:
        """Tells the stall inspector this is round ``rnd`` of its name, now waiting."""
        if self._st.stall is not None:
            self._round = rnd
            self._st.stall.submitted(self.name, rnd)
        return self

    def _settled(self) -> None:
        if self._round and self._st.stall is not None:
            self._st.stall.finished(self.name, self._round)
            self._round = 0

    def _started(self) -> int:
        """The core's handle id, starting this handle's batch now if it has not started."""
        if self._id is None and self._batch is not None:
            self._batch.flush()
        if self._error is not None:
            raise self._error
        assert self._id is not None
        return self._id

    def poll(self) -> bool:
        if self._done:
            return True
        try:
            done = bool(self._st.worker.poll(self._started()))
        except BaseException:
            self._settled()
            raise
        if done:
            self._settled()
        return done

    def synchronize(self, timeout: Optional[float] = None) -> Any:
        if not self._done:
            try:
                hid = self._started()
            except BaseException:
                self._settled()
                raise
            self._done = True
            try:
                self.lag = int(self._st.worker.wait(hid, timeout or self._st.cfg.op_timeout))
            except (RuntimeError, ValueError) as exc:
                raise _explain(self._st, exc) from None
            finally:
                self._keep = []
                self._settled()
        return self._out

    wait = synchronize

    def abandon(self) -> None:
        """Nobody will wait for this push_pull (its op timed out or was given up): it is
        kept, with the buffers the core may still write into, until the core finishes it
        (``sweep_abandoned``), without blocking any thread. A part the other workers never
        push stays in flight, and the stall inspector keeps naming it."""
        st = self._st
        if self._done or _state is not st:
            return
        try:
            self._started()
        except BaseException:  # noqa: BLE001 - it never started: nothing to keep
            self._settled()
            self._done = True
            return
        with st.abandoned_lock:
            st.abandoned.append(self)
        self._done = True  # __del__ no longer waits; the sweep finishes it

    give_up = abandon  # the name the collectives' group handles call (collectives.give_up)

    def _finish_abandoned(self) -> bool:
        """True once the core finished an abandoned handle (its id is then released)."""
        assert self._id is not None
        worker = self._st.worker
        try:
            if not worker.poll(self._id):
                return False
            worker.wait(self._id, 1.0)  # done already: releases the core's handle
        except Exception as exc:  # noqa: BLE001 - nobody waits for its error
            log.debug("abandoned push_pull of %r ended with %s", self.name, exc)
        self._keep = []
        self._settled()
        return True

    def __del__(self) -> None:
        # The core may still write into the memory this handle keeps alive: hand it to
        # the sweep instead of waiting here, in whichever thread drops it (a blocking wait
        # there held the control receiver or the caller for the op timeout per handle).
        if not self._done and self._id is not None and _state is self._st:
            self.abandon()


class _Batch:
    """push_pulls collected by :func:`submission_batch`, started by one core call."""

    def __init__(self, st: Session) -> None:
        self.st = st
        self.rows: List[Tuple[Any, ...]] = []
        self.handles: List[Handle] = []
        self.names: Dict[str, int] = {}
        # Another thread may synchronize a handle of this batch (and so start it) while
        # the collecting thread still adds to it.
        self.lock = threading.Lock()

    def add(self, row: Tuple[Any, ...], handle: Handle) -> None:
        name = row[4]
        with self.lock:
            if name in self.names:
                raise FastPSError(
                    f"tensor '{name}' appears twice in one submission batch (positions "
                    f"{self.names[name]} and {len(self.rows)}); give each tensor its own name"
                )
            self.names[name] = len(self.rows)
            handle._batch = self
            self.rows.append(row)
            self.handles.append(handle)

    def discard(self, why: str) -> None:
        """Starts nothing: the block that collected these raised."""
        err = FastPSError(f"not started: the submission batch it was part of raised ({why})")
        with self.lock:
            for h in self.handles:
                h._error, h._batch = err, None
            self.rows, self.handles, self.names = [], [], {}

    def flush(self) -> None:
        with self.lock:
            rows, handles = self.rows, self.handles
            self.rows, self.handles, self.names = [], [], {}
            if not rows:
                return
            try:
                ids = self.st.worker.push_pull_group(rows)
            except (RuntimeError, ValueError) as exc:
                err = _explain(self.st, exc)
                for h in handles:
                    h._error, h._batch = err, None
                raise err from None
            for h, hid in zip(handles, ids):
                h._id, h._batch = hid, None


_batching = threading.local()


@contextlib.contextmanager
def submission_batch() -> Iterator[None]:
    """push_pulls started by this thread inside the block start together when it ends.

    Their parts enter the push queues in one step, ordered by priority, so every worker
    pushes them in the same order from the first byte on and the start costs one call into
    the core instead of one per tensor (Horovod's grouped allreduce). All or none start: a
    bad request (a name already in flight, a core error) or an exception inside the block
    fails every handle of the batch. Synchronizing a handle inside the block starts what
    was collected so far. Nested blocks join the outermost.
    """
    if getattr(_batching, "batch", None) is not None:
        yield
        return
    batch = _Batch(_st())
    _batching.batch = batch
    try:
        yield
    except BaseException as exc:
        batch.discard(f"{type(exc).__name__}: {exc}")
        raise
    finally:
        _batching.batch = None
    batch.flush()


# How long a failure the core blames on a peer waits for the scheduler's description.
_ABORT_REASON_WAIT = 2.0


def _explain(st: Session, exc: BaseException) -> FastPSError:
    """Turns a core error into the exception users see, by its type (common/errors.h):
    a core timeout becomes FastPSTimeoutError; a core abort (a peer died or disagreed)
    becomes FastPSAbort, preferring the scheduler's description (which names ranks and
    shapes) when one is on its way; anything else (a bad request) is a FastPSError."""
    msg = str(exc)
    if isinstance(exc, FastPSTimeoutError):
        return FastPSTimeoutError(msg)
    if not isinstance(exc, FastPSAbort):
        return FastPSError(msg)
    client = st.client
    if client is not None:
        deadline = time.monotonic() + _ABORT_REASON_WAIT
        while client.abort_reason is None and time.monotonic() < deadline:
            time.sleep(0.02)
        reason = client.abort_reason
        if reason and reason not in msg:
            msg = f"{reason} ({msg})"
    if _elastic_wire.enabled():
        return WorkerLostError(msg)
    return FastPSAbort(msg)


def _declare(st: Session, name: str, buf: RawBuffer, priority: int, compression: str = "") -> None:
    """Declares (shape, dtype, priority, compression) of a tensor to the scheduler, again
    whenever it changes on this worker, so the scheduler can check every worker agrees."""
    _declare_sig(st, name, buf.shape, buf.dtype, priority, compression)


def _declare_sig(
    st: Session,
    name: str,
    shape: Tuple[int, ...],
    dtype: str,
    priority: int,
    compression: str = "",
) -> None:
    if st.client is None:
        return
    sig = (shape, dtype, priority, compression)
    with st.lock:
        known = st.declared.get(name)
        if known is not None and known[0] == sig:
            return
        version = 0 if known is None else known[1] + 1
        st.declared[name] = (sig, version)
    st.client.declare(name, list(shape), dtype, st.cfg.rank, priority, version, compression)


def auto_name(prefix: str) -> str:
    """Names anonymous tensors by call order, which matches across workers."""
    return f"{prefix}.noname.{next(_st().names)}"


def sweep_abandoned() -> int:
    """Releases the abandoned handles the core has finished; returns how many remain."""
    st = _state
    if st is None:
        return 0
    with st.abandoned_lock:
        pending, st.abandoned = st.abandoned, []
    left = [h for h in pending if not h._finish_abandoned()]
    with st.abandoned_lock:
        st.abandoned[:0] = left
        return len(st.abandoned)


def push_pull_raw(
    in_buf: RawBuffer,
    out_buf: RawBuffer,
    name: str,
    priority: int = 0,
    scale: float = 1.0,
    out: Any = None,
    keep: Sequence[Any] = (),
    declare: bool = True,
    send: bool = True,
    receive: bool = True,
    pushers: int = 0,
    mode: int = 0,
    compression: Any = None,
    quorum: bool = False,
) -> Handle:
    """Lowest-level entry for plugins: buffers already resolved to addresses.

    ``declare=False``: the caller already checked that every worker's tensor agrees
    (``core/collectives/ops.py``), so the scheduler's once-per-name declaration is skipped.
    ``pushers > 0`` routes it (``docs/design/architecture.md``, "Bytes on the wire"): that many
    workers push each part; ``send=False`` only receives the result into ``out_buf``,
    ``receive=False`` only contributes ``in_buf``. ``mode`` (core/worker/async_mode.py): 0 a sum,
    else an exchange with the parameters the servers keep (docs/guide/async.md). ``compression``: a
    :class:`fastps.Compression` choice (docs/guide/compression.md); None: uncompressed.
    ``quorum=True``: a gradient's sum, whose round may close with FASTPS_ROUND_QUORUM
    pushes (docs/guide/async.md); every other sum waits for every worker."""
    st = _st()
    if st.abandoned:
        sweep_abandoned()
    spec = _compression.spec_for(compression, name, in_buf.nbytes, in_buf.dtype)
    if in_buf.nbytes != out_buf.nbytes or in_buf.dtype != out_buf.dtype:
        raise FastPSError(
            f"tensor '{name}': output {out_buf.dtype}{list(out_buf.shape)} does not match input "
            f"{in_buf.dtype}{list(in_buf.shape)}"
        )
    priority = int(priority)
    if declare:
        _declare(st, name, in_buf, priority, spec)
    rec = timeline_recorder.active()
    if rec is not None:
        rec.note(name)
    stall = st.stall
    rnd = st.counts.add(name, stall.in_flight if stall is not None else list)
    st.bytes += in_buf.nbytes
    st.submitted += 1
    if quorum and not mode and st.quorum:
        mode = QUORUM_SUM
    batch: Optional[_Batch] = getattr(_batching, "batch", None)
    if batch is not None and batch.st is st and mode in (0, QUORUM_SUM):
        handle = Handle(st, None, name, out, [in_buf.owner, out_buf.owner, *keep])
        row: Tuple[Any, ...] = (
            in_buf.ptr,
            out_buf.ptr,
            in_buf.nbytes,
            in_buf.dtype,
            name,
            priority,
            float(scale),
        )
        if pushers or spec or mode:
            row = (*row, bool(send), bool(receive), int(pushers))
        if spec or mode:
            row = (*row, spec)
        if mode:
            row = (*row, mode)
        batch.add(row, handle)
        return handle._tracked(rnd)
    try:
        hid = st.worker.push_pull(
            in_buf.ptr,
            out_buf.ptr,
            in_buf.nbytes,
            in_buf.dtype,
            name,
            priority,
            float(scale),
            bool(send),
            bool(receive),
            int(pushers),
            int(mode),
            spec,
        )
    except (RuntimeError, ValueError) as exc:
        raise _explain(st, exc) from None
    return Handle(st, hid, name, out, [in_buf.owner, out_buf.owner, *keep])._tracked(rnd)


# push_pull modes (csrc/worker/handle.h, PushMode): a catch-up fetch, and a gradient's sum
# (a quorum round under FASTPS_ROUND_QUORUM).
QUORUM_FETCH = 4
QUORUM_SUM = 5


def quorum_rounds() -> bool:
    """Whether gradients' sums are quorum rounds (FASTPS_ROUND_QUORUM): a round may close
    without the slowest workers, and a wait may report rounds that closed without this one."""
    return _st().quorum


def quorum_catch_up() -> bool:
    """Whether an optimizer applies the rounds that closed without this worker at once
    (FASTPS_QUORUM_CATCH_UP with quorum rounds; docs/guide/async.md, "Catch-up")."""
    st = _st()
    return st.quorum and st.cfg.quorum_catch_up


def push_pull_inplace_id(
    ptr: int,
    nbytes: int,
    dtype: str,
    shape: Tuple[int, ...],
    name: str,
    priority: int,
    scale: float,
    compression: Any = None,
    fetch: bool = False,
    quorum: bool = False,
) -> int:
    """Starts summing the ``nbytes`` at ``ptr`` in place and returns the core's op id.

    For plugins that keep one record per tensor and reuse it every iteration: no handle
    object is made, so nothing the garbage collector tracks stays alive per tensor while
    the op runs (``docs/guide/torch.md``, "Garbage collection"). The caller keeps the memory
    alive and must finish the op with :func:`wait_id` or :func:`try_wait_id` (or see it
    done with :func:`poll_id`), passing the same ``name``, before it lets go of the memory.

    ``fetch=True`` (quorum rounds, docs/guide/async.md "Catch-up"): pushes nothing and writes into
    ``ptr`` the sum of the tensor's next round, which closed without this worker (a wait
    on an op of this name returned how many rounds did), from the servers' history.
    ``quorum=True``: a gradient's sum (see :func:`push_pull_raw`)."""
    st = _state
    if st is None:
        st = _st()  # raises
    batch = getattr(_batching, "batch", None)
    if batch is not None and batch.st is st:
        raise FastPSError(
            f"tensor '{name}': push_pull_inplace_id cannot start inside a submission batch "
            "(its id exists only once the batch starts); use push_pull_raw there"
        )
    # The per-gradient path of the plugins: every step is paid once per tensor, so the
    # declaration is checked without its lock first and the stall inspector takes one lock.
    spec = "" if compression is None else _compression.spec_for(compression, name, nbytes, dtype)
    if st.client is not None:
        known = st.declared.get(name)
        if known is None or known[0] != (shape, dtype, priority, spec):
            _declare_sig(st, name, shape, dtype, priority, spec)
    rec = timeline_recorder.active()
    if rec is not None:
        rec.note(name)
    stall = st.stall
    rnd = stall.submit(name) if stall is not None else st.counts.add(name)
    st.bytes += nbytes
    st.submitted += 1
    try:
        # positional: pybind matches keyword arguments by name on every call
        hid = st.worker.push_pull(
            ptr,
            ptr,
            nbytes,
            dtype,
            name,
            priority,
            scale,
            True,
            True,
            0,
            QUORUM_FETCH if fetch else QUORUM_SUM if quorum and st.quorum else 0,
            spec,
        )
    except BaseException as exc:
        if stall is not None:
            stall.finished(name, rnd)  # never submitted
        if isinstance(exc, (RuntimeError, ValueError)):
            raise _explain(st, exc) from None
        raise
    return int(hid)


def in_submission_batch() -> bool:
    """True inside a :func:`submission_batch` block of this thread and session."""
    batch = getattr(_batching, "batch", None)
    return batch is not None and batch.st is _state


def _settled_id(st: Session, name: str) -> None:
    """Tells the stall inspector the latest round of ``name`` is no longer waited for."""
    if st.stall is not None:
        st.stall.settle(name)


def poll_id(hid: int, name: str) -> bool:
    """True once the op :func:`push_pull_inplace_id` returned ``hid`` for has finished."""
    st = _st()
    try:
        done = bool(st.worker.poll(hid))
    except BaseException:
        _settled_id(st, name)
        raise
    if done:
        _settled_id(st, name)
    return done


def try_wait_id(hid: int, name: str) -> Optional[int]:
    """:func:`poll_id` and, once the op has finished, :func:`wait_id` in one call: None
    while the op runs; once it has finished and is released (its error raised, as by
    :func:`wait_id`), what :func:`wait_id` returns (the rounds this worker fell behind by
    under quorum rounds, else 0). The op id is no longer valid once this returned a number
    or raised."""
    st = _st()
    worker = st.worker
    try:
        if not worker.poll(hid):
            return None
        # finished: returns at once, releases the op
        lag = int(worker.wait(hid, st.cfg.op_timeout))
    except (RuntimeError, ValueError) as exc:
        _settled_id(st, name)
        raise _explain(st, exc) from None
    except BaseException:
        _settled_id(st, name)
        raise
    _settled_id(st, name)
    return lag


def wait_id(hid: int, name: str, timeout: Optional[float] = None) -> int:
    """Waits for the op ``hid`` of tensor ``name`` (at most ``timeout`` s, default the op
    timeout). Returns how many of the tensor's rounds closed after the one answered: under
    quorum rounds, the rounds this worker fell behind by (fetch them with
    ``push_pull_inplace_id(..., fetch=True)``, docs/guide/async.md "Catch-up"); else 0."""
    st = _st()
    try:
        return int(st.worker.wait(hid, timeout or st.cfg.op_timeout))
    except (RuntimeError, ValueError) as exc:
        raise _explain(st, exc) from None
    finally:
        _settled_id(st, name)


def push_pull_async(
    tensor: Any,
    average: bool = True,
    name: Optional[str] = None,
    priority: int = 0,
    out: Any = None,
    dtype: Optional[str] = None,
    compression: Any = None,
    quorum: bool = False,
) -> Handle:
    """Starts summing (or averaging) ``tensor`` over all workers.

    ``out=None`` allocates a new numpy array for the result; ``out=tensor`` works in place.
    Larger ``priority`` goes first. Equal priorities go in an order fixed by the tensor
    names (a hash), the same on every worker; not in submission order, which can differ
    between workers (docs/design/architecture.md, "Priorities"). Every worker must give a tensor the
    same priority: a disagreement aborts the job with FastPSAbort naming the tensor and both
    priorities. ``dtype`` reinterprets the elements (numpy has no bfloat16: pass uint16 bits
    with "bfloat16"). ``compression``: a :class:`fastps.Compression` choice
    (docs/guide/compression.md); None: uncompressed. ``quorum=True`` marks a gradient: under
    FASTPS_ROUND_QUORUM its round may close without the slowest workers (docs/guide/async.md);
    otherwise, and for every other sum, every worker's push counts.
    """
    st = _st()
    name = name or auto_name("push_pull")
    src = raw_buffer(tensor, f"tensor '{name}'", dtype=dtype)
    if out is None:
        out = np.empty(src.shape, dtype=src.owner.dtype)
    if out is tensor and src.owner.flags.writeable:
        dst = src  # in place: one view serves both
    else:
        dst = raw_buffer(out, f"output of tensor '{name}'", writable=True, dtype=dtype)
    scale = 1.0 / st.cfg.num_workers if average else 1.0
    return push_pull_raw(
        src, dst, name, priority, scale, out=out, compression=compression, quorum=quorum
    )


def push_pull(
    tensor: Any,
    average: bool = True,
    name: Optional[str] = None,
    priority: int = 0,
    out: Any = None,
    dtype: Optional[str] = None,
    compression: Any = None,
    quorum: bool = False,
) -> Any:
    """Sums (or averages) ``tensor`` over all workers and returns the result."""
    return push_pull_async(
        tensor, average, name, priority, out, dtype, compression, quorum
    ).synchronize()


def grouped_push_pull_async(
    tensors: Sequence[Any],
    average: bool = True,
    names: Optional[Sequence[str]] = None,
    priorities: Optional[Sequence[int]] = None,
    outs: Optional[Sequence[Any]] = None,
    compression: Any = None,
    quorum: bool = False,
) -> List[Handle]:
    """Starts a push_pull per tensor, all at once (:func:`submission_batch`).

    ``names``, ``priorities`` and ``outs`` give one entry per tensor when present (an
    ``outs`` entry of None allocates). Returns the handles in the order of ``tensors``.
    """
    count = len(tensors)
    for what, seq in (("names", names), ("priorities", priorities), ("outs", outs)):
        if seq is not None and len(seq) != count:
            raise FastPSError(f"grouped push_pull: {len(seq)} {what} for {count} tensors")
    with submission_batch():
        return [
            push_pull_async(
                t,
                average,
                name=None if names is None else names[i],
                priority=0 if priorities is None else int(priorities[i]),
                out=None if outs is None else outs[i],
                compression=compression,
                quorum=quorum,
            )
            for i, t in enumerate(tensors)
        ]


def grouped_push_pull(
    tensors: Sequence[Any],
    average: bool = True,
    names: Optional[Sequence[str]] = None,
    priorities: Optional[Sequence[int]] = None,
    outs: Optional[Sequence[Any]] = None,
    compression: Any = None,
    quorum: bool = False,
) -> List[Any]:
    """Sums (or averages) every tensor over all workers; returns the outputs in order."""
    handles = grouped_push_pull_async(
        tensors, average, names, priorities, outs, compression, quorum
    )
    return [h.synchronize() for h in handles]


def fusion_enabled() -> bool:
    """True if small tensors may be fused (FASTPS_FUSION_THRESHOLD > 0, servers present)."""
    st = _st()
    return st.cfg.fusion_threshold > 0 and st.cfg.num_workers > 1


def set_fusion_plan(plan: str, tensors: Sequence[Tuple[str, int, str, int]]) -> int:
    """Fuses the small tensors among ``tensors`` ((name, nbytes, dtype, priority) each, as
    they will be pushed) from their next push_pull on; returns the number of buckets.

    Tensors smaller than FASTPS_FUSION_THRESHOLD that are neighbours in the priority order
    travel packed as one tensor, pushed once all of its members were submitted
    (csrc/worker/fusion.h). The plan is a pure function of ``tensors``, so every worker
    must pass the same list, and call this at the same point: replacing plan ``plan``
    pushes the buckets it leaves half-filled, zeros in place of their missing members.
    An empty list removes the plan. A fused tensor's sum arrives only once its whole bucket
    was submitted: start every tensor of the plan before waiting for one (a wait that times
    out names the tensors its bucket still lacks).
    """
    st = _st()
    rows = [(str(n), int(b), str(d), int(p)) for n, b, d, p in tensors]
    try:
        return int(st.worker.set_fusion_plan(plan, rows))
    except (RuntimeError, ValueError) as exc:
        raise _explain(st, exc) from None


def synchronize(handle: Handle) -> Any:
    return handle.synchronize()


def poll(handle: Handle) -> bool:
    return handle.poll()


def broadcast_async(
    tensor: Any, root_rank: int, name: Optional[str] = None, out: Any = None
) -> Handle:
    """Starts copying root_rank's ``tensor`` to every worker (into ``out``, default new).

    Routed (docs/design/architecture.md, "Bytes on the wire"): the root's push is the only
    one that carries data and the others only receive, so the root uploads the tensor once
    and every other worker downloads it once (a zero-filled sum would move n times that)."""
    st = _st()
    n = st.cfg.num_workers
    if not 0 <= root_rank < n:
        raise FastPSError(f"broadcast root_rank {root_rank} is not a rank of this job (size {n})")
    name = name or auto_name("broadcast")
    src = raw_buffer(tensor, f"tensor '{name}'")
    if out is None:
        out = np.empty(src.shape, dtype=src.owner.dtype)
    dst = raw_buffer(out, f"output of tensor '{name}'", writable=True)
    root = st.cfg.rank == root_rank
    if root and dst.ptr != src.ptr:
        np.copyto(dst.owner, src.owner.reshape(dst.owner.shape))
    if n == 1 or not st.cfg.num_servers:
        # Nothing to route through (one worker, or a job without servers): the plain sum
        # of the root's value and the others' zeros.
        if not root:
            dst.owner[...] = 0
        return push_pull_raw(dst, dst, name, 0, 1.0, out=out)
    if root:
        return push_pull_raw(src, dst, name, 0, 1.0, out=out, receive=False, pushers=n)
    return push_pull_raw(dst, dst, name, 0, 1.0, out=out, send=False, pushers=n)


def broadcast(tensor: Any, root_rank: int, name: Optional[str] = None, out: Any = None) -> Any:
    return broadcast_async(tensor, root_rank, name, out).synchronize()


def barrier(timeout: Optional[float] = None) -> None:
    """Returns once every worker has called barrier()."""
    st = _st()
    if st.client is None:
        return
    st.client.barrier(f"barrier.{next(st.barriers)}", timeout or st.cfg.timeout)
