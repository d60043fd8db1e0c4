"""One Spark session (master local[2]) for the whole Spark tier (a JVM costs seconds)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parents[2] / "examples" / "torch"
sys.path[:0] = [str(HERE), str(EXAMPLES)]


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The session; its Python workers import this folder and the examples."""
    # The JVM and the Python workers it starts inherit this process's environment.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(HERE), str(EXAMPLES), os.environ.get("PYTHONPATH", "")]
    )
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("fastps-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
