"""Stand-ins for the Horovod internals that ``test/integration/test_spark.py`` and
``test/utils/spark_common.py`` import at load time.

Each module below is registered in ``sys.modules`` under Horovod's name, holding the names
the files import. None of them does anything: calling a name, or reading any attribute of
it (which is what ``mock.patch`` of ``Name.attribute`` does), raises ``NotImplementedError``
naming the internal, so a test of Horovod's own machinery fails with that message instead
of passing against a fake. The few exceptions are answers that are true of fastps:
``is_open_mpi()`` is False (fastps does not run on MPI), and ``horovod.runner.launch`` gets
``gloo_built`` / ``mpi_built`` (Horovod's module imports them from ``horovod.common.util``;
``test/utils/common.py``'s ``is_built`` patches them there). Nothing of Horovod's code is here.
"""

import importlib
import sys
import types
from typing import Any, Dict, NoReturn, Tuple

# Horovod's module -> the names the test files import from it.
_MODULES: Dict[str, Tuple[str, ...]] = {
    "horovod.runner.common.util.codec": ("dumps_base64", "loads_base64"),
    "horovod.runner.common.util.secret": ("make_secret_key", "HOROVOD_SECRET_KEY"),
    "horovod.runner.common.util.safe_shell_exec": ("execute",),
    "horovod.runner.common.util.timeout": ("Timeout",),
    "horovod.runner.common.util.settings": ("Settings",),
    "horovod.runner.mpi_run": (),
    "horovod.spark.common": (),
    "horovod.spark.common.constants": (),
    "horovod.spark.common.util": (
        "host_hash",
        "_wait_file_available_on_dbfs",
        "_get_spark_df_saved_file_list",
    ),
    "horovod.spark.common.store": (
        "Store",
        "FilesystemStore",
        "LocalStore",
        "HDFSStore",
        "DBFSLocalStore",
    ),
    "horovod.spark.driver": (),
    "horovod.spark.driver.driver_service": ("SparkDriverService", "SparkDriverClient"),
    "horovod.spark.driver.host_discovery": ("SparkDriverHostDiscovery",),
    "horovod.spark.driver.rsh": ("rsh",),
    "horovod.spark.runner": ("_task_fn",),
    "horovod.spark.task": ("get_available_devices", "gloo_exec_fn", "mpirun_exec_fn"),
    "horovod.spark.task.task_service": ("SparkTaskService", "SparkTaskClient"),
}


def _refuse(what: str) -> NoReturn:
    raise NotImplementedError(
        f"{what} is a Horovod internal; fastps.spark has no counterpart "
        "(the shim provides horovod.spark.run only)"
    )


class Internal:
    """A Horovod internal by name: calling it or reading an attribute of it raises."""

    def __init__(self, qualname: str) -> None:
        self._qualname = qualname

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        _refuse(self._qualname)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # introspection (pytest, mock, pickle) sees a plain object
            raise AttributeError(name)
        _refuse(f"{self._qualname}.{name}")

    def __repr__(self) -> str:
        return f"<Horovod internal {self._qualname}, not in fastps>"


def _module(fullname: str, names: Tuple[str, ...]) -> types.ModuleType:
    module = types.ModuleType(fullname, f"Stand-in for Horovod's {fullname} (see {__name__}).")
    module.__path__ = []  # a package, so Horovod's submodules of it resolve
    for name in names:
        setattr(module, name, Internal(f"{fullname}.{name}"))

    def missing(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        _refuse(f"{fullname}.{name}")

    module.__getattr__ = missing  # type: ignore[method-assign]
    return module


def is_open_mpi(*args: Any, **kwargs: Any) -> bool:
    """``horovod.runner.mpi_run.is_open_mpi``: no MPI runs under fastps."""
    return False


def register() -> None:
    """Puts the stand-ins into ``sys.modules`` (idempotent)."""
    for fullname, names in _MODULES.items():
        if fullname in sys.modules:
            continue
        module = _module(fullname, names)
        if fullname == "horovod.runner.mpi_run":
            module.is_open_mpi = is_open_mpi  # type: ignore[attr-defined]
        sys.modules[fullname] = module
        parent, _, leaf = fullname.rpartition(".")
        setattr(importlib.import_module(parent), leaf, module)
    from horovod.common.util import gloo_built, mpi_built

    launch = importlib.import_module("horovod.runner.launch")
    for name, value in (("gloo_built", gloo_built), ("mpi_built", mpi_built)):
        if not hasattr(launch, name):
            setattr(launch, name, value)
