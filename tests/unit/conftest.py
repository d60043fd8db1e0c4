"""The unit tier starts no process: a test here that tries fails at once, so a test that
needs a real job goes to tests/integration/ (or tests/rack/, tests/tools/) instead of
slowing down the tier that runs first (tests/README.md)."""

from __future__ import annotations

import os
import subprocess
from typing import Any, NoReturn

import pytest


def _refuse(what: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> NoReturn:
        raise AssertionError(
            f"tests/unit starts no process ({what}); "
            "a test that needs one belongs in tests/integration/"
        )

    return refuse


@pytest.fixture(autouse=True)
def _no_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subprocess.Popen, "__init__", _refuse("subprocess"))
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, _refuse(f"os.{name}"))
