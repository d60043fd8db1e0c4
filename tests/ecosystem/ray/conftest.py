"""One local Ray cluster for the whole Ray tier (starting one costs seconds)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Iterator

import pytest

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parents[2] / "examples" / "torch"
sys.path[:0] = [str(HERE), str(EXAMPLES)]


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    """A local cluster of 4 CPUs; its workers import this folder and the examples."""
    import ray

    path = os.pathsep.join([str(HERE), str(EXAMPLES), os.environ.get("PYTHONPATH", "")])
    ray.init(
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=True,
        runtime_env={"env_vars": {"PYTHONPATH": path, "OMP_NUM_THREADS": "1"}},
    )
    try:
        yield
    finally:
        ray.shutdown()
