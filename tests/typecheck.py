"""Type-checks core/ and plugins/ with mypy, as the installed ``fastps`` package.

The source folders are not named like the packages they install as (core/ is ``fastps``,
plugins/torch/ is ``fastps.torch``), and the plugins import ``fastps`` by name, so mypy
checks a temporary tree of links laid out like the wheel, read from the wheel's own layout
(``[tool.scikit-build.wheel.force-include]`` in pyproject.toml). Settings: ``[tool.mypy]``.

Usage: python tests/typecheck.py [extra mypy arguments]; exits with mypy's status.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python < 3.11: mypy itself depends on tomli there
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parent.parent


def layout() -> dict:
    """Source folder -> folder in the wheel, from the packaging config."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        config = tomllib.load(f)
    try:
        return dict(config["tool"]["scikit-build"]["wheel"]["force-include"])
    except KeyError:
        raise SystemExit(
            "typecheck: pyproject.toml has no [tool.scikit-build.wheel."
            "force-include] table to lay the package out from"
        ) from None


def stage(dest: Path) -> None:
    """Links every source file into ``dest`` as the wheel places it."""
    for src_dir, inside in layout().items():
        src = ROOT / src_dir
        if not src.is_dir():
            raise SystemExit(f"typecheck: {src} is missing")
        for path in src.rglob("*"):
            if path.suffix not in (".py", ".pyi") or "__pycache__" in path.parts:
                continue
            target = dest / inside / path.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(path)


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="fastps-typecheck-") as tmp:
        stage(Path(tmp))
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
