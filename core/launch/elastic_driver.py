"""fastpsrun's elastic driver: worker processes come and go, the job goes on.

The job is a sequence of generations (``rendezvous.py``). The driver

- runs the host discovery script every ``discovery_interval`` seconds and starts a worker
  process for each new slot (up to ``--max-np``); a slot that disappears has its worker
  *drained* when it is in the current generation (Horovod's way: every worker is told, the
  next commit raises ``HostsUpdatedInterrupt`` on every rank after saving, the next
  generation forms without it and its rendezvous answer tells it to exit 0, so nobody rolls
  back; stopped after ``FASTPS_ELASTIC_DRAIN_TIMEOUT`` if it reaches no commit), stopped at
  once otherwise; a slot whose worker failed (``--blacklist slot``) or every slot of its
  host (``--blacklist host``, Horovod's rule) is not used again, or only after a cooldown
  (``--blacklist-cooldown-range``);
- answers each worker's rendezvous: once every live worker asks for a new generation (and
  there are at least ``--min-np``), it starts that generation's scheduler (a thread) and
  servers and gives each worker its rank (survivors keep their order, newcomers come last,
  so rank 0 holds the committed state), and stops the previous generation's;
- tells rank 0, when asked at a commit, whether workers were added or removed since the
  generation formed (``HostsUpdatedInterrupt``), and every worker that watches (``watch``
  requests, ``notifications.py``) as soon as that happens;
- fails the job with a clear message when fewer than ``--min-np`` workers are alive, or
  a rendezvous is incomplete, for longer than ``--elastic-timeout``, or when the world
  would change more than ``--reset-limit`` times;
- keeps ``--spare-hosts`` workers started and waiting (imports done, model built): when a
  worker fails, the next generation gives a spare the failed worker's rank (rank 0 excepted:
  it must be a survivor, which holds the committed state), so the world keeps its size;
- with ``FASTPS_ELASTIC_SERVERS=1``, starts each generation's scheduler with elastic
  servers (a server that dies or joins changes the servers without ending the generation)
  and gives the next generation as many servers as the last one had at its end;
- starts the workers of hosts that are not this machine over ssh, as ``-H`` does
  (``remote_spawn.RemoteSpawner``): each such host is checked first (``remote.preflight``,
  in the background: a slow or dead host holds up nothing), and the rendezvous service,
  schedulers and servers then listen on the address those hosts reach this machine at
  (``--network-interface``'s, else the one their ssh connections come from). ``-H`` or
  ``--hostfile`` with elastic flags is a discovery that never changes (``fixed_hosts``);
  under ``--slurm`` (``elastic_cli``) the transport is srun, no host counts as this machine
  (``local_hosts``: every worker is a step of the allocation) and ``host_check`` refuses a
  discovered host outside the allocation.

A worker the job lost (its process exited, or its scheduler's verdict) is fenced: a later
rendezvous request of that process (a hung one that runs again, or one on a host whose
link healed) is refused with a message naming why it was removed, and it exits; it never
joins a generation formed without it. Only the process a slot's worker was started as
may join with that slot (a request naming a generation the slot's current process never
joined comes from an earlier one).

A worker that dies does not stop the job: its generation's scheduler aborts that generation
(every survivor's pending operation fails), and the survivors come back for the next one.
"""

from __future__ import annotations

import hmac
import math
import random
import secrets
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from fastps.config import (
    DEFAULT_ELASTIC_TIMEOUT,
    DISCOVERY_INTERVAL,
    elastic_discovery_interval,
    format_addr,
    is_loopback_host,
)
from fastps.config import MIN_DISCOVERY_INTERVAL as MIN_DISCOVERY_INTERVAL
from fastps.config import network_interface as stated_interface
from fastps.control import elastic_wire as wire
from fastps.control.protocol import FrameDecoder, compute_mac, encode_frame
from fastps.control.scheduler import Scheduler
from fastps.errors import FastPSError
from fastps.launch import discovery
from fastps.launch.hosts import host_label, is_local_host
from fastps.launch.job import POLL, Child, Launcher, describe_exit, say, signal_group
from fastps.launch.remote import HostInfo, SshTransport, Transport
from fastps.launch.remote_spawn import HostChild, RemoteSpawner

# DEFAULT_ELASTIC_TIMEOUT (Horovod's), DISCOVERY_INTERVAL and MIN_DISCOVERY_INTERVAL are
# fastps.config's, with the variables that override them.
SPARE_STANDBY = 5.0  # a spare's rendezvous request is answered "ask again" this often
REQUEST_READ_TIMEOUT = 10.0  # a client must send its request this soon after connecting
WATCH_WAIT = 20.0  # a watch request is answered at the latest after this long
RESET_LIMIT_MESSAGE = "number of resets exceeded --reset-limit {limit}"
LEAVE_EXIT_TIMEOUT = 30.0  # a drained worker told to leave must exit this soon, else stopped


def discovery_interval(env: Mapping[str, str]) -> float:
    """FASTPS_ELASTIC_DISCOVERY_INTERVAL in ``env``: seconds between runs of the discovery
    script (fastps.config.elastic_discovery_interval reads it)."""
    return elastic_discovery_interval(env)


class _Blacklist:
    """Failed hosts or slots (by key), each out until its cooldown ends (Horovod's rule:
    LO * 2^failures + a random part up to LO, bounded by LO..HI; no range: for good)."""

    def __init__(self, cooldown: Optional[Tuple[float, float]]) -> None:
        self.cooldown = cooldown
        self.failures: Dict[str, int] = {}
        self.until: Dict[str, float] = {}

    def add(self, key: str, now: float) -> float:
        """Blacklists ``key``; returns the seconds until it may come back (inf: never)."""
        if self.cooldown is None:
            self.until[key] = math.inf
            return math.inf
        if self.until.get(key, 0.0) > now:
            return self.until[key] - now  # already cooling down: Horovod does not extend it
        count = self.failures.get(key, 0) + 1
        self.failures[key] = count
        lo, hi = self.cooldown
        delay = max(lo, min(hi, lo * (1 << min(count, 30)) + random.uniform(0, 1) * lo))
        self.until[key] = now + delay
        return delay

    def blocked(self, key: str, now: float) -> bool:
        return self.until.get(key, 0.0) > now


LOCAL_NAMES = {"localhost", "127.0.0.1", "::1"}


def _local_names() -> Set[str]:
    names = set(LOCAL_NAMES)
    try:
        names.add(socket.gethostname())
        names.add(socket.getfqdn())
    except OSError:
        pass
    return names


@dataclass
class _Slot:
    """One worker process, named by its slot ``host:index``."""

    id: str
    host: str
    seq: int  # start order: newcomers are ranked by it
    child: Child
    # running | draining (its slot left the discovery output: it leaves at its next commit)
    # | stopping (being stopped) | done | failed | removed
    state: str = "running"
    ready: bool = False  # asked for a generation at least once
    announced: bool = False  # its arrival was counted as a host update
    spare: bool = False  # started to replace a failed worker, not in any generation yet
    joined: Set[int] = field(default_factory=set)  # generations this process was given
    why: str = ""  # why it left the job (lost, exited, host removed), for its fencing
    drain_since: float = 0.0  # when it began draining (monotonic)
    left_at: Optional[float] = None  # when a draining worker was told to leave (monotonic)

    @property
    def running(self) -> bool:
        return self.state in ("running", "draining", "stopping")


class ElasticLauncher(Launcher):
    """``fastpsrun --min-np A --max-np B --host-discovery-script S CMD`` on this machine."""

    def __init__(
        self,
        command: Sequence[str],
        *,
        discovery_script: str,
        min_np: int,
        max_np: int,
        num_workers: Optional[int] = None,
        num_servers: int = 1,
        elastic_timeout: float = DEFAULT_ELASTIC_TIMEOUT,
        discovery_interval: float = DISCOVERY_INTERVAL,
        reset_limit: Optional[int] = None,
        cooldown_range: Optional[Tuple[float, float]] = None,
        blacklist_scope: str = "slot",
        defer_join: bool = False,
        spares: int = 0,
        fixed_hosts: Optional[Mapping[str, int]] = None,
        transport: Optional[Transport] = None,
        network_interface: Optional[str] = None,
        connect_timeout: float = 5.0,
        python: Optional[str] = None,
        local_hosts: Optional[Sequence[str]] = None,
        host_check: Optional[Callable[[Mapping[str, int]], None]] = None,
        **kwargs: Any,
    ) -> None:
        if min_np < 1:
            raise FastPSError(f"--min-np must be >= 1, got {min_np}")
        if max_np < min_np:
            raise FastPSError(f"--max-np {max_np} is below --min-np {min_np}")
        if num_workers is not None and not min_np <= num_workers <= max_np:
            raise FastPSError(f"-np {num_workers} is outside --min-np {min_np}..--max-np {max_np}")
        if spares < 0:
            raise FastPSError(f"--spare-hosts must be >= 0, got {spares}")
        if not elastic_timeout > 0:
            raise FastPSError(f"--elastic-timeout must be > 0, got {elastic_timeout}")
        if blacklist_scope not in ("slot", "host"):
            raise FastPSError(f"--blacklist must be 'slot' or 'host', got {blacklist_scope!r}")
        if reset_limit is not None and reset_limit < 0:
            raise FastPSError(f"--reset-limit must be >= 0, got {reset_limit}")
        super().__init__(
            command, num_workers=num_workers or min_np, num_servers=num_servers, **kwargs
        )
        self.script = discovery_script
        # -H/--hostfile with elastic flags: the hosts never change (Horovod's fixed discovery).
        self.fixed_hosts = None if fixed_hosts is None else dict(fixed_hosts)
        # The hosts whose workers start without the transport (None: those that are this
        # machine); raises on a discovery output the job cannot use (e.g. outside SLURM's
        # allocation): fatal at the start, later the current hosts are kept.
        self.local_hosts = None if local_hosts is None else set(local_hosts)
        self.host_check = host_check
        self.interface = network_interface or stated_interface(self.base_env)
        self.remote = RemoteSpawner(
            transport or SshTransport(connect_timeout=connect_timeout),
            python,
            connect_timeout,
            self.interface,
        )
        # Hosts that are not this machine: "checking" (its preflight runs), "ok", or why it
        # is left out. A host that leaves the discovery output is checked again if it returns.
        self._host_state: Dict[str, str] = {}
        self._locality: Dict[str, bool] = {}
        self._fenced_said: Set[Tuple[str, int]] = set()  # (slot, worker seq) said once
        self.min_np = min_np
        self.max_np = max_np
        self.initial_np = num_workers or max_np
        self.elastic_timeout = float(elastic_timeout)
        # A removed slot's worker is drained (it leaves at its next commit) for at most this
        # long (FASTPS_ELASTIC_DRAIN_TIMEOUT, bounded by --elastic-timeout); 0: stopped at once.
        self.drain_timeout = min(self.config.elastic_drain_timeout, self.elastic_timeout)
        self.discovery_interval = discovery_interval
        self.reset_limit = reset_limit
        self.blacklist_scope = blacklist_scope
        self.defer_join = defer_join  # new workers interrupt once they can join, not at start
        self.spares = spares
        self.gen_num_servers = num_servers  # servers the next generation starts
        self.blacklist = _Blacklist(cooldown_range)
        self.local_names = _local_names()
        self.cond = threading.Condition()
        self.slots: Dict[str, _Slot] = {}
        self.generation = -1
        self.members: List[str] = []  # the current generation's slot ids, in rank order
        self.assignments: Dict[str, Dict[str, Any]] = {}
        self.waiting: Dict[str, float] = {}  # slot id -> since when it asks for a generation
        # Members of the current generation that asked to stay in place (inplace.py).
        self.in_place_asks: Set[str] = set()
        self.epoch = 0  # bumped whenever a worker is added or removed
        self.added_epochs: Set[int] = set()
        self.gen_epoch = 0  # the epoch the current generation formed at
        self.finishing = False  # a member finished its training: no new generation forms
        self.error: Optional[str] = None
        self.schedulers: List[Scheduler] = []
        self.gen_servers: List[Child] = []
        self.failure_at: Optional[float] = None  # when the last failure was seen
        self.below_min_since: Optional[float] = None
        self._service: Optional[socket.socket] = None
        self._service_addr = ""
        self._refused_hosts: Set[str] = set()
        self._discovery_error: Optional[str] = None
        # The schedulers' verdicts (generation, rank, reason) on workers they lost, queued by
        # the scheduler thread and acted on by the monitor loop (which holds self.cond and
        # may stop that very scheduler: the hook must not take the lock).
        self._verdicts: List[Tuple[int, int, str]] = []
        self._verdict_lock = threading.Lock()

    # ------------------------------------------------------------ environment
    def _child_env(self, role: str, index: int, sched_addr: str) -> Dict[str, str]:
        env = super()._child_env(role, index, sched_addr)
        if self.interface:
            env["FASTPS_IFACE"] = self.interface
        env.update(self._next_env)
        for var in self._drop_env:
            env.pop(var, None)
        return env

    def _spawn_with(
        self,
        role: str,
        index: int,
        argv: List[str],
        sched_addr: str,
        extra: Dict[str, str],
        drop: Sequence[str] = (),
    ) -> Child:
        self._next_env = extra
        self._drop_env = tuple(drop)
        try:
            return self._spawn(role, index, argv, sched_addr)
        finally:
            self._next_env = {}
            self._drop_env = ()

    _next_env: Dict[str, str] = {}
    _drop_env: Sequence[str] = ()

    def _start_worker(self, slot_id: str, host: str, announce: bool, spare: bool = False) -> None:
        """Starts a worker on ``slot_id``. ``announce``: its arrival is a host update now
        (Horovod: the next commit interrupts and the rendezvous waits for it); otherwise
        once it asks to join (a host back from the blacklist first shows it can start)."""
        seq = self._next_seq
        self._next_seq += 1
        extra = {
            wire.ADDR_VAR: self._service_addr,
            wire.ID_VAR: slot_id,
            wire.JOB_VAR: self.job_id,
            "FASTPS_ELASTIC_TIMEOUT": f"{self.rendezvous_timeout:g}",
            "HOROVOD_ELASTIC": "1",
            "HOROVOD_HOSTNAME": host,
        }
        child = self._launch_worker(seq, slot_id, host, extra)
        # A spare is never a host update: it joins only in a failed worker's place.
        announce = announce and not spare
        self.slots[slot_id] = _Slot(slot_id, host, seq, child, announced=announce, spare=spare)
        if announce:
            self._host_update(added=True)
        kind = "spare worker" if spare else "worker"
        say(f"{kind} {seq} started on slot {slot_id} ({self._worker_label(child)})")

    _next_seq = 0

    # The three places a worker is more than a local process. fastps.launch.ray.elastic
    # overrides them to run the same driver with Ray actors as its workers; here a worker
    # is a process group on this machine, or one the agent runs on another (over ssh).
    def _launch_worker(self, seq: int, slot_id: str, host: str, extra: Dict[str, str]) -> Child:
        """Starts worker ``seq`` on ``slot_id`` with the rendezvous variables ``extra``."""
        drop = ("FASTPS_SCHEDULER_ADDR", "FASTPS_RANK", "FASTPS_NUM_WORKERS")
        if self._is_local(host):
            return self._spawn_with("worker", seq, self.command, "", extra, drop)
        self._next_env, self._drop_env = extra, drop
        try:
            env = self._child_env("worker", seq, "")
        finally:
            self._next_env, self._drop_env = {}, ()
        proc = self.remote.start(host, self.command, env)
        child = HostChild("worker", seq, proc, host=host_label(host), remote=True)
        self._forward_output(child)
        self.children.append(child)
        return child

    def _signal_worker(self, slot: _Slot, sig: int) -> None:
        """Sends ``sig`` to the worker of ``slot`` (SIGTERM: stop it). A remote worker is
        stopped by its agent when fastpsrun hangs up on it (SIGTERM, SIGKILL after the
        grace period: a stopped process goes too); other signals do not reach it."""
        child = slot.child
        if isinstance(child, HostChild) and child.remote:
            if sig in (signal.SIGTERM, signal.SIGKILL, signal.SIGINT, signal.SIGHUP):
                self.remote.hang_up(child)
            return
        signal_group(child.pid, sig)

    def _worker_label(self, child: Child) -> str:
        if isinstance(child, HostChild) and child.remote:
            return f"on {child.host}, {self.remote.transport.name} pid {child.pid}"
        return f"pid {child.pid}"

    def _host_update(self, added: bool) -> None:
        """A worker was added or removed: a new host epoch (commits and watchers see it)."""
        self.epoch += 1
        if added:
            self.added_epochs.add(self.epoch)
        self.cond.notify_all()

    def _blacklist_key(self, slot: _Slot) -> str:
        return slot.host if self.blacklist_scope == "host" else slot.id

    def _blacklist_after_failure(self, slot: _Slot, now: float) -> None:
        key = self._blacklist_key(slot)
        delay = self.blacklist.add(key, now)
        what = f"host {key}" if self.blacklist_scope == "host" else f"slot {key}"
        when = "for the rest of the job" if math.isinf(delay) else f"for {delay:.1f} s"
        say(f"{what} blacklisted {when}")
        if self.blacklist_scope != "host":
            return
        for other in self.slots.values():
            if other.state == "running" and other.host == slot.host:
                other.state = "stopping"
                other.why = "its host was blacklisted"
                say(f"stopping the worker on slot {other.id}: its host is blacklisted")
                self._signal_worker(other, signal.SIGTERM)

    # ------------------------------------------------------------ running
    def _start(self) -> None:
        hosts = self._discover_hosts()
        remote = [h for h in hosts if not self._is_local(h)]
        infos: Dict[str, HostInfo] = {}
        if remote:
            self._host_state.update({h: "checking" for h in remote})
            infos = self._check_hosts(remote, self._child_env("worker", 0, ""))
        if self._signal is not None:
            return  # Ctrl-C while the machines were being checked: start nothing
        # With other machines in the job (or an interface named), every service of the job
        # listens on the address they reach this machine at; else on --host-addr.
        self.host_addr = self.remote.advertised_address(infos, remote, self.host_addr)
        if remote or self.interface:
            say(f"rendezvous, schedulers and servers at {self.host_addr}")
        self._open_service()
        with self.cond:
            self._apply_discovery(hosts, limit=self.initial_np)

    # ------------------------------------------------------------ hosts
    def _discover_hosts(self) -> Dict[str, int]:
        """The hosts now: the fixed ones (-H/--hostfile) or the script's (may raise)."""
        if self.fixed_hosts is not None:
            hosts = dict(self.fixed_hosts)
        else:
            hosts = discovery.discover(self.script)
        if self.host_check is not None:
            self.host_check(hosts)
        return hosts

    def _is_local(self, host: str) -> bool:
        """Whether ``host`` is this machine (its workers start without ssh); resolved once
        per name, bounded in time."""
        if self.local_hosts is not None:
            return host in self.local_hosts
        if host in self.local_names:
            return True
        known = self._locality.get(host)
        if known is None:
            known = is_local_host(host)
            self._locality[host] = known
        return known

    def _check_hosts(self, hosts: Sequence[str], env: Dict[str, str]) -> Dict[str, HostInfo]:
        """Checks each remote host (in parallel, bounded) with a worker's environment
        ``env``; a host that fails is left out of the job, said with its problem. Returns
        the hosts that passed."""
        infos: Dict[str, HostInfo] = {}
        lock = threading.Lock()

        def one(host: str) -> None:
            try:
                info = self.remote.check([host], env)[host]
            except FastPSError as exc:
                problem = str(exc).splitlines()[-1].strip()
                with self.cond:
                    self._host_state[host] = problem
                say(
                    f"{problem}: its slots are left out of the job (checked again if it "
                    "leaves the discovery output and comes back)"
                )
                return
            with lock:
                infos[host] = info
            with self.cond:
                self._host_state[host] = "ok"
                self.cond.notify_all()

        threads = [threading.Thread(target=one, args=(h,), daemon=True) for h in hosts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return infos

    def _check_later(self, host: str) -> None:
        """Starts the check of a host that appeared in the discovery output; its slots are
        used once it passes (at a later run of the discovery)."""
        self._host_state[host] = "checking"
        say(f"checking new host {host_label(host)}")
        env = self._child_env("worker", 0, "")  # here: _spawn_with changes what it returns
        threading.Thread(
            target=self._check_hosts, args=([host], env), name="fastps-host-check", daemon=True
        ).start()

    def _usable_hosts(self, hosts: Mapping[str, int]) -> Dict[str, int]:
        """The hosts of a discovery output whose slots may get workers now."""
        for host in list(self._host_state):
            if host not in hosts and self._host_state[host] != "checking":
                del self._host_state[host]  # gone: checked again if it comes back
        usable: Dict[str, int] = {}
        for host, n in hosts.items():
            if self._is_local(host):
                usable[host] = n
                continue
            state = self._host_state.get(host)
            if state == "ok":
                usable[host] = n
            elif state is not None:
                continue  # being checked, or left out (said)
            elif is_loopback_host(self.host_addr):
                if host not in self._refused_hosts:
                    self._refused_hosts.add(host)
                    say(
                        f"host {host_label(host)} from the discovery script ignored: the job's "
                        f"services listen on {self.host_addr}, which other machines cannot "
                        "reach (every host it printed at the start was this machine); give "
                        "--network-interface to let other machines join later"
                    )
            else:
                self._check_later(host)
        return usable

    def _monitor(self) -> int:
        next_discovery = time.monotonic() + self.discovery_interval
        while True:
            if self._signalled():
                return self._interrupted()
            now = time.monotonic()
            hosts = None
            if now >= next_discovery and not self.finishing:
                # Outside the lock: a slow script must not hold up rendezvous answers.
                hosts = self._discover()
                next_discovery = time.monotonic() + self.discovery_interval
            with self.cond:
                self._act_on_verdicts(now)
                self._reap(now)
                self._check_drains(now)
                if hosts is not None and not self.finishing:
                    self._apply_discovery(hosts, limit=self.max_np)
                self._maybe_form(now)
                if self.error is not None:
                    self.cond.notify_all()
                    say(self.error)
                    self._stop_generation()
                    self._terminate_all()
                    return 1
                if not any(s.running for s in self.slots.values()):
                    return self._finish()
            time.sleep(POLL)

    def _finish(self) -> int:
        members = [self.slots[i] for i in self.members]
        bad = [s for s in members if s.state != "done"]
        self._stop_generation()
        if self.finishing and not bad:
            say(f"elastic job finished: {len(members)} workers in generation {self.generation}")
            return 0
        if not members:
            ended = [s for s in self.slots.values() if s.state != "removed"]
            if ended and all(s.state == "done" for s in ended):
                # A command that never joins (`python -V`, a sanity check) succeeded, as it
                # does without --min-np.
                say(f"every worker finished without joining the job ({len(ended)} exited 0)")
                return 0
            say("every worker ended before a generation formed")
            return 1
        say(
            "elastic job failed: "
            + ", ".join(f"worker on slot {s.id} ({s.state})" for s in bad or members)
        )
        return 1

    def _on_node_lost(self, generation: int, role: str, node_id: int, reason: str) -> None:
        if role == "worker":
            with self._verdict_lock:
                self._verdicts.append((generation, node_id, reason))

    def _act_on_verdicts(self, now: float) -> None:
        """A worker the scheduler declared lost leaves the job now, whether its process has
        exited or not (hung, stopped, cut off): the next generation forms from the live
        workers without waiting for it. Its process is told to stop (SIGTERM to its group;
        a stopped or hung one gets it when it runs again, and the generation it knew is gone
        by then: its scheduler and servers are stopped, so nothing of it reaches the new one)."""
        with self._verdict_lock:
            verdicts, self._verdicts = self._verdicts, []
        for generation, rank, reason in verdicts:
            if generation != self.generation or not 0 <= rank < len(self.members):
                continue
            slot = self.slots[self.members[rank]]
            if slot.state == "draining" and slot.left_at is None:
                self._stop_draining(slot, now, f"it was lost before its next commit: {reason}")
                continue
            if slot.state != "running":
                continue
            slot.state = "failed"
            slot.why = f"lost in generation {generation}: {reason}"
            slot.child.reported = True
            self._host_update(added=False)
            self.failure_at = now
            self.waiting.pop(slot.id, None)
            label = self._worker_label(slot.child)
            say(
                f"worker on slot {slot.id} (rank {rank}, {label}) lost: {reason}; "
                "the job goes on without it"
            )
            self._signal_worker(slot, signal.SIGTERM)
            self._signal_worker(slot, signal.SIGCONT)  # a stopped process must run to exit
            self._blacklist_after_failure(slot, now)
            alive = sum(1 for x in self.slots.values() if x.state == "running")
            say(f"the job goes on with {alive} workers")
            self.cond.notify_all()

    def _reap(self, now: float) -> None:
        for s in self.slots.values():
            if not s.running:
                continue
            rc = s.child.proc.poll()
            if rc is None:
                continue
            s.child.reported = True
            label = self._worker_label(s.child)
            if s.state == "stopping":
                s.state = "removed"
                s.why = s.why or "stopped by fastpsrun"
            elif s.state == "draining" and s.left_at is not None:
                s.state = "removed"  # it left at a commit, told by its rendezvous answer
                say(f"drained worker on slot {s.id} ({label}) {describe_exit(rc)}")
            elif s.state == "draining" and rc != 0:
                # It ended before its next commit: its generation fails (the others roll
                # back to their last commit), as any failure does; its slot is gone anyway.
                s.state = "removed"
                s.why = f"{s.why}; it {describe_exit(rc)} before its next commit"
                self.failure_at = now
                say(
                    f"worker on slot {s.id} ({label}) {describe_exit(rc)} while it drained "
                    "(before its next commit): the others roll back to their last commit"
                )
            elif rc == 0:
                s.state = "done"
                if s.id in self.members:
                    self.finishing = True
            elif s.spare:
                s.state = "failed"  # not in any generation: nobody's operations fail
                s.why = describe_exit(rc)
                label = self._worker_label(s.child)
                say(f"spare worker on slot {s.id} ({label}) {describe_exit(rc)}")
            else:
                s.state = "failed"
                s.why = describe_exit(rc)
                self._host_update(added=False)
                self.failure_at = now
                say(f"worker on slot {s.id} ({self._worker_label(s.child)}) {describe_exit(rc)}")
                self._blacklist_after_failure(s, now)
                alive = sum(1 for x in self.slots.values() if x.state == "running")
                say(f"the job goes on with {alive} workers")
            self.waiting.pop(s.id, None)
            self.cond.notify_all()
        if self.finishing:
            # Workers not in the finishing generation (still starting, or waiting to join)
            # would train alone from scratch: stop them.
            for s in self.slots.values():
                if s.state == "running" and s.id not in self.members:
                    s.state = "stopping"
                    self._signal_worker(s, signal.SIGTERM)

    def _check_drains(self, now: float) -> None:
        """Stops a draining worker that reached no commit within the drain timeout (its
        generation then fails, and the others roll back to their last commit), and one told
        to leave that did not exit within LEAVE_EXIT_TIMEOUT (it left its generation: the
        others lose nothing)."""
        for s in self.slots.values():
            if s.state != "draining":
                continue
            if s.left_at is not None:
                if now - s.left_at > LEAVE_EXIT_TIMEOUT:
                    s.state = "stopping"
                    say(
                        f"drained worker on slot {s.id} ({self._worker_label(s.child)}) still "
                        f"runs {LEAVE_EXIT_TIMEOUT:g} s after it was told to leave: stopping it"
                    )
                    self._signal_worker(s, signal.SIGTERM)
            elif now - s.drain_since > self.drain_timeout:
                self._stop_draining(
                    s,
                    now,
                    f"it reached no commit within the drain timeout of {self.drain_timeout:g} s "
                    f"({self._drain_limit_source()})",
                )

    def _drain_limit_source(self) -> str:
        if self.drain_timeout < self.config.elastic_drain_timeout:
            return "--elastic-timeout, shorter than FASTPS_ELASTIC_DRAIN_TIMEOUT"
        return "FASTPS_ELASTIC_DRAIN_TIMEOUT"

    def _stop_draining(self, slot: _Slot, now: float, why: str) -> None:
        """A draining worker that cannot leave at a commit is stopped as a removed worker
        was before drains existed: its generation fails and the others roll back."""
        slot.state = "stopping"
        slot.why = f"{slot.why}; {why}"
        self.failure_at = now
        say(
            f"worker on slot {slot.id} ({self._worker_label(slot.child)}): {slot.why}; "
            "stopping it, the others roll back to their last commit"
        )
        self._signal_worker(slot, signal.SIGTERM)
        self._signal_worker(slot, signal.SIGCONT)  # a stopped process must run to exit
        self.cond.notify_all()

    def _discover(self) -> Optional[Dict[str, int]]:
        """The discovery script's hosts, or None (said once) when it fails."""
        try:
            hosts = self._discover_hosts()
            for host in hosts:
                self._is_local(host)  # resolved here, outside the lock
        except FastPSError as exc:
            if str(exc) != self._discovery_error:
                say(f"{exc}; keeping the current hosts")
            self._discovery_error = str(exc)
            return None
        self._discovery_error = None
        return hosts

    def _apply_discovery(self, hosts: Dict[str, int], limit: int) -> None:
        usable = self._usable_hosts(hosts)
        offered = [f"{h}:{i}" for h, i in discovery.slots(usable)]
        hostof = {f"{h}:{i}": h for h, i in discovery.slots(usable)}
        now = time.monotonic()
        for s in self.slots.values():
            if s.state == "running" and s.id not in hostof:
                self._remove(s, f"host {host_label(s.host)}" if s.host not in hosts else None, now)
        # A draining worker leaves at its next commit: its slot may get a new worker now.
        alive = sum(
            1 for s in self.slots.values() if s.state in ("running", "stopping") and not s.spare
        )
        spares = sum(1 for s in self.slots.values() if s.running and s.spare)
        # Spares about to take the places of failed (or draining) members count as workers.
        holes = sum(
            1 for sid in self.members if self.slots[sid].state not in ("running", "stopping")
        )
        for slot_id in offered:
            if alive + min(spares, holes) >= limit and spares >= self.spares:
                break
            old = self.slots.get(slot_id)
            if old is not None and old.state in ("running", "draining", "stopping", "done"):
                continue
            host = hostof[slot_id]
            key = host if self.blacklist_scope == "host" else slot_id
            if self.blacklist.blocked(key, now):
                continue  # failed (or its host did): out for good, or until its cooldown ends
            resurrected = key in self.blacklist.until
            if resurrected and old is not None and old.state == "failed":
                say(f"slot {slot_id}: its blacklist cooldown ended, starting a worker again")
            announce = self.generation >= 0 and not resurrected and not self.defer_join
            if alive + min(spares, holes) < limit:
                self._start_worker(slot_id, host, announce=announce)
                alive += 1
            else:
                self._start_worker(slot_id, host, announce=False, spare=True)
                spares += 1

    def _remove(self, slot: _Slot, host: Optional[str], now: float) -> None:
        """``slot`` (or its whole ``host``) left the discovery output. A worker of the current
        generation is drained (Horovod's way): the workers are told (a new host epoch), the
        next commit raises ``HostsUpdatedInterrupt`` on every rank after saving, and its
        rendezvous answer then tells it to exit 0 while the others form the next generation
        without it: nobody rolls back. Bounded by the drain timeout (``_check_drains``).
        Any other worker (starting, waiting to join, a spare) holds nothing: stopped now."""
        reason = f"{host or 'slot ' + slot.id} left the discovery output"
        slot.why = reason
        if not slot.spare:
            self._host_update(added=False)
        label = self._worker_label(slot.child)
        if (
            self.drain_timeout > 0
            and not slot.spare
            and slot.id in self.members
            and not self.finishing
        ):
            slot.state = "draining"
            slot.drain_since = now
            say(
                f"{reason}: its worker on slot {slot.id} ({label}) leaves the job at its next "
                f"commit (drained, the others do not roll back; drain timeout "
                f"{self.drain_timeout:g} s)"
            )
            return
        slot.state = "stopping"
        say(f"{reason}: stopping its worker on slot {slot.id} ({label})")
        self._signal_worker(slot, signal.SIGTERM)

    # ------------------------------------------------------------ generations
    def _maybe_form(self, now: float) -> None:
        alive = [s for s in self.slots.values() if s.state == "running" and not s.spare]
        ready_spares = self._ready_spares() if self.members else []
        if len(alive) + len(ready_spares) < self.min_np and not self.finishing:
            if self.below_min_since is None:
                self.below_min_since = now
            elif now - self.below_min_since > self.elastic_timeout:
                self.error = (
                    f"only {len(alive)} workers for more than --elastic-timeout "
                    f"{self.elastic_timeout:g} s, below --min-np {self.min_np}: stopping the job"
                )
            return
        self.below_min_since = None
        # Spares wait all the time: they neither start a generation nor time one out.
        asking = [t for sid, t in self.waiting.items() if not self.slots[sid].spare]
        if not asking or self.finishing:
            return
        missing = [s for s in alive if s.id not in self.waiting]
        if not missing:
            self._form(alive)
            return
        if now - min(asking) > self.rendezvous_timeout:
            self.error = (
                f"rendezvous incomplete after {self.rendezvous_timeout:g} s (the longer of "
                f"--elastic-timeout and --timeout): workers on slots "
                f"{', '.join(s.id for s in missing)} did not come"
            )

    def _ready_spares(self) -> List[_Slot]:
        """Spares that asked for a generation (their start-up is done), oldest first."""
        out = [s for s in self.slots.values() if s.state == "running" and s.spare]
        return sorted((s for s in out if s.id in self.waiting), key=lambda s: s.seq)

    def _seat(self, alive: List[_Slot]) -> List[_Slot]:
        """The next generation's workers in rank order: survivors keep their relative order,
        a ready spare takes the rank of a failed (or removed) worker, newcomers come last.
        Rank 0 is never a spare's (``sync()`` broadcasts from rank 0, which must hold the
        committed state): a spare replacing rank 0 comes after the survivors."""
        seats: List[Optional[_Slot]] = []
        for sid in self.members:
            member = self.slots[sid]
            seats.append(member if member.state == "running" else None)
        spares = self._ready_spares() if self.members else []
        room = self.max_np - len(alive)
        late: List[_Slot] = []
        for i, seat in enumerate(seats):
            if seat is not None or not spares or room <= 0:
                continue
            spare = spares.pop(0)
            room -= 1
            say(f"spare worker on slot {spare.id} replaces the worker on slot {self.members[i]}")
            if i > 0 and seats[0] is not None:
                seats[i] = spare
            else:
                late.append(spare)
        order = [x for x in seats if x is not None] + late
        for x in order:
            x.spare = False
        known = {x.id for x in order}
        order += sorted((x for x in alive if x.id not in known), key=lambda x: x.seq)
        return order

    def _server_count(self) -> int:
        """Servers for the next generation: with elastic servers, as many as the current
        one has now (a server that died is not replaced, one that joined counts)."""
        if self.config.elastic_servers and self.scheduler is not None:
            now = self.scheduler.server_count()
            if now is not None:
                self.gen_num_servers = max(1, now)
        return self.gen_num_servers

    def _in_place_refusal(self, order: List[_Slot], spares: Set[str]) -> Optional[str]:
        """Why the generation formed with ``order`` cannot keep the survivors in place
        (core/elastic/inplace.py; None: it can): every member of the last generation
        that is alive asked to, each kept its rank, the lost ranks went to spares that
        were ready, and rank 0 survived (it serves the commit)."""
        if not self.members:
            return "the first generation"
        if len(order) != len(self.members):
            return f"the world changes size ({len(self.members)} -> {len(order)} workers)"
        if order[0].id != self.members[0]:
            return "rank 0 was lost (its place goes to a survivor, every rank moves)"
        for rank, (old, new) in enumerate(zip(self.members, order)):
            if new.id == old:
                if old not in self.in_place_asks:
                    return f"rank {rank} (slot {old}) asked for a rollback"
            elif new.id not in spares:
                return f"rank {rank} goes to slot {new.id}, not a spare"
        if all(new.id == old for old, new in zip(self.members, order)):
            return "no worker was replaced"
        return None

    def _form(self, alive: List[_Slot]) -> None:
        spare_ids = {s.id for s in self.slots.values() if s.spare}
        order = self._seat(alive)
        refusal = self._in_place_refusal(order, spare_ids)
        if self.in_place_asks:
            say(
                "in-place replacement: "
                + (f"refused ({refusal}): the survivors roll back" if refusal else "granted")
            )
        self.in_place_asks = set()
        g = self.generation + 1
        if self.reset_limit is not None and g > self.reset_limit:
            # Horovod's --reset-limit: generation g is the g-th reset of the world.
            self.error = "elastic job stopped: " + RESET_LIMIT_MESSAGE.format(
                limit=self.reset_limit
            )
            return
        num_servers = self._server_count()
        self._stop_generation()
        job = f"{self.job_id}-g{g}"
        elastic_servers = self.config.elastic_servers
        sched = Scheduler(
            num_workers=len(order),
            num_servers=num_servers,
            job_id=job,
            token=self.token,
            host=self.host_addr,
            port=0,
            timeout=self.timeout,
            heartbeat_timeout=self.config.heartbeat_timeout,
            auth_timeout=self.config.handshake_timeout,
            elastic_servers=elastic_servers,
        )
        sched.on_abort = lambda reason, g=g: say(f"generation {g} ends: {reason}")
        sched.on_node_lost = lambda role, nid, why, g=g: self._on_node_lost(g, role, nid, why)
        sched.start()
        self.scheduler = sched
        self.schedulers.append(sched)
        extra = {
            "FASTPS_JOB_ID": job,
            "FASTPS_NUM_WORKERS": str(len(order)),
            "FASTPS_NUM_SERVERS": str(num_servers),
        }
        if elastic_servers:
            # A server started by hand joins the generation running when it starts.
            self._next_env = extra
            try:
                self._write_server_env(sched.address_text, announce=g == 0)
            finally:
                self._next_env = {}
        self.gen_servers = [
            self._spawn_with(
                "server", sid, [self._python(), "-m", "fastps.server"], sched.address_text, extra
            )
            for sid in range(num_servers)
        ]
        hosts: List[str] = []
        for s in order:
            if s.host not in hosts:
                hosts.append(s.host)
        self.assignments = {}
        for rank, s in enumerate(order):
            local = [x.id for x in order if x.host == s.host]
            self.assignments[s.id] = {
                "type": "assignment",
                "generation": g,
                "rank": rank,
                "size": len(order),
                "local_rank": local.index(s.id),
                "local_size": len(local),
                "cross_rank": hosts.index(s.host),
                "cross_size": len(hosts),
                "scheduler": sched.address_text,
                "job_id": job,
                "num_servers": num_servers,
                "in_place": refusal is None,
                "in_place_refused": refusal or "",
            }
        self.generation = g
        self.members = [s.id for s in order]
        for s in order:
            s.joined.add(g)
        self.gen_epoch = self.epoch
        # Spares not seated keep waiting for the next failure.
        self.waiting = {k: t for k, t in self.waiting.items() if self.slots[k].spare}
        after = ""
        if self.failure_at is not None:
            after = f", {time.monotonic() - self.failure_at:.2f} s after the failure"
            self.failure_at = None
        say(f"generation {g}: {len(order)} workers ({', '.join(self.members)}){after}")
        pids = ", ".join(f"{c.index} (pid {c.pid})" for c in self.gen_servers)
        say(f"generation {g}: servers {pids}")
        self.cond.notify_all()

    @staticmethod
    def _python() -> str:
        import sys

        return sys.executable

    def _terminate_all(self) -> None:
        self.remote.hang_up_all(self.children)  # EOF: each agent stops its process group
        super()._terminate_all()

    def _stop_generation(self) -> None:
        """Stops the current generation's scheduler and servers (its workers left it)."""
        if self.scheduler is not None:
            self.scheduler.stop()
        for c in self.gen_servers:
            signal_group(c.pid, signal.SIGTERM)
        self.gen_servers = []

    def _interrupted(self) -> int:
        with self.cond:
            self.error = "fastpsrun was interrupted"
            self.cond.notify_all()
        return super()._interrupted()

    def _cleanup(self) -> None:
        with self.cond:
            if self.error is None:
                self.error = "the elastic job ended"
            self.cond.notify_all()
        if self._service is not None:
            try:
                self._service.close()
            except OSError:
                pass
        super()._cleanup()
        for sched in self.schedulers:
            sched.stop()
            sched.join(timeout=3.0)
        self.remote.sweep(self.job_id)  # what is left of the job on the other machines

    # ------------------------------------------------------------ rendezvous service
    def _open_service(self) -> None:
        sock = socket.create_server((self.host_addr, 0), backlog=128)
        self._service = sock
        self._service_addr = format_addr(self.host_addr, sock.getsockname()[1])
        threading.Thread(target=self._accept_loop, name="fastps-elastic", daemon=True).start()

    def _accept_loop(self) -> None:
        assert self._service is not None
        while True:
            try:
                conn, _ = self._service.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve_one, args=(conn,), daemon=True).start()

    def _serve_one(self, conn: socket.socket) -> None:
        with conn:
            try:
                nonce = secrets.token_bytes(16)
                conn.sendall(encode_frame({"type": "hello", "nonce": nonce.hex()}))
                msg = wire.recv_message(
                    conn, FrameDecoder(wire.MAX_FRAME), time.monotonic() + REQUEST_READ_TIMEOUT
                )
                want = compute_mac(self.token, nonce, self.job_id)
                if not hmac.compare_digest(str(msg.get("mac", "")), want):
                    conn.sendall(
                        encode_frame({"type": "error", "message": "authentication failed"})
                    )
                    return
                answer = self._answer(msg)
                conn.sendall(encode_frame(answer))
            except (OSError, FastPSError):
                return

    def _answer(self, msg: Dict[str, Any]) -> Dict[str, Any]:
        kind = msg.get("type")
        if kind == "updates":
            with self.cond:
                gen = msg.get("generation")
                updated = gen != self.generation or self.epoch > self.gen_epoch
                added = any(e > self.gen_epoch for e in self.added_epochs)
                # Members that leave at this commit: every rank syncs before they go.
                draining = gen == self.generation and any(
                    self.slots[sid].state == "draining" and self.slots[sid].left_at is None
                    for sid in self.members
                )
                return {
                    "type": "updates",
                    "updated": bool(updated),
                    "removed_only": bool(updated and not added),
                    "epoch": self.epoch,
                    "draining": draining,
                }
        if kind == "watch":
            return self._watch(msg.get("after"))
        if kind == "rendezvous":
            return self._rendezvous(
                str(msg.get("id", "")),
                int(msg.get("after", -1)),
                bool(msg.get("in_place")),
                int(msg.get("commits", -1)),
            )
        return {"type": "error", "message": f"unknown request {kind!r}"}

    def _watch(self, after: Any) -> Dict[str, Any]:
        """Answers once the host epoch passes ``after`` (None: at once, with the current
        epoch), at the latest after WATCH_WAIT: which kinds of update happened since."""
        deadline = time.monotonic() + WATCH_WAIT
        with self.cond:
            since = self.epoch if after is None else int(after)
            while after is not None and self.epoch <= since and self.error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(min(left, 1.0))
            added = sum(1 for e in self.added_epochs if since < e <= self.epoch)
            return {
                "type": "watch",
                "epoch": self.epoch,
                "added": added > 0,
                "removed": self.epoch - since > added,
            }

    @property
    def rendezvous_timeout(self) -> float:
        """How long a rendezvous waits for a live worker. At least the registration timeout
        (--timeout): a worker may still be starting (imports, model building; slow on a
        loaded machine), and one that failed takes a moment to exit. Horovod's elastic
        timeout, too, bounds the wait for enough hosts, not for a process."""
        return max(self.elastic_timeout, self.timeout)

    def _fence(self, slot_id: str, slot: Optional[_Slot], after: int) -> Optional[str]:
        """Why a rendezvous request from ``slot_id`` that last joined generation ``after``
        is refused (None: it is not): its worker left the job (it was lost, exited or was
        stopped; a hung process that runs again, or one whose host's link healed, asks
        afterwards), or the request comes from an earlier process on a slot whose worker
        was started again (it names a generation the current process never joined)."""
        if slot is None:
            return f"slot {slot_id!r} is not a worker of this job (no worker was started on it)"
        if slot.state in ("running", "draining") and (after < 0 or after in slot.joined):
            return None
        if slot.state in ("running", "draining"):
            why = (
                f"a newer worker runs on the slot; this process last joined generation {after}, "
                "which the newer one never did"
            )
        else:
            why = f"its worker left the job ({slot.why or slot.state})"
        message = (
            f"slot {slot_id!r} is not a worker of this job: {why}; the job went on without "
            f"this process (now in generation {self.generation}), which must exit"
        )
        if (slot_id, slot.seq) not in self._fenced_said:
            self._fenced_said.add((slot_id, slot.seq))
            say(
                f"fenced: a process of slot {slot_id} asked to join after generation {after}; "
                f"refused: {why}"
            )
        return message

    def _rendezvous(
        self, slot_id: str, after: int, in_place: bool = False, commits: int = -1
    ) -> Dict[str, Any]:
        deadline = time.monotonic() + self.rendezvous_timeout + 10.0
        with self.cond:
            slot = self.slots.get(slot_id)
            refusal = self._fence(slot_id, slot, after)
            if refusal is not None:
                return {"type": "error", "message": refusal}
            assert slot is not None
            if slot.state == "draining" and not self._assigned(slot_id, after):
                return self._leave(slot, commits)
            self.waiting.setdefault(slot_id, time.monotonic())
            if in_place:
                self.in_place_asks.add(slot_id)
            if not slot.ready:
                slot.ready = True
                if slot.spare:
                    say(f"spare worker on slot {slot_id} is ready")
                elif not slot.announced:
                    # A worker not announced when it started (the first ones, or one on a
                    # host back from the blacklist) is a host update once it can join: the
                    # others keep training while it starts (imports, model building).
                    slot.announced = True
                    self._host_update(added=True)
            standby = time.monotonic() + SPARE_STANDBY
            while True:
                if self._assigned(slot_id, after):
                    return dict(self.assignments[slot_id])
                if slot.state == "draining":
                    return self._leave(slot, commits)
                if slot.spare and slot.state == "running" and time.monotonic() > standby:
                    return {"type": "standby"}  # asks again: its wait has no end
                if self.error is not None:
                    return {"type": "error", "message": self.error}
                if self.finishing:
                    return {"type": "error", "message": "the elastic job finished"}
                left = deadline - time.monotonic()
                if left <= 0:
                    return {"type": "error", "message": "no generation formed in time"}
                self.cond.wait(min(left, 1.0))

    def _assigned(self, slot_id: str, after: int) -> bool:
        """Whether a generation after ``after`` formed with ``slot_id`` in it."""
        return self.generation > after and slot_id in self.assignments

    def _leave(self, slot: _Slot, commits: int) -> Dict[str, Any]:
        """The answer to a draining worker's rendezvous: it committed and left its
        generation; it exits 0 (``fastps.elastic.rendezvous.Drained``)."""
        self.waiting.pop(slot.id, None)
        self.in_place_asks.discard(slot.id)
        now = time.monotonic()
        if slot.left_at is None:
            slot.left_at = now
            after = f"commit {commits}" if commits >= 0 else "its last commit"
            say(
                f"worker on slot {slot.id} ({self._worker_label(slot.child)}) drained: "
                f"{slot.why}; it stops after {after} and exits, the others go on without a "
                f"rollback ({now - slot.drain_since:.2f} s after it began draining)"
            )
        self.cond.notify_all()
        return {"type": "leave", "reason": slot.why, "generation": self.generation}
