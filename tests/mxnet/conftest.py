"""Makes ``fastps.mxnet`` importable for the MXNet plugin tests (helpers: mxnet_jobs.py).

The suite's top-level conftest maps ``fastps`` to the checkout's ``core/``. The plugin lives
in ``plugins/mxnet``, so this conftest builds a throwaway package folder (symlinks to every
file of ``core/`` plus ``mxnet -> plugins/mxnet``) and puts it first on the path of this
process and of every process a test starts. Where the checkout has no C++ core built for
this interpreter, the installed fastps (``tests/envs/mxnet.sh`` installs it) is used.
"""

from __future__ import annotations

import importlib.machinery
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import List, Optional

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "core"
PLUGIN = ROOT / "plugins" / "mxnet"


def _checkout_core_built() -> bool:
    return any(
        (CORE / f"_core{suffix}").exists() for suffix in importlib.machinery.EXTENSION_SUFFIXES
    )


def _strip(entries: List[str]) -> List[str]:
    """Drops path entries that map ``fastps`` to the bare core (no plugins)."""
    return [
        e
        for e in entries
        if not (
            e
            and (Path(e) / "fastps").is_symlink()
            and (Path(e) / "fastps").resolve() == CORE.resolve()
        )
    ]


def _overlay() -> Optional[str]:
    if not _checkout_core_built():
        return None
    base = tempfile.mkdtemp(prefix="fastps-mxnet-tests-")
    pkg = Path(base) / "fastps"
    pkg.mkdir()
    for entry in CORE.iterdir():
        if entry.name != "__pycache__":
            (pkg / entry.name).symlink_to(entry)
    (pkg / "mxnet").symlink_to(PLUGIN, target_is_directory=True)
    return base


_BASE = _overlay()
sys.path[:] = _strip(sys.path)
_pythonpath = _strip(os.environ.get("PYTHONPATH", "").split(os.pathsep))
if _BASE is not None:
    sys.path.insert(0, _BASE)
    _pythonpath.insert(0, _BASE)
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in _pythonpath if p)
if "fastps" in sys.modules and _BASE is not None:
    # Imported already (the whole suite in one interpreter): let that package find the
    # plugin too, rather than loading a second copy of fastps.
    _pkg_path = sys.modules["fastps"].__path__
    if str(PLUGIN.parent) not in _pkg_path:
        _pkg_path.append(str(PLUGIN.parent))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _BASE is not None:
        shutil.rmtree(_BASE, ignore_errors=True)
