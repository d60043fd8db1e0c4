"""Type-checks core/ and plugins/ with mypy, as the installed ``fastps`` package.

The source folders are not named like the packages they install as (core/ is ``fastps``,
plugins/torch/ is ``fastps.torch``), and the plugins import ``fastps`` by name, so mypy
checks a temporary tree of links laid out like the wheel, read from the wheel's own layout
(``[tool.scikit-build]`` in pyproject.toml, through wheel_layout.py). Settings: ``[tool.mypy]``.

Usage: python tests/typecheck.py [extra mypy arguments]; exits with mypy's status.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from wheel_layout import stage

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="fastps-typecheck-") as tmp:
        stage(Path(tmp), suffixes=(".py", ".pyi"))
        cmd = [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(ROOT / ".mypy_cache"),
            "-p",
            "fastps",
            *sys.argv[1:],
        ]
        return subprocess.call(cmd, cwd=tmp, env={**os.environ, "MYPYPATH": tmp})


if __name__ == "__main__":
    sys.exit(main())
