"""The elastic form of fastps.ray.RayExecutor (min_workers/max_workers) on a real local Ray
cluster: a worker actor killed with ray.kill mid-run -> the survivors roll back to their last
commit and finish with fewer workers, with the single-process result; a kill that leaves
fewer than min_workers -> a clear error after elastic_timeout. Every wait is bounded and no
actor or server process outlives the run."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest
import ray_elastic_jobs

pytestmark = pytest.mark.timeout(150)

RUN_LIMIT = 90.0  # s a run may take here (a loaded 2-core machine: ~15 s)


def _server_processes(job_prefix: str) -> List[int]:
    """Pids of this machine's fastps servers of any generation of elastic job ``job_prefix``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        tag = f"FASTPS_JOB_ID={job_prefix}-g".encode()
        if b"fastps.server" in cmd and any(e.startswith(tag) for e in env):
            found.append(int(pid))
    return found


def _progress(folder: Path) -> Dict[str, Tuple[int, int, int]]:
    """slot file -> (rank, size, step) of its last commit."""
    out = {}
    for f in folder.iterdir():
        lines = f.read_text().split("\n")
        full = [line for line in lines[:-1] if line]  # the last line may be half written
        if full:
            r, n, s = (int(v) for v in full[-1].split())
            out[f.name] = (r, n, s)
    return out


class Run:
    """executor.run(...) in a thread, so the test can kill an actor meanwhile."""

    def __init__(self, executor: Any, **kwargs: Any) -> None:
        self.out: Optional[List[Dict[str, Any]]] = None
        self.error: Optional[BaseException] = None
        self.ended_at = 0.0
        self.actors: Dict[str, Any] = {}  # every worker actor seen, by slot

        def body() -> None:
            try:
                self.out = executor.run(ray_elastic_jobs.elastic_least_squares, kwargs=kwargs)
            except BaseException as exc:  # noqa: BLE001 - the test looks at it
                self.error = exc
            self.ended_at = time.monotonic()

        self.executor = executor
        self.thread = threading.Thread(target=body, daemon=True)
        self.thread.start()

    def kill_rank(self, rank: int, size: int, at_step: int, folder: Path) -> str:
        """Waits (bounded) until rank ``rank`` of a world of ``size`` committed ``at_step``,
        then ray.kill()s its actor; returns its slot."""
        deadline = time.monotonic() + RUN_LIMIT
        while time.monotonic() < deadline and self.thread.is_alive():
            self.actors.update(self.executor.worker_actors())
            for name, (r, n, s) in _progress(folder).items():
                if (r, n) == (rank, size) and s >= at_step:
                    slot = next(k for k in self.actors if k.replace(":", "_") == name)
                    import ray

                    ray.kill(self.actors[slot], no_restart=True)
                    return slot
            time.sleep(0.05)
        raise AssertionError(
            f"rank {rank} of {size} never reached step {at_step}: {_progress(folder)}, "
            f"run error {self.error!r}"
        )

    def join(self) -> None:
        self.thread.join(RUN_LIMIT)
        assert not self.thread.is_alive(), f"the elastic run took over {RUN_LIMIT:g} s"


def _assert_all_gone(actors: Dict[str, Any], job_prefix: Optional[str]) -> None:
    import ray

    assert actors
    for actor in actors.values():
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(actor.run.remote(os.getpid), timeout=30)
    if job_prefix is None:
        return
    deadline = time.monotonic() + 15
    while _server_processes(job_prefix) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _server_processes(job_prefix) == [], "a server of the elastic job outlived it"


def test_killed_actor_survivors_finish_with_single_process_result(
    ray_cluster: None, tmp_path: Path
) -> None:
    from fastps.ray import RayExecutor

    steps = 12
    # 4 CPUs / 1.3 per worker: 3 slots, so the killed actor's slot (blacklisted) has no
    # replacement and the job ends with 2 workers.
    executor = RayExecutor(
        RayExecutor.create_settings(timeout_s=60),
        min_workers=2,
        max_workers=3,
        cpus_per_worker=1.3,
        elastic_timeout=30,
    )
    executor.start()
    began, began_wall = time.monotonic(), time.time()
    try:
        run = Run(executor, steps=steps, progress=str(tmp_path), step_sleep=0.02)
        killed = run.kill_rank(1, 3, at_step=3, folder=tmp_path)
        run.join()
    finally:
        executor.shutdown()
    assert run.error is None, run.error
    out = run.out
    assert out is not None
    print(
        f"\nray elastic: 3 -> 2 workers; from run(): functions began after "
        f"{max(r['entered'] for r in out) - began_wall:.1f} s, first generation formed after "
        f"{max(r['joined'] for r in out) - began_wall:.1f} s, training done after "
        f"{max(r['finished'] for r in out) - began_wall:.1f} s, result after "
        f"{run.ended_at - began:.1f} s"
    )
    assert [r["rank"] for r in out] == [0, 1]
    assert [r["size"] for r in out] == [2, 2]
    assert killed not in {r["slot"] for r in out}
    assert all(r["sizes"] == [3, 2] for r in out), [r["sizes"] for r in out]
    assert all(r["step"] == steps for r in out)
    # The killed rank was mid-run: its last commit is before the end.
    assert _progress(tmp_path)[killed.replace(":", "_")][2] < steps
    assert out[0]["params"] == out[1]["params"]  # the survivors agree exactly
    want = ray_elastic_jobs.reference(steps)
    got = out[0]["params"]
    assert max(abs(a - b) for a, b in zip(got, want)) < 1e-9, (got, want)
    _assert_all_gone(run.actors, out[0]["job"].rsplit("-g", 1)[0])


def test_below_min_workers_fails_after_elastic_timeout(ray_cluster: None, tmp_path: Path) -> None:
    from fastps.errors import FastPSError
    from fastps.ray import RayExecutor

    # 4 CPUs / 2 per worker: 2 slots, both used; the killed one's slot is not used again.
    executor = RayExecutor(
        RayExecutor.create_settings(timeout_s=60),
        min_workers=2,
        max_workers=2,
        cpus_per_worker=2,
        elastic_timeout=2,
    )
    executor.start()
    try:
        run = Run(executor, steps=400, progress=str(tmp_path), step_sleep=0.05)
        run.kill_rank(1, 2, at_step=2, folder=tmp_path)
        killed_at = time.monotonic()
        run.join()
    finally:
        executor.shutdown()
    assert run.out is None, "the run finished below min_workers"
    assert isinstance(run.error, FastPSError), run.error
    message = str(run.error)
    assert "only 1 workers" in message and "elastic_timeout 2 s" in message, message
    assert "min_workers 2" in message, message
    waited = run.ended_at - killed_at
    assert 2 <= waited < 2 + 20, f"the error came {waited:.1f} s after the kill"
    _assert_all_gone(run.actors, None)


def test_elastic_arguments_are_checked() -> None:
    from fastps.errors import FastPSError
    from fastps.ray import RayExecutor

    settings = RayExecutor.create_settings()
    with pytest.raises(FastPSError, match="max_workers=1 is below min_workers=2"):
        RayExecutor(settings, min_workers=2, max_workers=1)
    with pytest.raises(FastPSError, match="min_workers=0"):
        RayExecutor(settings, min_workers=0)
    with pytest.raises(FastPSError, match="num_hosts=2 .* and min_workers"):
        RayExecutor(settings, num_hosts=2, min_workers=1)
    executor = RayExecutor(settings, min_workers=1, max_workers=2)
    with pytest.raises(FastPSError, match="elastic form.*execute is not available"):
        executor.execute(lambda _: 0)
