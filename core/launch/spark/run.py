"""``fastps.spark.run``: Horovod's ``horovod.spark.run`` on fastps.

One Spark job of one barrier-mode stage with ``num_proc`` tasks: Spark starts them all at
once or not at all, and ends them all when one fails. Each task is one rank
(``fastps.launch.spark.task``); the results come back in rank order.
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

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
    ``stdout``, ``stderr``, ``prefix_output_with_timestamp`` and ``executable`` are
    accepted for Horovod's signature and not used.
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
    body = functools.partial(
        run_task,
        fn,
        tuple(args),
        dict(kwargs or {}),
        task_env(env, nics),
        timeout,
        sc.getConf().get("spark.driver.host"),
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
    return [result for _, result in sorted(pairs, key=lambda p: p[0])]
