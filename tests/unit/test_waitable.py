"""Every handle of a running operation, in the core and in every plugin, declares and
implements the one protocol (core/worker/waitable.py): ``poll()``,
``synchronize(timeout=None)`` and ``wait``.

A handle is a class that defines both ``poll`` and ``synchronize``; the check reads the
source (TensorFlow and MXNet need not be installed for it), and the core's classes are
checked at run time as well."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(
    p
    for folder in ("core", "plugins")
    for p in (ROOT / folder).rglob("*.py")
    if "__pycache__" not in p.parts and p.name != "waitable.py"
)


def _methods(cls: ast.ClassDef) -> Dict[str, ast.AST]:
    out: Dict[str, ast.AST] = {}
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[node.name] = node
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = node
    return out


def _base_names(cls: ast.ClassDef) -> List[str]:
    names = []
    for b in cls.bases:
        if isinstance(b, ast.Name):
            names.append(b.id)
        elif isinstance(b, ast.Attribute):
            names.append(b.attr)
    return names


def _handles() -> List[tuple]:
    found = []
    for path in SOURCES:
        tree = ast.parse(path.read_text(), filename=str(path))
        classes = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
        for cls in classes.values():
            # A class's own methods and those of its bases in the same module.
            chain: List[ast.ClassDef] = [cls]
            seen: Set[str] = {cls.name}
            while True:
                more = [
                    classes[b]
                    for c in chain
                    for b in _base_names(c)
                    if b in classes and b not in seen
                ]
                if not more:
                    break
                for m in more:
                    seen.add(m.name)
                chain.extend(more)
            methods: Dict[str, ast.AST] = {}
            for c in reversed(chain):
                methods.update(_methods(c))
            if "poll" in methods and "synchronize" in methods:
                bases = {b for c in chain for b in _base_names(c)}
                found.append((path.relative_to(ROOT), cls.name, methods, bases))
    return found


HANDLES = _handles()


def test_the_handles_are_found() -> None:
    names = {f"{p}:{c}" for p, c, _, _ in HANDLES}
    for expected in (
        "core/worker/api.py:Handle",
        "core/collectives/ops.py:Op",
        "plugins/torch/ops.py:Handle",
        "plugins/tensorflow/ops.py:Handle",
        "plugins/mxnet/ops.py:MXHandle",
    ):
        assert expected in names, sorted(names)


@pytest.mark.parametrize(
    "path,name,methods,bases", HANDLES, ids=[f"{p}:{c}" for p, c, _, _ in HANDLES]
)
def test_every_handle_implements_the_protocol(
    path: Path, name: str, methods: Dict[str, ast.AST], bases: Set[str]
) -> None:
    assert "Waitable" in bases, (
        f"{path}: class {name} does not declare fastps.worker.waitable.Waitable"
    )
    sync = methods["synchronize"]
    assert isinstance(sync, ast.FunctionDef)
    params = [a.arg for a in sync.args.args + sync.args.kwonlyargs]
    assert "timeout" in params, f"{path}: {name}.synchronize takes no timeout ({params})"
    assert "wait" in methods, f"{path}: {name} has no wait (Horovod's name for synchronize)"


def test_the_core_handles_satisfy_it_at_run_time() -> None:
    from fastps.collectives.ops import Op
    from fastps.worker.api import Handle
    from fastps.worker.waitable import Waitable

    for cls in (Handle, Op):
        assert issubclass(cls, Waitable), cls
