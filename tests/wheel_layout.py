"""Where each source file lands in the installed package, read from the packaging config.

The source folders are not named like the packages they install as (core/ is ``fastps``,
plugins/tensorflow/ is ``fastps.tensorflow``, plugins/tensorflow/_alias/keras.py is
``fastps.keras``), so tools that need the installed layout without installing build it
from ``[tool.scikit-build]`` in pyproject.toml, as the wheel does: every
``wheel.force-include`` entry (a folder's files, or one file), less the files of a folder
that ``wheel.exclude`` names; a file named on its own is included regardless, and a later
entry wins at the same place. tests/typecheck.py (mypy) and the TensorFlow tests' conftest
(``fastps.tensorflow`` and ``fastps.keras`` for the workers) lay the package out from here.
"""

from __future__ import annotations

import fnmatch
import sys
from pathlib import Path, PurePosixPath
from typing import Any, Dict, Optional, Tuple

if sys.version_info >= (3, 11):
    import tomllib
else:  # mypy depends on tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent


def pyproject() -> Dict[str, Any]:
    """The checkout's pyproject.toml."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def _wheel_settings() -> Dict[str, Any]:
    config = pyproject()
    try:
        wheel: Dict[str, Any] = config["tool"]["scikit-build"]["wheel"]
        wheel["force-include"]
    except KeyError:
        raise SystemExit(
            "pyproject.toml has no [tool.scikit-build.wheel.force-include] table to lay "
            "the package out from"
        ) from None
    return wheel


def _excluded(inside: PurePosixPath, patterns: Tuple[str, ...]) -> bool:
    """``wheel.exclude``'s gitignore-style patterns, as far as this project uses them
    (``**/name/**``, ``folder/**``, ``*.ext``): ``*`` may span folders here."""
    return "__pycache__" in inside.parts or any(
        fnmatch.fnmatchcase(str(inside), p) for p in patterns
    )


def files(suffixes: Optional[Tuple[str, ...]] = None) -> Dict[PurePosixPath, Path]:
    """Place in the wheel (``fastps/keras.py``) -> source file, for files ending in one of
    ``suffixes`` (all files when None)."""
    wheel = _wheel_settings()
    patterns = tuple(wheel.get("exclude", []))
    out: Dict[PurePosixPath, Path] = {}
    for source, dest in wheel["force-include"].items():
        src = ROOT / source
        if src.is_file():
            out[PurePosixPath(dest)] = src
            continue
        if not src.is_dir():
            raise SystemExit(f"{src} (a wheel.force-include source) is missing")
        for path in sorted(src.rglob("*")):
            inside = PurePosixPath(dest, *path.relative_to(src).parts)
            if path.is_file() and not _excluded(inside, patterns):
                out[inside] = path
    if suffixes is not None:
        out = {k: v for k, v in out.items() if k.suffix in suffixes}
    return out


def stage(dest: Path, suffixes: Optional[Tuple[str, ...]] = None) -> None:
    """Links the files (those ending in one of ``suffixes``) into ``dest`` as the wheel
    places them."""
    for inside, src in files(suffixes).items():
        target = dest.joinpath(*inside.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(src)
