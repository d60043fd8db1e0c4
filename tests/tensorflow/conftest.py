"""TensorFlow plugin tests: every test starts real fastps jobs with fastpsrun.

The whole folder is skipped, with the reason, when TensorFlow cannot be imported by the
interpreter running pytest (tests/envs/tensorflow.sh prints one that can).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import pytest

HERE = Path(__file__).resolve().parent

try:
    import tensorflow  # noqa: F401
except Exception as exc:  # noqa: BLE001 - any import failure means "no usable TensorFlow"
    TF_MISSING: Optional[str] = (
        f"tensorflow is not importable in {sys.executable} ({type(exc).__name__}: {exc}); "
        "run tests/envs/tensorflow.sh and use the python it prints"
    )
else:
    TF_MISSING = None


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    if TF_MISSING is None:
        return
    skip = pytest.mark.skip(reason=TF_MISSING)
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(skip)
