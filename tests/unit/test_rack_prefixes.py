"""Every rack test file uses rack prefixes no other test file uses.

tests/run.sh runs the rack tier two files at a time (pytest-xdist, ``--dist loadfile``); two
files that brought up racks with the same prefix at once would tear down each other's
namespaces (docs/design/rack.md, "Use different prefixes").
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Dict, Set

TESTS = Path(__file__).resolve().parents[1]
# Prefixes appear as string literals: PREFIX = "fpsm", prefix="fpsx", "--prefix", "fpsq".
_LITERAL = re.compile(r"""["'](fp[a-z][a-z0-9]{1,7})["']""")


def _prefixes_by_file() -> Dict[str, Set[str]]:
    found: Dict[str, Set[str]] = {}
    for path in sorted(TESTS.rglob("test_*.py")):
        if "unit" in path.relative_to(TESTS).parts:
            continue
        text = path.read_text()
        if "Rack(" not in text and "--prefix" not in text:
            continue
        names = set(_LITERAL.findall(text))
        if names:
            found[str(path.relative_to(TESTS))] = names
    return found


def test_each_rack_prefix_belongs_to_one_file() -> None:
    by_prefix: Dict[str, Set[str]] = defaultdict(set)
    for name, prefixes in _prefixes_by_file().items():
        for prefix in prefixes:
            by_prefix[prefix].add(name)
    shared = {p: sorted(files) for p, files in by_prefix.items() if len(files) > 1}
    assert not shared, f"rack prefixes used by more than one test file: {shared}"


def test_the_scan_finds_the_rack_files() -> None:
    found = _prefixes_by_file()
    # The scan must see the files it guards, or the test above passes vacuously.
    assert "fpsm" in found.get("rack/test_multihost.py", set()), found
    assert "fpsq" in found.get("rack/test_quorum_emulated.py", set()), found
    assert {"fpst", "fpsx", "fpss"} <= found.get("rack/test_rack.py", set()), found
    assert len(found) >= 8, found
