"""The Ray tier's clusters: one local cluster of 4 CPUs that most tests share (starting one
costs seconds)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Iterator

import pytest

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parents[2] / "examples" / "torch"
sys.path[:0] = [str(HERE), str(EXAMPLES)]


def worker_path() -> str:
    """PYTHONPATH for the test clusters' workers: this folder and the examples."""
    return os.pathsep.join([str(HERE), str(EXAMPLES), os.environ.get("PYTHONPATH", "")])


@pytest.fixture(scope="session")
def _ray_tier() -> Iterator[None]:
    """Disconnects from whatever cluster the tier used last, once at the end."""
    import ray

    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture
def ray_cluster(_ray_tier: None) -> None:
    """A local cluster of 4 CPUs, started by the first test that asks for it and kept for the
    next ones (a module with a cluster of its own, test_ray_cpu_servers.py, disconnects it;
    the next test here starts a new one)."""
    import ray

    if ray.is_initialized():
        return
    ray.init(
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=True,
        runtime_env={"env_vars": {"PYTHONPATH": worker_path(), "OMP_NUM_THREADS": "1"}},
    )
