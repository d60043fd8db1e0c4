"""Every ``FASTPS_*`` variable is read in one place: ``fastps.config`` (core/config.py),
with one default each. Scans the sources of core/ and plugins/ for any other read of one:
``os.environ.get("FASTPS_X")`` (also ``.pop``/``.setdefault``), ``os.getenv("FASTPS_X")``,
``os.environ["FASTPS_X"]`` loaded, ``"FASTPS_X" in os.environ``, and the same ``.get``,
subscript and ``in`` on any other mapping (an ``env`` handed to the launcher is an
environment too). A key is a string or f-string starting with ``FASTPS_``, or a name bound to
one at a module's top level (``ENV = "FASTPS_GC_FREEZE"``, ``wire.ID_VAR``). Building a
child's environment (assigning keys, copying ``os.environ``, dropping a key from the copy)
reads nothing and passes. Reads the sources; starts nothing."""

from __future__ import annotations

import ast
import shutil
import textwrap
from pathlib import Path
from typing import Iterator, List, Set, Tuple

ROOT = Path(__file__).resolve().parents[2]
THE_READER = Path("core") / "config.py"


def sources(root: Path) -> Iterator[Tuple[Path, str]]:
    """(path relative to ``root``, text) of every Python file of core/ and plugins/
    (core/torch & co. are links to the plugins: rglob does not follow them)."""
    for folder in ("core", "plugins"):
        for path in sorted((root / folder).rglob("*.py")):
            yield path.relative_to(root), path.read_text()


def fastps_constants(texts: List[str]) -> Set[str]:
    """Names bound at a module's top level to a ``FASTPS_*`` string, in any of ``texts``."""
    names: Set[str] = set()
    for text in texts:
        for node in ast.parse(text).body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and _names_var(node.value, set()):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def _names_var(node: object, constants: Set[str]) -> bool:
    """Whether ``node`` (an expression) is the name of a FASTPS_ variable."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.startswith("FASTPS_")
    if isinstance(node, ast.JoinedStr) and node.values:
        first = node.values[0]
        return isinstance(first, ast.Constant) and str(first.value).startswith("FASTPS_")
    if isinstance(node, ast.Name):
        return node.id in constants
    if isinstance(node, ast.Attribute):
        return node.attr in constants
    return False


def _is_environ(node: ast.AST) -> bool:
    """``os.environ``, or ``environ`` imported from os."""
    if isinstance(node, ast.Attribute):
        return node.attr == "environ" and isinstance(node.value, ast.Name) and node.value.id == "os"
    return isinstance(node, ast.Name) and node.id == "environ"


def reads(text: str, constants: Set[str]) -> List[Tuple[int, str]]:
    """(line, code) of every read of a FASTPS_ variable in the source ``text``."""
    found: List[Tuple[int, str]] = []
    for node in ast.walk(ast.parse(text)):
        hit = False
        if isinstance(node, ast.Call) and node.args and _names_var(node.args[0], constants):
            func = node.func
            if isinstance(func, ast.Attribute):
                hit = func.attr in ("get", "getenv") or (
                    func.attr in ("pop", "setdefault") and _is_environ(func.value)
                )
            elif isinstance(func, ast.Name):
                hit = func.id == "getenv"
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            hit = _names_var(node.slice, constants)
        elif isinstance(node, ast.Compare):
            hit = _names_var(node.left, constants) and any(
                isinstance(op, (ast.In, ast.NotIn)) for op in node.ops
            )
        if hit:
            found.append((getattr(node, "lineno", 0), ast.unparse(node)))
    return found


def stray_reads(root: Path) -> List[str]:
    """Every read of a FASTPS_ variable under ``root``'s core/ and plugins/ outside
    core/config.py, as ``path:line: code``."""
    files = list(sources(root))
    constants = fastps_constants([text for _, text in files])
    return [
        f"{rel}:{line}: {code}"
        for rel, text in files
        if rel != THE_READER
        for line, code in reads(text, constants)
    ]


def test_only_config_reads_fastps_variables() -> None:
    bad = stray_reads(ROOT)
    assert not bad, (
        "FASTPS_* read outside core/config.py (add a Config field or a function there, and a "
        "row in docs/reference/configuration.md):\n" + "\n".join(bad)
    )


def test_the_scan_sees_every_kind_of_read() -> None:
    source = textwrap.dedent(
        """
        import os
        from os import environ, getenv

        ENV = "FASTPS_GC_FREEZE"
        a = os.environ.get("FASTPS_SFB", "off")
        b = os.getenv("FASTPS_TOPOLOGY")
        c = os.environ["FASTPS_LAUNCHER"]
        d = "FASTPS_HOST" in os.environ
        e = os.environ.get(ENV)
        f = environ.get(wire.ID_VAR)
        g = getenv(f"FASTPS_{name}")
        h = env.get("FASTPS_ELASTIC_DEFER_JOIN", "0")
        i = "FASTPS_IFACE" not in base_env
        j = os.environ.pop("FASTPS_TOKEN")
        """
    )
    lines = sorted(line for line, _ in reads(source, {"ENV", "ID_VAR"}))
    assert lines == list(range(6, 16)), reads(source, {"ENV", "ID_VAR"})


def test_building_a_childs_environment_is_no_read() -> None:
    source = textwrap.dedent(
        """
        import os

        env = dict(os.environ)
        env["FASTPS_RANK"] = "0"
        env.pop("FASTPS_TOKEN", None)
        child = {**os.environ, "FASTPS_ROLE": "server"}
        kept = {k: v for k, v in os.environ.items() if not k.startswith("FASTPS_")}
        os.environ.update({"FASTPS_JOB_ID": "j"})
        other = os.environ.get("TMPDIR", "/tmp")
        """
    )
    assert reads(source, {"ENV"}) == []


def test_a_stray_read_in_a_copy_of_the_tree_fails(tmp_path: Path) -> None:
    for rel, text in sources(ROOT):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert stray_reads(tmp_path) == []
    sfb = tmp_path / "core" / "collectives" / "sfb.py"
    lines = sfb.read_text().splitlines()
    lines.append('STRAY = __import__("os").environ.get("FASTPS_SFB", "off")')
    sfb.write_text("\n".join(lines) + "\n")
    assert stray_reads(tmp_path) == [
        f"core/collectives/sfb.py:{len(lines)}: __import__('os').environ.get('FASTPS_SFB', 'off')"
    ]
    # The same read in core/config.py is the one allowed.
    shutil.copy(sfb, tmp_path / THE_READER)
    assert len(stray_reads(tmp_path)) == 1
