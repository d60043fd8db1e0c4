"""TensorFlow plugin tests: every test starts real fastps jobs with fastpsrun.

The whole folder is skipped, with the reason, when TensorFlow cannot be imported by the
interpreter running pytest (tests/envs/tensorflow.sh prints one that can).

The suite's top-level conftest maps ``fastps`` to the checkout's ``core/`` alone; the plugin
lives in ``plugins/tensorflow`` and ``fastps.keras`` in ``plugins/tensorflow/_alias``. So
this conftest lays the whole package out as the wheel does (links in a throwaway folder,
tests/wheel_layout.py) and puts that folder first on the path of this process and of every
process a test starts. Where the checkout has no C++ core built for this interpreter, the
installed fastps (``tests/envs/tensorflow.sh`` installs it) is used.
"""

from __future__ import annotations

import importlib.machinery
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import pytest

HERE = Path(__file__).resolve().parent
CORE = HERE.parent.parent / "core"
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))
from wheel_layout import stage  # noqa: E402  (tests/, the suite's helpers)

try:
    import tensorflow  # noqa: F401
except Exception as exc:  # noqa: BLE001 - any import failure means "no usable TensorFlow"
    TF_MISSING: Optional[str] = (
        f"tensorflow is not importable in {sys.executable} ({type(exc).__name__}: {exc}); "
        "run tests/envs/tensorflow.sh and use the python it prints"
    )
else:
    TF_MISSING = None


def _layout() -> Optional[str]:
    """A folder holding ``fastps`` laid out as the wheel installs it; None without a core
    built in the checkout for this interpreter."""
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    if not any((CORE / f"_core{suffix}").exists() for suffix in suffixes):
        return None
    base = tempfile.mkdtemp(prefix="fastps-tf-tests-")
    stage(Path(base))
    return base


def _first(entry: str, path: str) -> str:
    return os.pathsep.join([entry, *(p for p in path.split(os.pathsep) if p and p != entry)])


_BASE = _layout()
if _BASE is not None:
    sys.path.insert(0, _BASE)
    os.environ["PYTHONPATH"] = _first(_BASE, os.environ.get("PYTHONPATH", ""))
    if "fastps" in sys.modules:
        # Imported already (the whole suite in one interpreter): let that package find the
        # plugin and fastps.keras too, rather than loading a second copy of fastps.
        _pkg_path = sys.modules["fastps"].__path__
        if os.path.join(_BASE, "fastps") not in _pkg_path:
            _pkg_path.append(os.path.join(_BASE, "fastps"))


@pytest.fixture(autouse=True)
def _wheel_layout_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keeps this layout first on the workers' path while a test of this folder runs,
    whatever another folder's conftest put in front of it since."""
    if _BASE is not None:
        monkeypatch.setenv("PYTHONPATH", _first(_BASE, os.environ.get("PYTHONPATH", "")))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "shared_check(group, name): the test asserts on check NAME of the shared job GROUP "
        "(tfjobs.SHARED_GROUPS), which it takes through the shared_check fixture",
    )


# The first test of a group to run starts the group's job, which runs every check of the group
# that a selected test asks for: its timeout is the job's, not one check's.
SHARED_JOB_TIMEOUT_S = 900


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("shared_check") is not None:
            item.add_marker(pytest.mark.timeout(SHARED_JOB_TIMEOUT_S))
    if TF_MISSING is None:
        return
    skip = pytest.mark.skip(reason=TF_MISSING)
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(skip)


def _shared_mark(item: pytest.Item) -> Optional[Tuple[str, str]]:
    mark = item.get_closest_marker("shared_check")
    return None if mark is None else (str(mark.args[0]), str(mark.args[1]))


@pytest.fixture(scope="session")
def _shared_jobs(
    request: pytest.FixtureRequest,
) -> Callable[[str, str], subprocess.CompletedProcess]:
    """(group, check) -> the check's share of its group's job, run once per session with the
    checks of the group that the selected tests ask for, in the group's order."""
    from tfjobs import SHARED_GROUPS, shared_job

    done: Dict[str, Dict[str, subprocess.CompletedProcess]] = {}

    def get(group: str, name: str) -> subprocess.CompletedProcess:
        if group not in done:
            wanted = {name} | {
                m[1] for m in map(_shared_mark, request.session.items) if m and m[0] == group
            }
            checks = [c for c in SHARED_GROUPS[group] if c[0] in wanted]
            done[group] = shared_job(checks)
        return done[group][name]

    return get


@pytest.fixture
def shared_check(
    request: pytest.FixtureRequest, _shared_jobs: Callable[[str, str], subprocess.CompletedProcess]
) -> subprocess.CompletedProcess:
    """The output of the check this test's ``shared_check(group, name)`` mark names, from
    its group's shared job (tfjobs.SHARED_GROUPS, workers/shared_checks.py)."""
    mark = _shared_mark(request.node)
    assert mark is not None, "the shared_check fixture needs a shared_check(group, name) mark"
    return _shared_jobs(*mark)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _BASE is not None:
        shutil.rmtree(_BASE, ignore_errors=True)
