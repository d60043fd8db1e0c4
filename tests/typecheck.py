"""Type-checks core/ and plugins/ with mypy, as the installed ``fastps`` package.

The source folders are not named like the packages they install as (core/ is ``fastps``,
plugins/torch/ is ``fastps.torch``; see the packaging config in pyproject.toml), and the
plugins import ``fastps`` by name, so mypy checks a temporary tree of links laid out like
the installed package. Settings: ``[tool.mypy]`` in pyproject.toml.

Usage: python tests/typecheck.py [extra mypy arguments]; exits with mypy's status.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Source folder -> where it lands inside the package (same as the wheel's layout).
LAYOUT = {
    "core": ".",
    "plugins/torch": "torch",
    "plugins/tensorflow": "tensorflow",
    "plugins/mxnet": "mxnet",
}


def stage(dest: Path) -> Path:
    """Links every source file into ``dest/fastps`` as the wheel places it."""
    pkg = dest / "fastps"
    for src_dir, inside in LAYOUT.items():
        src = ROOT / src_dir
        if not src.is_dir():
            raise SystemExit(f"typecheck: {src} is missing")
        for path in src.rglob("*"):
            if path.suffix not in (".py", ".pyi") or "__pycache__" in path.parts:
                continue
            target = pkg / inside / path.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(path)
    return pkg


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="fastps-typecheck-") as tmp:
        stage(Path(tmp))
        cmd = [
            sys.executable, "-m", "mypy",
            "--config-file", str(ROOT / "pyproject.toml"),
            "--cache-dir", str(ROOT / ".mypy_cache"),
            "-p", "fastps", *sys.argv[1:],
        ]
        return subprocess.call(cmd, cwd=tmp, env={**os.environ, "MYPYPATH": tmp})


if __name__ == "__main__":
    sys.exit(main())
