"""``RayExecutor``: Horovod's Ray API over a fastps job whose every process is a Ray actor.

``start()`` reserves the workers' resources (a placement group, or the bundles of the
caller's own: ``use_current_placement_group``), starts the worker actors, one server actor
per node that has workers and the scheduler actor (both zero-CPU, next to the workers), the
``num_cpu_servers`` server actors on nodes without workers, then a job: the scheduler's
address, the job's id and token and each worker's rank go into the workers' environment, so
``hvd.init()`` in the functions ``run``/``execute`` ship joins it. The job lasts as long as
its workers stay in it; when it ended (every worker left with ``hvd.shutdown()``, or none
joined within ``timeout_s``) the next call starts a new one on the same actors.
``shutdown()`` ends every actor; so does Ray when the driver exits.

The elastic form (``min_workers``) is ``fastps.launch.ray.elastic``: each ``run(fn)`` is one
elastic job whose workers are actors started on the cluster's free slots, ``fn`` using
``hvd.elastic.run``; a killed actor makes the others roll back to their last commit and go
on without it.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from fastps.errors import FastPSError
from fastps.launch.ray.actors import SchedulerActor, ServerActor, WorkerActor
from fastps.launch.ray.elastic import RayElasticDriver
from fastps.launch.ray.placement import (
    WorkerLayout,
    cpu_server_nodes,
    order_by_node,
    worker_layout,
    workers_fitting,
)
from fastps.launch.ray.settings import RaySettings, create_settings

__all__ = ["RayExecutor", "failed_rank_error", "gather_in_order"]

log = logging.getLogger("fastps.ray")

WAIT_SLICE = 1.0  # s per ray.wait while gathering results: Ctrl-C stays responsive
STOP_WAIT = 10.0  # s shutdown() gives the servers and the scheduler to stop cleanly


def forwarded_env(extra: Optional[Mapping[str, Any]] = None) -> Dict[str, str]:
    """The driver's FASTPS_* settings (actors do not inherit the driver's environment),
    plus the caller's extra variables."""
    env = {k: v for k, v in os.environ.items() if k.startswith("FASTPS_")}
    env.update({str(k): str(v) for k, v in (extra or {}).items()})
    return env


def failed_rank_error(rank: int, exc: BaseException) -> FastPSError:
    """The error a run raises when worker ``rank`` failed (its error chained)."""
    cause = getattr(exc, "cause", None) or exc
    import ray

    if isinstance(exc, ray.exceptions.RayActorError):
        return FastPSError(f"rank {rank}: its worker actor died ({exc})")
    return FastPSError(f"rank {rank} failed: {type(cause).__name__}: {cause}")


def gather_in_order(refs: Sequence[Any], timeout: Optional[float] = None) -> List[Any]:
    """Every rank's result, in rank order; the first rank that fails fails the call (its
    error names it). ``timeout``: seconds for all of them (None: as long as they run)."""
    import time

    import ray

    index = {ref: i for i, ref in enumerate(refs)}
    pending = list(refs)
    deadline = None if timeout is None else time.monotonic() + timeout
    while pending:
        slice_s = WAIT_SLICE
        if deadline is not None:
            slice_s = max(0.0, min(slice_s, deadline - time.monotonic()))
        done, pending = ray.wait(pending, num_returns=len(pending), timeout=slice_s)
        for ref in done:
            try:
                ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - any error of the user's function
                raise failed_rank_error(index[ref], exc) from exc
        if pending and deadline is not None and time.monotonic() >= deadline:
            ranks = sorted(index[r] for r in pending)
            raise TimeoutError(f"ranks {ranks} did not finish within {timeout:g} s")
    return list(ray.get(list(refs)))


class RayExecutor:
    """Horovod's ``horovod.ray.RayExecutor``, running fastps.

    ``settings``: from :meth:`create_settings`. Workers: ``num_workers``, or ``num_hosts``
    nodes with ``num_workers_per_host`` each; ``cpus_per_worker``, ``use_gpu`` /
    ``gpus_per_worker`` (default 1 with ``use_gpu``) are each worker's resources.
    ``min_workers`` makes it elastic (Horovod's elastic form): ``run(fn)`` starts between
    ``min_workers`` and ``max_workers`` (default: as many as the cluster holds) worker actors
    of ``cpus_per_worker``/``gpus_per_worker`` each on the cluster's nodes, and ``fn`` (which
    uses ``hvd.elastic.run``) goes on with the survivors when one dies, and with new actors
    when a node joins; ``elastic_timeout``: how long it may have fewer than ``min_workers``;
    ``reset_limit``: how many times the world may change; ``cooldown_range`` ``(lo, hi)``:
    a failed slot may be used again after Horovod's cooldown (default: never).
    ``use_current_placement_group`` (Horovod's, default True): when the executor is created
    inside a Ray task or actor that runs in a placement group, the workers go into that
    group's bundles (any bundle with room) and no group of its own is reserved; False
    always reserves one. ``num_cpu_servers``: extra summation servers, one on each of as many
    Ray nodes that hold no worker (BytePS's CPU machines, ``FASTPS_CPU_SERVERS`` elsewhere),
    each taking ``cpus_per_cpu_server`` CPUs and, with ``cpu_server_resource``, one unit of
    that custom resource, so only the nodes marked with it are used. The elastic form
    ignores ``use_current_placement_group`` (it finds its slots from the cluster's nodes;
    ``override_discovery`` is accepted for Horovod's signature) and refuses
    ``num_cpu_servers``.
    """

    create_settings = staticmethod(create_settings)

    def __init__(
        self,
        settings: Optional[RaySettings] = None,
        num_workers: Optional[int] = None,
        num_hosts: Optional[int] = None,
        num_workers_per_host: int = 1,
        cpus_per_worker: float = 1,
        use_gpu: bool = False,
        gpus_per_worker: Optional[float] = None,
        use_current_placement_group: bool = True,
        min_workers: Optional[int] = None,
        max_workers: Optional[int] = None,
        reset_limit: Optional[int] = None,
        cooldown_range: Optional[Sequence[float]] = None,
        elastic_timeout: float = 600,
        override_discovery: bool = True,
        num_cpu_servers: int = 0,
        cpu_server_resource: Optional[str] = None,
        cpus_per_cpu_server: float = 1,
    ) -> None:
        self.settings = settings if settings is not None else create_settings()
        _check_cpu_servers(
            num_cpu_servers, cpu_server_resource, cpus_per_cpu_server, min_workers is not None
        )
        self.num_cpu_servers = int(num_cpu_servers)
        self.cpu_server_resource = cpu_server_resource
        self.cpus_per_cpu_server = float(cpus_per_cpu_server)
        self.use_current_placement_group = bool(use_current_placement_group)
        if max_workers is not None and (min_workers is None or min_workers <= 0):
            raise FastPSError(
                f"RayExecutor: max_workers={max_workers} needs a positive min_workers "
                "(the elastic form)"
            )
        if min_workers is not None and num_workers is not None:
            raise FastPSError(
                f"RayExecutor: num_workers={num_workers} (fixed) and min_workers="
                f"{min_workers} (elastic) exclude each other"
            )
        gpus = float(gpus_per_worker if gpus_per_worker is not None else (1 if use_gpu else 0))
        self.elastic: Optional[Dict[str, Any]] = None
        self.layout: Optional[WorkerLayout] = None
        if min_workers is not None:
            self.elastic = _elastic_args(
                min_workers, max_workers, num_hosts, reset_limit, cooldown_range, elastic_timeout
            )
            if cpus_per_worker < 0 or gpus < 0:
                raise FastPSError(
                    f"RayExecutor: cpus_per_worker={cpus_per_worker} and gpus_per_worker="
                    f"{gpus} must not be negative"
                )
        else:
            self.layout = worker_layout(
                num_workers,
                num_hosts,
                num_workers_per_host if num_hosts is not None else None,
                float(cpus_per_worker),
                gpus,
            )
        self.cpus_per_worker = float(cpus_per_worker)
        self.gpus_per_worker = gpus
        self._pg: Any = None  # the placement group this executor reserved (and removes)
        # The group the workers run in: its own, or the caller's (use_current_placement_group).
        self.placement_group: Any = None
        self.created_placement_group = False
        self.workers: List[Any] = []  # worker actors in rank order
        self._servers: List[Any] = []  # by server id: one per worker node, then CPU-only nodes
        self._server_placements: List[Dict[str, str]] = []
        self._scheduler: Any = None
        self._env: Dict[str, str] = {}
        self._placements: List[Dict[str, str]] = []
        self._job: Dict[str, Any] = {}
        self._started = False
        self._driver: Optional[RayElasticDriver] = None  # the elastic job running now

    # ------------------------------------------------------------------ start
    def start(
        self,
        executable_cls: Optional[type] = None,
        executable_args: Optional[Sequence[Any]] = None,
        executable_kwargs: Optional[Mapping[str, Any]] = None,
        extra_env_vars: Optional[Mapping[str, Any]] = None,
    ) -> None:
        """Starts the actors and the job; ``executable_cls(*args, **kwargs)`` is then
        created in every worker (with the job's environment set: it may call hvd.init())."""
        import ray

        if not ray.is_initialized():
            raise FastPSError("RayExecutor.start(): call ray.init() first (connect to a cluster)")
        self._env = forwarded_env(extra_env_vars)
        if self.settings.nics:
            self._env.setdefault("FASTPS_IFACE", sorted(self.settings.nics)[0])
        if self.elastic is not None:
            # Each run() is one elastic job with its own actors; an executable would be
            # built in actors that the first failure replaces, so it has no place here.
            if executable_cls is not None:
                raise FastPSError(
                    "RayExecutor (elastic form): start(executable_cls=...) is not supported; "
                    "build what the training needs inside the function given to run()"
                )
            self._started = True
            return
        try:
            self._start_actors()
            self._new_job()
            refs = [
                w.start_executable.remote(executable_cls, executable_args, executable_kwargs)
                for w in self.workers
            ]
            gather_in_order(refs, self.settings.timeout_s * 4)
        except BaseException:
            self.shutdown()
            raise

    def _start_actors(self) -> None:
        import ray
        from ray.util.placement_group import (
            get_current_placement_group,
            placement_group,
            remove_placement_group,
        )
        from ray.util.scheduling_strategies import (
            NodeAffinitySchedulingStrategy,
            PlacementGroupSchedulingStrategy,
        )

        assert self.layout is not None
        layout = self.layout
        settings = self.settings
        # A bad num_cpu_servers fails here, before anything is reserved; the nodes the
        # workers take are ruled out once they are known (below).
        cpu_server_nodes(
            ray.nodes(),
            (),
            self.num_cpu_servers,
            self.cpu_server_resource,
            self.cpus_per_cpu_server,
        )
        current = get_current_placement_group() if self.use_current_placement_group else None
        if current is not None:
            pg, created = current, False
            bundles = list(current.bundle_specs)
            holds = workers_fitting(bundles, self.cpus_per_worker, self.gpus_per_worker)
            if holds < layout.num_workers:
                raise FastPSError(
                    f"RayExecutor: the placement group this code runs in (bundles {bundles}) "
                    f"holds {holds} workers of {self.cpus_per_worker:g} CPUs and "
                    f"{self.gpus_per_worker:g} GPUs, not {layout.num_workers}; pass "
                    "use_current_placement_group=False to reserve a group of its own"
                )
            log.info("fastps on Ray: the workers go into the current placement group %s", pg.id)
        else:
            pg, created = placement_group(layout.bundles, strategy=layout.strategy), True
            self._pg = pg
            ready, _ = ray.wait([pg.ready()], timeout=settings.placement_group_timeout_s)
            if not ready:
                remove_placement_group(pg)
                self._pg = None
                raise TimeoutError(
                    f"RayExecutor: the cluster did not grant {layout.num_workers} workers "
                    f"({layout.strategy} bundles {layout.bundles}) within "
                    f"{settings.placement_group_timeout_s:g} s (placement_group_timeout_s); "
                    f"available now: {ray.available_resources()}"
                )
        self.placement_group, self.created_placement_group = pg, created

        def worker_strategy(bundle: int) -> PlacementGroupSchedulingStrategy:
            if created:
                return PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=bundle
                )
            # The caller's group: any bundle with room (its own task may hold part of one);
            # the workers' own tasks are not pulled into it (Horovod's choice too).
            return PlacementGroupSchedulingStrategy(
                placement_group=pg,
                placement_group_bundle_index=-1,
                placement_group_capture_child_tasks=False,
            )

        worker_cls = ray.remote(WorkerActor)
        created_workers = [
            worker_cls.options(
                num_cpus=self.cpus_per_worker,
                num_gpus=self.gpus_per_worker,
                scheduling_strategy=worker_strategy(b),
            ).remote(self._env)
            for b in layout.bundle_of_worker
        ]
        self.workers = created_workers
        # In the caller's group the workers may wait for room: that wait is placement time.
        wait_s = settings.timeout_s + (0 if created else settings.placement_group_timeout_s)
        where = _probe(
            created_workers,
            wait_s,
            f"the {layout.num_workers} worker actors did not start",
        )
        order = order_by_node([p["node_id"] for p in where])
        self.workers = [created_workers[i] for i in order]
        self._placements = [where[i] for i in order]
        bundle_of_rank = [layout.bundle_of_worker[i] for i in order]
        nodes = [p["node_id"] for p in self._placements]
        # Before any other actor: a refusal here leaves only the workers to stop.
        cpu_nodes = cpu_server_nodes(
            ray.nodes(),
            set(nodes),
            self.num_cpu_servers,
            self.cpu_server_resource,
            self.cpus_per_cpu_server,
        )

        def next_to_worker(rank: int) -> Any:
            """Zero CPUs on the node of worker ``rank``: in its bundle of our own group; by
            node affinity in the caller's, where the worker's bundle is not known."""
            if created:
                return PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=bundle_of_rank[rank]
                )
            return NodeAffinitySchedulingStrategy(node_id=nodes[rank], soft=False)

        server_cls = ray.remote(ServerActor)
        first_ranks = [nodes.index(n) for n in dict.fromkeys(nodes)]
        self._servers = [
            server_cls.options(num_cpus=0, scheduling_strategy=next_to_worker(r)).remote(self._env)
            for r in first_ranks
        ]
        self._scheduler = (
            ray.remote(SchedulerActor)
            .options(num_cpus=0, scheduling_strategy=next_to_worker(0))
            .remote(self._env)
        )
        extra = {self.cpu_server_resource: 1.0} if self.cpu_server_resource else None
        # Outside any placement group: these nodes are not the workers' (node affinity also
        # keeps them out of a caller's group that would capture them).
        self._servers += [
            server_cls.options(
                num_cpus=self.cpus_per_cpu_server,
                resources=extra,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False),
            ).remote(self._env)
            for node in cpu_nodes
        ]
        what = "the server actors did not start"
        if cpu_nodes:
            # They wait for their resources like any actor: say which, and what they need.
            needs = f"{self.cpus_per_cpu_server:g} CPUs" + (
                f" and one {self.cpu_server_resource!r}" if extra else ""
            )
            what += (
                f" (num_cpu_servers={self.num_cpu_servers} on nodes {cpu_nodes}, each "
                f"needing {needs}: held by other work?)"
            )
        wait_s = settings.timeout_s + (settings.placement_group_timeout_s if cpu_nodes else 0)
        self._server_placements = _probe(self._servers, wait_s, what)

    def server_placements(self) -> List[Dict[str, Any]]:
        """Where the job's summation servers run, by server id: ``server_id``, ``node_id``,
        ``hostname``, ``ip`` and ``cpu_only`` (True for the ``num_cpu_servers`` ones, which
        share no node with a worker). Empty before ``start()``."""
        worker_nodes = {p["node_id"] for p in self._placements}
        return [
            dict(p, server_id=i, cpu_only=p["node_id"] not in worker_nodes)
            for i, p in enumerate(self._server_placements)
        ]

    def _new_job(self) -> None:
        """A new fastps job on the actors: scheduler, servers, the workers' environment."""
        import ray

        timeout = self.settings.timeout_s
        n, k = len(self.workers), len(self._servers)
        job = ray.get(self._scheduler.start_job.remote(n, k, timeout), timeout=timeout)
        job_env = {
            "FASTPS_SCHEDULER_ADDR": job["scheduler"],
            "FASTPS_JOB_ID": job["job_id"],
            "FASTPS_TOKEN": job["token"],
            "FASTPS_NUM_WORKERS": str(n),
            "FASTPS_NUM_SERVERS": str(k),
            "FASTPS_TIMEOUT": f"{timeout:g}",
        }
        ray.get([s.start.remote(i, job_env) for i, s in enumerate(self._servers)], timeout=timeout)
        refs = []
        for rank, w in enumerate(self.workers):
            env = dict(job_env, FASTPS_ROLE="worker", FASTPS_RANK=str(rank))
            env["FASTPS_HOST"] = self._placements[rank]["ip"]
            refs.append(w.update_env_vars.remote(env))
        ray.get(refs, timeout=timeout)
        self._job = job
        log.info("fastps job %s on Ray: %d workers, %d servers", job["job_id"], n, k)

    def _ensure_job(self) -> None:
        """A job the workers can join: the current one while it runs, else a new one (only
        when no worker is still in the old one)."""
        import ray

        if not self.workers:
            raise FastPSError("RayExecutor: call start() first")
        timeout = self.settings.timeout_s
        ended = ray.get(self._scheduler.finished.remote(), timeout=timeout)
        if ended is None:
            return
        inside = ray.get([w.initialized.remote() for w in self.workers], timeout=timeout)
        if any(inside):
            if ended:
                log.warning("fastps job %s ended: %s", self._job.get("job_id"), ended)
            return
        self._new_job()

    # ------------------------------------------------------------------- calls
    def run(
        self,
        fn: Callable[..., Any],
        args: Optional[Sequence[Any]] = None,
        kwargs: Optional[Mapping[str, Any]] = None,
        callbacks: Optional[Sequence[Callable[[Any], Any]]] = None,
    ) -> List[Any]:
        """``fn(*args, **kwargs)`` on every worker; the results in rank order. Elastic form:
        the results of the workers of the last generation, in their rank order; a
        ``FastPSError`` naming the slots, actors and reason when the job failed."""
        if self.elastic is not None:
            return self._run_elastic(fn, args or (), kwargs or {})
        return gather_in_order(self.run_remote(fn, args, kwargs))

    def _run_elastic(
        self, fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> List[Any]:
        from fastps.launch.ray.actors import node_address

        assert self.elastic is not None
        if not self._started:
            raise FastPSError("RayExecutor: call start() first")
        if self._driver is not None:
            raise FastPSError("RayExecutor (elastic form): a run is in progress already")
        driver = RayElasticDriver(
            fn,
            args,
            kwargs,
            cpus_per_worker=self.cpus_per_worker,
            gpus_per_worker=self.gpus_per_worker,
            timeout=self.settings.timeout_s,
            host_addr=node_address(),
            extra_env=self._env,
            **self.elastic,
        )
        self._driver = driver
        try:
            code = driver.run()
        finally:
            self._driver = None
        if code != 0:
            raise FastPSError(f"RayExecutor (elastic form): {driver.failure()}")
        return driver.results()

    def worker_actors(self) -> Dict[str, Any]:
        """Elastic form, while ``run`` runs (from another thread): the live worker actors by
        slot (``<node ip>:<i>``); empty otherwise."""
        driver = self._driver
        if driver is None:
            return {}
        procs = dict(driver.actors)
        return {slot: p.actor for slot, p in procs.items() if p.returncode is None}

    def _fixed_only(self, what: str) -> None:
        if self.elastic is not None:
            raise FastPSError(
                f"RayExecutor (elastic form): {what} is not available; use run(fn), with fn "
                "using hvd.elastic.run (Horovod's elastic executor has only run, too)"
            )

    def run_remote(
        self,
        fn: Callable[..., Any],
        args: Optional[Sequence[Any]] = None,
        kwargs: Optional[Mapping[str, Any]] = None,
    ) -> List[Any]:
        """Like :meth:`run`, without waiting: one ``ray.ObjectRef`` per rank, in rank order."""
        self._fixed_only("run_remote")
        self._ensure_job()
        return [w.run.remote(fn, args, kwargs) for w in self.workers]

    def execute(
        self,
        fn: Callable[[Any], Any],
        callbacks: Optional[Sequence[Callable[[Any], Any]]] = None,
    ) -> List[Any]:
        """``fn(executable)`` on every worker (the object ``start(executable_cls=...)``
        created there, else None); the results in rank order."""
        self._fixed_only("execute")
        self._ensure_job()
        return gather_in_order([w.execute.remote(fn) for w in self.workers])

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(executable)`` on rank 0 only; its result."""
        self._fixed_only("execute_single")
        self._ensure_job()
        return gather_in_order([self.workers[0].execute.remote(fn)])[0]

    # ---------------------------------------------------------------- shutdown
    def shutdown(self) -> None:
        """Ends every actor of the job and frees the placement group (idempotent)."""
        import ray

        self._started = False
        if not ray.is_initialized():
            return
        driver = self._driver
        if driver is not None:  # a run() in another thread: its actors go now
            for proc in list(driver.actors.values()):
                proc.kill()
        # Workers leave first, so the job ends normally and the servers exit on their own.
        leaves = [w.leave.remote() for w in self.workers]
        if leaves:
            ray.wait(leaves, num_returns=len(leaves), timeout=STOP_WAIT)
        stops = [s.stop.remote(STOP_WAIT / 2) for s in self._servers]
        if self._scheduler is not None:
            stops.append(self._scheduler.stop.remote())
        if stops:
            ray.wait(stops, num_returns=len(stops), timeout=STOP_WAIT)
        for actor in [*self.workers, *self._servers, self._scheduler]:
            if actor is not None:
                ray.kill(actor, no_restart=True)
        self.workers, self._servers, self._scheduler = [], [], None
        self._server_placements = []
        # Only a group this executor reserved is removed; the caller's stays the caller's.
        if self._pg is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self._pg)
            self._pg = None
        self.placement_group, self.created_placement_group = None, False

    @property
    def num_workers(self) -> int:
        return len(self.workers)


def _probe(actors: Sequence[Any], timeout: float, what: str) -> List[Any]:
    """Every actor's ``placement()`` within ``timeout`` s, else a ``TimeoutError`` that
    says ``what``; the actors are killed first, so that shutdown() does not wait for actors
    Ray never started."""
    import ray

    try:
        return list(ray.get([a.placement.remote() for a in actors], timeout=timeout))
    except ray.exceptions.GetTimeoutError as exc:
        for actor in actors:
            ray.kill(actor, no_restart=True)
        raise TimeoutError(f"RayExecutor: {what} within {timeout:g} s") from exc


def _check_cpu_servers(
    num_cpu_servers: int, resource: Optional[str], cpus: float, elastic: bool
) -> None:
    """A clear error for a CPU-server request that cannot mean anything."""
    if isinstance(num_cpu_servers, bool) or not isinstance(num_cpu_servers, int):
        raise FastPSError(f"RayExecutor: num_cpu_servers={num_cpu_servers!r} must be an int")
    if num_cpu_servers < 0:
        raise FastPSError(f"RayExecutor: num_cpu_servers={num_cpu_servers} must be >= 0")
    if resource is not None:
        if not isinstance(resource, str) or not resource or resource in ("CPU", "GPU", "memory"):
            raise FastPSError(
                f"RayExecutor: cpu_server_resource={resource!r} must name a custom Ray "
                "resource (e.g. 'fastps_server'), not empty, CPU, GPU or memory"
            )
        if num_cpu_servers == 0:
            raise FastPSError(
                f"RayExecutor: cpu_server_resource={resource!r} without num_cpu_servers: "
                "say how many servers to start on the nodes it marks"
            )
    if cpus < 0:
        raise FastPSError(f"RayExecutor: cpus_per_cpu_server={cpus} must not be negative")
    if elastic and num_cpu_servers:
        raise FastPSError(
            f"RayExecutor: num_cpu_servers={num_cpu_servers} is for the fixed form; the "
            "elastic form (min_workers) runs each generation's server in the driver"
        )


def _elastic_args(
    min_workers: int,
    max_workers: Optional[int],
    num_hosts: Optional[int],
    reset_limit: Optional[int],
    cooldown_range: Optional[Sequence[float]],
    elastic_timeout: float,
) -> Dict[str, Any]:
    """The elastic driver's arguments, or a clear error for a contradictory request."""
    if min_workers < 1:
        raise FastPSError(f"RayExecutor: min_workers={min_workers} must be >= 1")
    if num_hosts is not None:
        raise FastPSError(
            f"RayExecutor: num_hosts={num_hosts} (fixed) and min_workers={min_workers} "
            "(elastic) exclude each other"
        )
    if max_workers is not None and max_workers < min_workers:
        raise FastPSError(
            f"RayExecutor: max_workers={max_workers} is below min_workers={min_workers}"
        )
    if reset_limit is not None and reset_limit < 0:
        raise FastPSError(f"RayExecutor: reset_limit={reset_limit} must be >= 0")
    if not elastic_timeout or elastic_timeout <= 0:
        raise FastPSError(f"RayExecutor: elastic_timeout={elastic_timeout} must be > 0")
    cooldown: Optional[Tuple[float, float]] = None
    if cooldown_range is not None:
        lo, hi = (float(x) for x in cooldown_range)
        if not 0 < lo <= hi:
            raise FastPSError(
                f"RayExecutor: cooldown_range={tuple(cooldown_range)} must be 0 < lo <= hi"
            )
        cooldown = (lo, hi)
    return {
        "min_workers": int(min_workers),
        "max_workers": None if max_workers is None else int(max_workers),
        "reset_limit": reset_limit,
        "cooldown_range": cooldown,
        "elastic_timeout": float(elastic_timeout),
    }
