"""``horovod.common.util``: the version comparison Horovod's Keras test imports, and which
controllers are built (Horovod's interactive-run test asks)."""

from packaging import version


def is_version_greater_equal_than(ver: str, target: str) -> bool:
    """True if ``ver`` (e.g. TensorFlow's ``__version__``) is at least ``target``."""
    return version.parse(ver.replace("-tf", "+tf")) >= version.parse(target)


def gloo_built() -> bool:
    """True: fastps's own transport stands where Horovod's Gloo controller does (no MPI)."""
    return True


def mpi_built() -> bool:
    return False
