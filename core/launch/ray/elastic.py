"""The elastic form of ``RayExecutor`` (``min_workers``/``max_workers``): fastpsrun's elastic
driver with Ray actors as its workers.

The driver is :class:`fastps.launch.elastic_driver.ElasticLauncher`, unchanged in what it
decides: slots, generations, the rendezvous service the workers ask for their next
generation (an authenticated TCP port of this process), the blacklist, ``--min-np``,
``--elastic-timeout`` and ``--reset-limit``. Each generation's scheduler is a thread of this
process and its servers are this process's children, as under fastpsrun; both go away with
the generation (and with this process: the servers get their parent's death signal).

What differs is where a worker runs. :class:`RayElasticDriver` overrides the driver's three
worker hooks:

- the slots come from the cluster, not a discovery script: every alive node offers as many
  slots (``<node ip>:<i>``) as its resources hold workers of ``cpus_per_worker`` /
  ``gpus_per_worker``, asked again every ``discovery_interval`` (a node that joins the
  cluster adds slots, up to ``max_workers``);
- a worker is a :class:`~fastps.launch.ray.actors.WorkerActor` pinned to its slot's node,
  with the rendezvous variables in its environment, running the user's function (which
  uses ``hvd.elastic.run``) as one Ray task;
- its "process" is that task: still running, returned (exit 0) or failed; a killed actor
  (``ray.kill``, a lost node) is a worker killed by SIGKILL, a function that raised one that
  exited with code 1; stopping a worker is ``ray.kill``.
"""

from __future__ import annotations

import math
import signal
import subprocess
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, cast

from fastps.config import DEFAULT_ELASTIC_TIMEOUT
from fastps.errors import FastPSError
from fastps.launch.elastic_driver import ElasticLauncher, _Slot
from fastps.launch.job import Child, say
from fastps.launch.ray.actors import WorkerActor

__all__ = ["RayElasticDriver", "run_elastic"]

DISCOVERY_INTERVAL = 2.0  # s between looks at the cluster's nodes for new slots
START_POLL = 0.5  # s between looks while start waits for min_workers' resources
UNBOUNDED = 1 << 20  # max_workers=None: as many workers as the cluster has slots for

# The variables an actor gets from the driver's worker environment: fastps's and Horovod's
# (the actor's own environment is its Ray worker's, not the driver's).
ACTOR_ENV_PREFIXES = ("FASTPS_", "HOROVOD_")
NOT_FOR_ACTORS = ("FASTPS_SCHEDULER_ADDR", "FASTPS_RANK", "FASTPS_NUM_WORKERS")
JOB_OWNED = frozenset(
    ("FASTPS_ROLE", "FASTPS_JOB_ID", "FASTPS_TOKEN", "FASTPS_NUM_SERVERS", "FASTPS_HOST")
    + ("FASTPS_TIMEOUT", "FASTPS_LAUNCHER", *NOT_FOR_ACTORS)
)

# The driver words its errors with fastpsrun's flags; RayExecutor's callers know these names.
FLAG_NAMES = {
    "--min-np": "min_workers",
    "--max-np": "max_workers",
    "--elastic-timeout": "elastic_timeout",
    "--reset-limit": "reset_limit",
    "--timeout": "timeout_s",
}


def _in_ray_terms(message: str) -> str:
    for flag, name in FLAG_NAMES.items():
        message = message.replace(flag, name)
    return message


def run_elastic(fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    """What a worker actor runs: the user's function, then it leaves its generation (a
    fastpsrun worker leaves when its process exits; an actor's process lives on)."""
    result = fn(*args, **kwargs)
    from fastps.worker.api import is_initialized, shutdown

    if is_initialized():
        shutdown()
    return result


class ActorProc:
    """What the driver polls as a worker's process: one worker actor and the task running
    the user's function in it (``poll()`` like ``subprocess.Popen.poll``)."""

    def __init__(self, slot_id: str, name: str, actor: Any, run_ref: Any, pid_ref: Any) -> None:
        self.slot_id = slot_id
        self.name = name  # the actor's name in Ray (ray.get_actor finds it)
        self.actor = actor
        self.run_ref = run_ref
        self._pid_ref = pid_ref
        self._pid = 0
        self.returncode: Optional[int] = None
        self.result: Any = None
        self.error: Optional[str] = None  # why the task failed, for the caller's error
        self.killed = False

    @property
    def pid(self) -> int:
        """The actor's process id on its node (0 until the actor has started)."""
        if not self._pid and self._pid_ref is not None:
            import ray

            ready, _ = ray.wait([self._pid_ref], timeout=0)
            if ready:
                try:
                    self._pid = int(ray.get(self._pid_ref))
                except Exception:  # noqa: BLE001 - the actor died before it started
                    pass
                self._pid_ref = None
        return self._pid

    @property
    def label(self) -> str:
        pid = self.pid
        return f"actor {self.name}" + (f", pid {pid}" if pid else "")

    def poll(self) -> Optional[int]:
        if self.returncode is not None:
            return self.returncode
        import ray

        ready, _ = ray.wait([self.run_ref], timeout=0)
        if not ready:
            return None
        try:
            self.result = ray.get(self.run_ref)
            self.returncode = 0
        except ray.exceptions.RayActorError as exc:
            self.error = "its actor was stopped" if self.killed else f"its actor died ({exc})"
            self.returncode = -int(signal.SIGKILL)
        except Exception as exc:  # noqa: BLE001 - the user's function raised
            cause = getattr(exc, "cause", None) or exc
            self.error = f"{type(cause).__name__}: {cause}"
            self.returncode = 1
            say(f"worker actor on slot {self.slot_id} ({self.label}) failed: {self.error}")
            self.kill()  # its resources go back to the cluster; its slot is blacklisted
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("worker actor", timeout or 0.0)
            time.sleep(0.05)
        return int(self.returncode or 0)

    def kill(self) -> None:
        import ray

        if not self.killed:
            self.killed = True
            ray.kill(self.actor, no_restart=True)


def _proc(child: Child) -> ActorProc:
    return cast(ActorProc, child.proc)


class RayElasticDriver(ElasticLauncher):
    """ElasticLauncher whose workers are Ray actors running ``fn(*args, **kwargs)``."""

    def __init__(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        *,
        min_workers: int,
        max_workers: Optional[int],
        cpus_per_worker: float,
        gpus_per_worker: float,
        timeout: float,
        host_addr: str,
        elastic_timeout: float = DEFAULT_ELASTIC_TIMEOUT,
        reset_limit: Optional[int] = None,
        cooldown_range: Optional[Tuple[float, float]] = None,
        discovery_interval: float = DISCOVERY_INTERVAL,
        env: Optional[Dict[str, str]] = None,
        extra_env: Optional[Mapping[str, str]] = None,
    ) -> None:
        super().__init__(
            ["<ray worker actors>"],
            discovery_script="",
            min_np=min_workers,
            max_np=UNBOUNDED if max_workers is None else max_workers,
            elastic_timeout=elastic_timeout,
            discovery_interval=discovery_interval,
            reset_limit=reset_limit,
            cooldown_range=cooldown_range,
            timeout=timeout,
            host_addr=host_addr,
            env=env,
        )
        self.fn, self.args, self.kwargs = fn, list(args), dict(kwargs)
        self.cpus_per_worker = cpus_per_worker
        self.gpus_per_worker = gpus_per_worker
        self.extra_env = {str(k): str(v) for k, v in (extra_env or {}).items()}
        self.node_of_host: Dict[str, str] = {}
        self.actors: Dict[str, ActorProc] = {}  # slot id -> its latest actor

    # ------------------------------------------------------------ slots from the cluster
    def slots_of(self, resources: Mapping[str, float]) -> int:
        """How many workers a node with these (total) resources holds."""
        fits: List[float] = []
        if self.cpus_per_worker > 0:
            fits.append(resources.get("CPU", 0.0) / self.cpus_per_worker)
        if self.gpus_per_worker > 0:
            fits.append(resources.get("GPU", 0.0) / self.gpus_per_worker)
        if not fits:
            return self.max_np  # needs nothing: max_workers bounds it
        return int(math.floor(min(fits) + 1e-9))

    def _discover(self) -> Optional[Dict[str, int]]:
        import ray

        try:
            nodes = ray.nodes()
        except Exception as exc:  # noqa: BLE001 - keep the current slots, say why once
            if str(exc) != self._discovery_error:
                say(f"cannot list the Ray cluster's nodes ({exc}); keeping the current slots")
            self._discovery_error = str(exc)
            return None
        self._discovery_error = None
        hosts: Dict[str, int] = {}
        for node in nodes:
            if not node.get("Alive"):
                continue
            host = str(node["NodeManagerAddress"])
            n = self.slots_of(node.get("Resources") or {})
            if n > 0:
                hosts[host] = hosts.get(host, 0) + n
                self.node_of_host.setdefault(host, str(node["NodeID"]))
        # Every node of the cluster is a host this driver may start workers on.
        self.local_names |= set(hosts)
        return hosts

    def _start(self) -> None:
        deadline = time.monotonic() + self.elastic_timeout
        while True:
            hosts = self._discover() or {}
            if sum(hosts.values()) >= self.min_np:
                break
            if time.monotonic() > deadline:
                raise FastPSError(
                    f"RayExecutor: the cluster holds {sum(hosts.values())} workers of "
                    f"{self.cpus_per_worker:g} CPUs and {self.gpus_per_worker:g} GPUs, below "
                    f"min_workers={self.min_np}, after elastic_timeout={self.elastic_timeout:g} s"
                )
            time.sleep(START_POLL)
        self._open_service()
        with self.cond:
            self._apply_discovery(hosts, limit=self.initial_np)

    # ------------------------------------------------------------ workers as actors
    def _launch_worker(self, seq: int, slot_id: str, host: str, extra: Dict[str, str]) -> Child:
        import os

        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        env = {
            k: v
            for k, v in self._child_env("worker", seq, "").items()
            if k.startswith(ACTOR_ENV_PREFIXES) and k not in NOT_FOR_ACTORS
        }
        # The caller's variables (start(extra_env_vars=...)), except the job's own.
        env.update({k: v for k, v in self.extra_env.items() if k not in JOB_OWNED})
        env.update(extra)
        env["FASTPS_HOST"] = host  # what the actor's peers reach it by: its node's address
        env.setdefault("PYTHONUNBUFFERED", "1")
        options: Dict[str, Any] = {"num_cpus": self.cpus_per_worker}
        if self.gpus_per_worker:
            options["num_gpus"] = self.gpus_per_worker
        node = self.node_of_host.get(host)
        if node is not None:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
        name = f"fastps-{self.job_id}-worker-{seq}"
        actor = ray.remote(WorkerActor).options(name=name, **options).remote(env)
        pid_ref = actor.run.remote(os.getpid)
        run_ref = actor.run.remote(run_elastic, [self.fn, self.args, self.kwargs])
        proc = ActorProc(slot_id, name, actor, run_ref, pid_ref)
        self.actors[slot_id] = proc
        return Child("worker", seq, cast("subprocess.Popen[bytes]", proc))

    def _signal_worker(self, slot: _Slot, sig: int) -> None:
        if sig in (signal.SIGTERM, signal.SIGKILL):
            _proc(slot.child).kill()
        # SIGCONT (a stopped process must run to exit) has no actor counterpart: ray.kill
        # ends the actor whatever it does.

    def _worker_label(self, child: Child) -> str:
        return _proc(child).label

    def _cleanup(self) -> None:
        # The actors first (those that returned too: their processes live on), so none is
        # left to reconnect while the rest stops.
        for proc in self.actors.values():
            proc.poll()  # a result that came meanwhile is kept
            proc.kill()
        super()._cleanup()

    # ------------------------------------------------------------ outcome
    def results(self) -> List[Any]:
        """The results of the last generation's workers, in rank order."""
        return [_proc(self.slots[sid].child).result for sid in self.members]

    def failure(self) -> str:
        """Why the job failed, in RayExecutor's terms, naming the slots and actors."""
        if self.error is not None:
            return _in_ray_terms(self.error)
        members = [self.slots[sid] for sid in self.members]
        bad = [s for s in members if s.state != "done"] or list(self.slots.values())
        parts = []
        for s in bad:
            proc = _proc(s.child)
            rank = f"rank {self.members.index(s.id)}, " if s.id in self.members else ""
            why = proc.error or s.state
            parts.append(f"worker on slot {s.id} ({rank}{proc.label}): {why}")
        if not parts:
            return "no worker was started"
        return "; ".join(parts)
