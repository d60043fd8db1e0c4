"""The simulator and the planner are product code: they run from an installed package, with
no fastps source tree. None of fastps.sim and fastps.plan imports benchmarks/ or tests/,
reads docs/, edits sys.path, or finds files next to itself; the planner runs from another
directory without opening a file of the checkout outside core/; the calibration harness
that does read docs/ is benchmarks/sim_calibration.py, and the old command says so."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Iterator, List, Optional

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "core"
SOURCE_TREE = ("benchmarks", "tests", "docs")  # folders of the checkout, not of the package
DYNAMIC_IMPORTS = {"import_module", "__import__", "run_module", "run_path"}


def product_modules() -> List[Path]:
    return sorted((CORE / "sim").rglob("*.py")) + [CORE / "plan.py"]


def _first_part(text: str) -> str:
    return text.replace("\\", "/").lstrip("./").split("/", 1)[0]


def offences(path: Path, text: Optional[str] = None) -> Iterator[str]:
    """Every way ``path`` leans on the source tree: imports of its folders (static or
    dynamic), sys.path, __file__, and a path into benchmarks/, tests/ or docs/ built from a
    string (a call's positional argument or an operand of ``/``; help texts and docstrings
    may name those folders)."""
    tree = ast.parse(path.read_text() if text is None else text, str(path))
    depth = len(path.relative_to(CORE).parts) - 1  # packages below fastps
    for node in ast.walk(tree):
        where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in SOURCE_TREE:
                    yield f"{where}: import {alias.name}"
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 0 and module.split(".")[0] in SOURCE_TREE:
                yield f"{where}: from {module} import"
            if node.level > depth + 1:
                yield f"{where}: relative import above the fastps package"
        elif isinstance(node, ast.Attribute):
            if node.attr == "path" and isinstance(node.value, ast.Name) and node.value.id == "sys":
                yield f"{where}: sys.path"
            if node.attr in DYNAMIC_IMPORTS:
                yield f"{where}: dynamic import ({node.attr})"
        elif isinstance(node, ast.Name):
            if node.id == "__file__":
                yield f"{where}: __file__ (the package has no data files to find)"
            if node.id in DYNAMIC_IMPORTS:
                yield f"{where}: dynamic import ({node.id})"
        elif isinstance(node, (ast.Call, ast.BinOp)):
            if isinstance(node, ast.Call):
                parts: List[ast.expr] = list(node.args)
            elif isinstance(node.op, ast.Div):
                parts = [node.left, node.right]
            else:
                parts = []
            for arg in parts:
                if (
                    isinstance(arg, ast.Constant)
                    and isinstance(arg.value, str)
                    and _first_part(arg.value) in SOURCE_TREE
                ):
                    yield f"{where}: path {arg.value!r} in the source tree"


def test_the_check_sees_the_old_offences() -> None:
    # what fastps.sim did before (workload.py, calibration.py), each caught
    bad = CORE / "sim" / "_probe_never_written.py"
    text = (
        "import sys, importlib\n"
        "from pathlib import Path\n"
        "import benchmarks.emulator.models\n"
        "from tests import conftest\n"
        "root = Path(__file__).resolve().parents[2]\n"
        "sys.path.insert(0, str(root))\n"
        "m = importlib.import_module('benchmarks.emulator.models')\n"
        "results = root / 'docs' / 'rack-results'\n"
        "other = Path('docs/sim-results')\n"
        "from ... import x\n"
    )
    found = list(offences(bad, text))
    for what in (
        "import benchmarks",
        "from tests",
        "__file__",
        "sys.path",
        "import_module",
        "'docs'",
        "'docs/sim-results'",
        "relative import",
    ):
        assert any(what in f for f in found), (what, found)
    assert not list(offences(bad, 'p.add_argument("--x", help="see docs/design/simulator.md")\n'))


@pytest.mark.parametrize("path", product_modules(), ids=lambda p: str(p.relative_to(CORE)))
def test_product_module_needs_no_source_tree(path: Path) -> None:
    assert list(offences(path)) == []


# Runs the planner as an installed user would, from an empty directory, refusing any import
# of benchmarks or tests and recording every file opened in the checkout's other folders.
PROBE = """
import json, os, runpy, sys
root = sys.argv[1]
banned = tuple(os.path.join(root, d) + os.sep for d in ("benchmarks", "tests", "docs"))
touched = []

def audit(event, args):
    if event in ("open", "os.listdir", "os.scandir") and args and isinstance(args[0], str):
        p = os.path.realpath(args[0])
        if (p + os.sep).startswith(banned):
            touched.append(p)

class Refuse:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.split(".")[0] in ("benchmarks", "tests"):
            raise ImportError("the product imported " + name)

sys.addaudithook(audit)
sys.meta_path.insert(0, Refuse())
before = list(sys.path)
sys.argv = ["fastps.plan"] + sys.argv[2:]
try:
    runpy.run_module("fastps.plan", run_name="__main__")
    code = 0
except SystemExit as e:
    code = e.code
print(json.dumps({"code": code, "touched": touched, "sys_path_same": sys.path == before,
    "modules": sorted(m for m in sys.modules if m.split(".")[0] in ("benchmarks", "tests"))}))
"""


def test_plan_runs_without_the_source_tree(tmp_path: Path, subprocess_env: dict) -> None:
    args = ["--model", "resnet50", "--workers", "64", "--link", "25G", "--cpu-machines", "0,4"]
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(ROOT), *args],
        cwd=tmp_path,
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report == {"code": 0, "touched": [], "sys_path_same": True, "modules": []}, report
    assert "model resnet50: 102.2 MB of gradients in 161 tensors" in out.stdout
    assert "recommended: k = " in out.stdout


def test_old_calibration_command_names_the_new_one(tmp_path: Path, subprocess_env: dict) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "fastps.sim.calibration", "--quick"],
        cwd=tmp_path,
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert "python -m benchmarks.sim_calibration" in out.stderr
