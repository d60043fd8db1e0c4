"""``fastps.spark.run``: Horovod's ``horovod.spark.run`` on fastps.

One Spark job of one barrier-mode stage with ``num_proc`` tasks: Spark starts them all at
once or not at all, and ends them all when one fails. Each task is one rank
(``fastps.launch.spark.task``); the results come back in rank order.
"""

from __future__ import annotations

import functools
import os
import re
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, TextIO, Tuple

from fastps.errors import FastPSError
from fastps.launch.spark.task import FAILURE_MARK, run_task

__all__ = ["run"]

DEFAULT_START_TIMEOUT = 600.0  # Horovod's default for HOROVOD_SPARK_START_TIMEOUT
_FAILURE = re.compile(re.escape(FAILURE_MARK) + r" (rank \d+ of \d+: [^\n]*)")


def _start_timeout(start_timeout: Optional[float]) -> float:
    if start_timeout is not None:
        value = float(start_timeout)
        what = f"start_timeout={start_timeout}"
    else:
        raw = os.environ.get("HOROVOD_SPARK_START_TIMEOUT", "")
        if not raw.strip():
            return DEFAULT_START_TIMEOUT
        what = f"HOROVOD_SPARK_START_TIMEOUT={raw!r}"
        try:
            value = float(raw)
        except ValueError:
            raise FastPSError(f"fastps.spark.run: {what} is not a number of seconds") from None
    if not value > 0:
        raise FastPSError(f"fastps.spark.run: {what} must be > 0")
    return value


def task_env(env: Optional[Mapping[str, Any]], nics: Optional[Sequence[str]]) -> Dict[str, str]:
    """The variables every task gets: the driver's FASTPS_* settings, ``env``, and the first
    of ``nics`` as FASTPS_IFACE."""
    out = {k: v for k, v in os.environ.items() if k.startswith("FASTPS_")}
    out.update({str(k): str(v) for k, v in (env or {}).items()})
    if nics:
        out.setdefault("FASTPS_IFACE", sorted(nics)[0])
    return out


def _task_slots(sc: Any) -> Optional[int]:
    """How many tasks the cluster can run at once now (what barrier mode checks a stage
    against), or None where this Spark does not say."""
    try:
        jsc = sc._jsc.sc()
        profile = jsc.resourceProfileManager().defaultResourceProfile()
        return int(jsc.maxNumConcurrentTasks(profile))
    except Exception:  # noqa: BLE001 - Spark's internal API; without it Spark checks alone
        return None


def _wait_for_slots(sc: Any, num_proc: int, timeout: float) -> None:
    """Waits up to ``timeout`` seconds for ``num_proc`` task slots (executors may still be
    joining). Spark itself would hold a barrier stage that does not fit for 40 checks 15 s
    apart, and no cancellation reaches it meanwhile, so the run is refused here."""
    deadline = time.monotonic() + timeout
    while True:
        slots = _task_slots(sc)
        if slots is None or slots >= num_proc:
            return
        if time.monotonic() >= deadline:
            raise FastPSError(
                "Timed out waiting for Spark tasks to start: fastps.spark.run needs "
                f"{num_proc} tasks running at once (num_proc={num_proc}, barrier mode) and "
                f"the cluster had {slots} task slots after {timeout:g} s (start_timeout); "
                "give it more executors or cores, or a larger start_timeout if they are "
                "allocated on demand"
            )
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def _write_output(
    pairs: Sequence[Tuple[int, Any, Dict[str, List[Tuple[float, str]]]]],
    streams: Mapping[str, TextIO],
    timestamp: bool,
) -> None:
    """Writes each rank's captured lines as ``[rank]<stdout>:line`` (Horovod's prefix),
    after a time stamp with ``prefix_output_with_timestamp``; rank by rank."""
    for rank, _, output in pairs:
        for name, stream in streams.items():
            for when, line in output.get(name, []):
                stamp = (
                    time.strftime("%a %b %d %H:%M:%S %Y ", time.localtime(when))
                    if timestamp
                    else ""
                )
                stream.write(f"{stamp}[{rank}]<{name}>:{line}\n")
            stream.flush()


def run(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: Optional[Mapping[str, Any]] = None,
    num_proc: Optional[int] = None,
    start_timeout: Optional[float] = None,
    use_mpi: Optional[bool] = None,
    use_gloo: Optional[bool] = None,
    extra_mpi_args: Optional[str] = None,
    env: Optional[Mapping[str, Any]] = None,
    stdout: Any = None,
    stderr: Any = None,
    verbose: int = 1,
    nics: Optional[Sequence[str]] = None,
    prefix_output_with_timestamp: bool = False,
    executable: Optional[str] = None,
) -> List[Any]:
    """Runs ``fn(*args, **kwargs)`` on ``num_proc`` ranks (default: Spark's default
    parallelism), one Spark task each, and returns their results in rank order.

    ``start_timeout`` (default ``HOROVOD_SPARK_START_TIMEOUT``, else 600 s): how long the
    ranks wait for each other to join. ``env``: variables set in every task while ``fn``
    runs (with the driver's ``FASTPS_*`` ones). ``use_gloo`` is accepted and means nothing
    (fastps has its own transport); ``use_mpi`` and ``extra_mpi_args`` are refused. The
    function runs in Spark's Python worker, so its output is in the executors' logs:
    with ``stdout``/``stderr`` (file-like objects), what ``fn`` writes to ``sys.stdout`` /
    ``sys.stderr`` is also written there once the run is done, each line prefixed
    ``[rank]<stdout>:`` (with ``prefix_output_with_timestamp``, after its time). If the
    cluster has fewer than ``num_proc`` task slots, the run waits ``start_timeout`` for
    them, then raises. ``executable`` and ``verbose`` are accepted and not used.
    """
    import pyspark

    if use_mpi or extra_mpi_args:
        raise FastPSError("fastps.spark.run: fastps does not run on MPI (use_mpi, extra_mpi_args)")
    sc = pyspark.SparkContext._active_spark_context
    if sc is None:
        raise FastPSError("fastps.spark.run: no active SparkContext (create a SparkSession first)")
    if num_proc is None:
        num_proc = int(sc.defaultParallelism)
    if num_proc < 1:
        raise FastPSError(f"fastps.spark.run: num_proc={num_proc} must be >= 1")
    timeout = _start_timeout(start_timeout)
    _wait_for_slots(sc, num_proc, timeout)
    streams = {name: s for name, s in (("stdout", stdout), ("stderr", stderr)) if s is not None}
    body = functools.partial(
        run_task,
        fn,
        tuple(args),
        dict(kwargs or {}),
        task_env(env, nics),
        timeout,
        sc.getConf().get("spark.driver.host"),
        tuple(streams),
    )
    sc.setJobDescription(f"fastps.spark.run: {getattr(fn, '__name__', 'fn')} on {num_proc} ranks")
    rdd = sc.parallelize(range(num_proc), num_proc).barrier().mapPartitions(body)
    try:
        pairs = rdd.collect()
    except Exception as exc:
        found = _FAILURE.search(str(exc))
        if found is None:
            raise
        raise FastPSError(f"fastps.spark.run: {found.group(1)}") from exc
    finally:
        sc.setJobDescription(None)
    pairs = sorted(pairs, key=lambda p: p[0])
    _write_output(pairs, streams, prefix_output_with_timestamp)
    return [result for _, result, _ in pairs]
