"""Shared test fixtures: make ``import fastps`` resolve to this checkout, in this process
and in every subprocess a test starts, without requiring the package to be installed."""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "core"


def _fastps_path() -> str:
    """A folder holding ``fastps -> <checkout>/core`` (the package maps that folder)."""
    base = Path(tempfile.gettempdir()) / f"fastps-src-{os.getuid()}-{abs(hash(str(ROOT))) % 10**8}"
    base.mkdir(exist_ok=True)
    link = base / "fastps"
    if not (link.is_symlink() and link.resolve() == CORE.resolve()):
        tmp = base / f"fastps.{os.getpid()}"
        tmp.symlink_to(CORE, target_is_directory=True)
        os.replace(tmp, link)
    return str(base)


def _installed_from_checkout() -> bool:
    """True when ``import fastps`` (e.g. an editable install) already finds this checkout."""
    try:
        spec = importlib.util.find_spec("fastps")
    except (ImportError, ValueError):
        return False
    origin = spec.origin if spec is not None else None
    return origin is not None and Path(origin).resolve().parent == CORE.resolve()


if not _installed_from_checkout():
    _PATH = _fastps_path()
    sys.path.insert(0, _PATH)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (_PATH, os.environ.get("PYTHONPATH", "")) if p
    )


@pytest.fixture
def subprocess_env() -> dict[str, str]:
    """Environment for child processes: this checkout importable, no FASTPS_* leaking in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPS_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env
