"""``fastps.keras``: Horovod's ``horovod.keras`` name for :mod:`fastps.tensorflow.keras`.

    import fastps.keras as hvd
    hvd.init()
    model.compile(optimizer=hvd.DistributedOptimizer(opt), ...)

The wheel installs this file as ``fastps/keras.py`` and leaves its folder, ``_alias/``,
out of ``fastps.tensorflow`` (``[tool.scikit-build]`` in pyproject.toml). It holds nothing
of its own: importing it enters the one ``fastps.tensorflow.keras`` module, and each of that
package's submodules, in ``sys.modules`` under ``fastps.keras`` as well, so the two names
are the same module objects (one copy of every module's state), and
``import fastps.keras.callbacks`` or ``from fastps.keras.elastic import ...`` reach the
modules ``fastps.tensorflow.keras`` uses.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from typing import TYPE_CHECKING

ALIAS = "fastps.keras"
TARGET = "fastps.tensorflow.keras"

if TYPE_CHECKING:  # for type checkers, which do not follow the sys.modules entries below
    from fastps.tensorflow.keras import *  # noqa: F403


def _enter_alias() -> None:
    target = importlib.import_module(TARGET)
    for sub in pkgutil.iter_modules(target.__path__):  # the ones the package imports lazily too
        importlib.import_module(f"{TARGET}.{sub.name}")
    for name, module in list(sys.modules.items()):
        if name.startswith(TARGET + "."):
            sys.modules[ALIAS + name[len(TARGET) :]] = module
    # Last: the import system hands ``import fastps.keras`` what sys.modules holds once this
    # module has run, and binds that as the ``keras`` attribute of ``fastps``.
    sys.modules[ALIAS] = target


_enter_alias()
