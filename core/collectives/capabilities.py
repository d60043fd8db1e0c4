"""Horovod's build/feature queries (``hvd.mpi_built()`` and friends), answered truthfully
for every plugin: fastps is built against none of these libraries. ``cuda_built`` is not
here: its answer depends on the framework (each plugin defines its own)."""

from __future__ import annotations


def mpi_built() -> bool:
    return False


def mpi_enabled() -> bool:
    return False


def mpi_threads_supported() -> bool:
    return False


def gloo_built() -> bool:
    return False


def gloo_enabled() -> bool:
    return False


def nccl_built() -> bool:
    return False


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def rocm_built() -> bool:
    return False
