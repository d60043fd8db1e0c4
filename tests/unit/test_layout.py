"""The package's architecture holds (docs/design/architecture.md, "Layout"): no import cycle
among product modules, the product never reaches into the source tree (benchmarks/, tests/,
docs/, sys.path), the plugins use only the core's public names, and nothing in this
repository imports a module by the flat layout's old name (those stay for users only,
``fastps/_moved.py``). Reads the sources; starts nothing."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = ("torch", "tensorflow", "mxnet")


def product_files() -> Iterator[Tuple[str, Path, bool]]:
    """(module name, file, is a package) of every module of the installed package."""
    for path in sorted((ROOT / "core").rglob("*.py")):
        yield module_of(path.relative_to(ROOT / "core"), "fastps"), path, path.name == "__init__.py"
    for plugin in PLUGINS:
        base = ROOT / "plugins" / plugin
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(base)
            yield module_of(rel, f"fastps.{plugin}"), path, path.name == "__init__.py"


def module_of(rel: Path, prefix: str) -> str:
    parts = [prefix, *rel.with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports(tree: ast.Module, module: str, is_pkg: bool) -> Iterator[Tuple[str, str, ast.AST]]:
    """(imported module, imported name or "", node) for every import, at any depth, except
    those only for type checking."""
    package = module if is_pkg else module.rsplit(".", 1)[0]
    stack: List[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        for child in ast.iter_child_nodes(node):
            if _type_checking(child):
                continue
            if isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[: len(base) - (child.level - 1)]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                for alias in child.names:
                    yield target, alias.name, child
            elif isinstance(child, ast.Import):
                for alias in child.names:
                    yield alias.name, "", child
            stack.append(child)


def load() -> Dict[str, Tuple[Path, bool, ast.Module]]:
    return {m: (p, pkg, ast.parse(p.read_text())) for m, p, pkg in product_files()}


def graph(mods: Dict[str, Tuple[Path, bool, ast.Module]]) -> Dict[str, Set[str]]:
    known = set(mods) | {"fastps._core"}
    edges: Dict[str, Set[str]] = {m: set() for m in mods}
    for m, (_, pkg, tree) in mods.items():
        for target, name, _ in imports(tree, m, pkg):
            full = f"{target}.{name}" if name else target
            dep = full if full in known else target
            if dep in mods and dep != m:
                edges[m].add(dep)
    return edges


def find_cycle(edges: Dict[str, Set[str]]) -> Optional[List[str]]:
    state: Dict[str, int] = {}
    path: List[str] = []

    def visit(m: str) -> Optional[List[str]]:
        state[m] = 1
        path.append(m)
        for d in sorted(edges[m]):
            if state.get(d) == 1:
                return path[path.index(d) :] + [d]
            if d not in state:
                found = visit(d)
                if found:
                    return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(edges):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_no_import_cycle_among_product_modules() -> None:
    cycle = find_cycle(graph(load()))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_cycle_finder_sees_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def _path_calls(tree: ast.Module) -> Iterator[ast.AST]:
    """String constants that name the source tree's docs/ as a path to read."""
    for node in ast.walk(tree):
        args: List[ast.AST] = []
        if isinstance(node, ast.Call):
            args = [*node.args, *(k.value for k in node.keywords)]
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            args = [node.left, node.right]
        for a in args:
            if isinstance(a, ast.Constant) and isinstance(a.value, str):
                if a.value == "docs" or a.value.startswith("docs/"):
                    yield a


def test_product_never_reaches_into_the_source_tree() -> None:
    bad = []
    for m, (path, pkg, tree) in load().items():
        where = path.relative_to(ROOT)
        for target, _, node in imports(tree, m, pkg):
            if target.split(".")[0] in ("benchmarks", "tests"):
                bad.append(f"{where}:{node.lineno}: imports {target}")
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "path"
                and isinstance(node.value, ast.Name)
                and node.value.id == "sys"
            ):
                bad.append(f"{where}:{node.lineno}: uses sys.path")
            if isinstance(node, ast.Call) and ast.unparse(node.func) in (
                "importlib.import_module",
                "__import__",
            ):
                first = node.args[0] if node.args else None
                if isinstance(first, ast.Constant) and str(first.value).split(".")[0] in (
                    "benchmarks",
                    "tests",
                ):
                    bad.append(f"{where}:{node.lineno}: imports {first.value}")
        for node in _path_calls(tree):
            bad.append(f"{where}:{getattr(node, 'lineno', 0)}: reads docs/")
    assert not bad, "\n".join(bad)


def _core_module(name: str) -> bool:
    return name == "fastps" or (
        name.startswith("fastps.") and name.split(".")[1] not in (*PLUGINS, "keras")
    )


def test_plugins_use_only_public_names_of_the_core() -> None:
    mods = load()
    bad = []
    for m, (path, pkg, tree) in mods.items():
        if _core_module(m):
            continue
        where = path.relative_to(ROOT)
        aliases: Set[str] = set()  # local names bound to core modules
        for target, name, node in imports(tree, m, pkg):
            assert isinstance(node, (ast.Import, ast.ImportFrom))
            for alias in node.names:
                if alias.name != (name or target):
                    continue
                full = f"{target}.{name}" if name else target
                if name and _core_module(target) and name.startswith("_") and name != "_core":
                    if f"{target}.{name}" not in mods:
                        bad.append(f"{where}:{node.lineno}: imports {target}.{name}")
                if _core_module(full) and (full in mods or full == "fastps._core"):
                    aliases.add(alias.asname or (name or target).split(".")[0])
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                bad.append(f"{where}:{node.lineno}: uses {node.value.id}.{node.attr}")
    assert not bad, f"{len(bad)} uses of the core's private names:\n" + "\n".join(bad)


def test_nothing_here_imports_the_old_flat_names() -> None:
    old = _old_names()
    bad = []
    for folder in ("core", "plugins", "tests", "benchmarks", "examples"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.name == "_moved.py":
                continue
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                names: List[str] = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                for n in names:
                    if n in old:
                        bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {n}")
    assert not bad, "old module names (import the new ones):\n" + "\n".join(bad)


def _old_names() -> Set[str]:
    tree = ast.parse((ROOT / "core" / "_moved.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "MOVED":
            value = ast.literal_eval(node.value)
            return {f"fastps.{k}" for k in value}
    raise AssertionError("core/_moved.py has no MOVED table")


def test_every_subpackage_says_what_it_is_for() -> None:
    missing = []
    for path in sorted((ROOT / "core").rglob("__init__.py")):
        if not ast.get_docstring(ast.parse(path.read_text())):
            missing.append(str(path.relative_to(ROOT)))
    assert not missing, f"subpackages without a docstring: {missing}"
