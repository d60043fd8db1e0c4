"""The documentation holds together: every relative link in docs/ and README.md resolves
(anchors included), docs/index.md links every page under docs/, every ``docs/...`` path the
docs and the code outside the package cite exists, and docs/reference/api.md names every
public name of the four packages. Reads files only."""

from __future__ import annotations

import ast
import glob
import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
LINKED = [*PAGES, ROOT / "README.md"]

# Inline links and images: [text](target) / ![alt](target); code is masked out first.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")

# Where the repository cites docs by path (core/ and plugins/ are the package's own code).
CITING = ["README.md", "docs", "tests", "benchmarks", "examples", "csrc", ".ci", "pyproject.toml"]
CITING_SUFFIXES = {".md", ".py", ".sh", ".cc", ".h", ".toml", ""}
CITED = re.compile(r"(?<![\w./-])docs/[\w.{},*/-]*")


def _masked(text: str) -> str:
    """The text with fenced code blocks and code spans blanked (line numbers kept)."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return CODE_SPAN.sub(lambda m: " " * len(m.group(0)), text)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: link markup dropped, lower case, punctuation and
    symbols removed (letters, digits, marks, '-' and '_' stay), spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in ("L", "N", "M"))
    return kept.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    in_fence = False
    for line in page.read_text().splitlines():
        if line.startswith(("```", "~~~")):
            in_fence = not in_fence
            continue
        m = None if in_fence else HEADING.match(line)
        if m:
            slug = _slug(m.group(2))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _links(page: Path) -> list[tuple[int, str]]:
    masked = _masked(page.read_text())
    return [(masked.count("\n", 0, m.start()) + 1, m.group(1)) for m in LINK.finditer(masked)]


def _relative(target: str) -> bool:
    return not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target)


def test_docs_exist() -> None:
    assert (DOCS / "index.md").is_file()
    assert len(PAGES) > 20


@pytest.mark.parametrize("page", LINKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for line, target in _links(page):
        if not _relative(target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{page.relative_to(ROOT)}:{line}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{page.relative_to(ROOT)}:{line}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_index_links_every_page() -> None:
    index = DOCS / "index.md"
    linked = {
        (index.parent / t.partition("#")[0]).resolve()
        for _, t in _links(index)
        if _relative(t) and t.partition("#")[0]
    }
    missing = [str(p.relative_to(ROOT)) for p in PAGES if p != index and p not in linked]
    assert not missing, f"docs/index.md does not link: {missing}"


def _expand(path: str) -> list[str]:
    """``a{b,c}d`` -> ``abd``, ``acd`` (one level, as the docs write it)."""
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    return [
        alt
        for part in m.group(1).split(",")
        for alt in _expand(path[: m.start()] + part + path[m.end() :])
    ]


def _citing_files() -> list[Path]:
    files = []
    for name in CITING:
        top = ROOT / name
        candidates = [top] if top.is_file() else sorted(top.rglob("*"))
        for f in candidates:
            if f.is_file() and f.suffix in CITING_SUFFIXES and "__pycache__" not in f.parts:
                files.append(f)
    return files


def test_cited_docs_paths_exist() -> None:
    """A cited page must exist; a cited data file need only have its folder (a command's
    output may not have been written yet)."""
    broken = []
    for f in _citing_files():
        try:
            text = f.read_text()
        except UnicodeDecodeError:
            continue
        for m in CITED.finditer(text):
            cited = m.group(0).rstrip(".,:;")
            if cited in ("docs/", "docs"):
                continue
            for path in _expand(cited):
                where = f"{f.relative_to(ROOT)}: {path}"
                if "*" in path:
                    if not glob.glob(str(ROOT / path)):
                        broken.append(where)
                elif path.endswith(".md") or path.endswith("/") or "." not in Path(path).name:
                    if not (ROOT / path).exists():
                        broken.append(where)
                elif not (ROOT / path).parent.is_dir():
                    broken.append(where)
    assert not broken, "\n".join(broken)


def _public_names(init: Path) -> list[str]:
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return list(ast.literal_eval(node.value))
    raise AssertionError(f"{init} has no literal __all__")


@pytest.mark.parametrize(
    "module, init",
    [
        ("fastps", "core/__init__.py"),
        ("fastps.torch", "plugins/torch/__init__.py"),
        ("fastps.tensorflow", "plugins/tensorflow/__init__.py"),
        ("fastps.mxnet", "plugins/mxnet/__init__.py"),
    ],
)
def test_api_reference_names_every_public_name(module: str, init: str) -> None:
    text = (DOCS / "reference" / "api.md").read_text()
    m = re.search(rf"^## `{re.escape(module)}`\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert m, f"docs/reference/api.md has no section '## `{module}`'"
    named = set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)", m.group(1)))
    missing = [n for n in _public_names(ROOT / init) if n not in named]
    assert not missing, f"docs/reference/api.md, {module}: not described: {missing}"
