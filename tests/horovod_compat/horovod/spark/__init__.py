"""``horovod.spark`` -> ``fastps.spark`` (Horovod's ``test/integration/test_spark.py``).

``run`` is ``fastps.spark.run`` itself (Horovod's signature). Everything else the test file
and its helper ``test/utils/spark_common.py`` import is a Horovod internal (its driver and
task services, mpirun/Gloo command builders, estimator stores and data preparation) that
fastps has no counterpart of: ``horovod.spark._internals`` registers those modules so the
file loads, and any use of one of their names fails with a message naming it.
"""

from typing import Any, NoReturn

from fastps.spark import run

from . import _internals

__all__ = ["run", "run_elastic"]


def run_elastic(*args: Any, **kwargs: Any) -> NoReturn:
    """Horovod's elastic Spark run: not provided by fastps (docs/guide/spark.md, Limits)."""
    raise NotImplementedError("horovod.spark.run_elastic: fastps.spark has no elastic run")


_internals.register()
