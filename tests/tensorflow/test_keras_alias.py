"""``fastps.keras``, Horovod's ``horovod.keras`` name: the very ``fastps.tensorflow.keras``
module and submodules (no second copy of their state), whichever name is imported first:
in the layout this folder's conftest lays out from pyproject.toml, in a wheel built from the
checkout, in an editable install of it, and in a real job (workers/keras_alias_worker.py).

The wheel and the editable install are built without running CMake (``wheel.cmake=false``:
the Python files and the core already built in ``core/``), with the scikit-build-core of
this interpreter (skipped without one), and installed into this test's own folder."""

from __future__ import annotations

import importlib.machinery
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path, PurePosixPath
from typing import Dict, List

import pytest
from tfjobs import ROOT, job_env, tail
from wheel_layout import files

SAME_MODULES = """
import sys
{first}
import fastps
import fastps.keras as hvd
import fastps.keras.callbacks as callbacks
import fastps.tensorflow.keras as tf_keras
from fastps.keras.elastic import CommitStateCallback

assert hvd is tf_keras and fastps.keras is tf_keras, (hvd, tf_keras)
assert sys.modules["fastps.keras"] is sys.modules["fastps.tensorflow.keras"]
assert callbacks is tf_keras.callbacks is sys.modules["fastps.tensorflow.keras.callbacks"]
assert CommitStateCallback is tf_keras.elastic.CommitStateCallback
assert sys.modules["fastps.keras.elastic"] is tf_keras.elastic
for name in ("DistributedOptimizer", "PartialDistributedOptimizer", "init", "rank", "size",
             "allreduce", "broadcast_variables", "callbacks", "elastic", "FastPSError"):
    assert getattr(hvd, name) is getattr(tf_keras, name), name
assert hvd.DistributedOptimizer is fastps.tensorflow.keras.DistributedOptimizer
assert callable(hvd.callbacks.BroadcastGlobalVariablesCallback)
print("same modules from", fastps.__file__)
"""

# The Python files only: the C++ core is taken as built in core/.
NO_CMAKE = ["--no-build-isolation", "--no-deps", "-C", "wheel.cmake=false"]


def _core_built() -> bool:
    core = ROOT / "core"
    return any((core / f"_core{s}").exists() for s in importlib.machinery.EXTENSION_SUFFIXES)


def _pip(args: List[str], cwd: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args]
    p = subprocess.run(cmd, cwd=str(cwd), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, tail(p)


def _same_modules(code: str, env: Dict[str, str], cwd: Path) -> str:
    p = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=str(cwd),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert p.returncode == 0 and "same modules" in p.stdout, tail(p)
    return p.stdout


@pytest.mark.parametrize(
    "first", ["", "import fastps.tensorflow.keras", "import fastps.tensorflow"]
)
def test_fastps_keras_is_fastps_tensorflow_keras(first: str) -> None:
    _same_modules(SAME_MODULES.format(first=first), job_env(), ROOT)


def test_the_wheel_installs_the_alias_at_the_top_only() -> None:
    layout = files()
    assert (
        layout[PurePosixPath("fastps/keras.py")]
        == ROOT / "plugins" / "tensorflow" / "_alias" / "keras.py"
    )
    assert not [str(k) for k in layout if "_alias" in str(k)]


def _without_checkout_paths() -> Dict[str, str]:
    """The workers' environment less the conftests' PYTHONPATH (the checkout's layouts)."""
    env = job_env()
    env.pop("PYTHONPATH", None)
    return env


def test_a_built_wheel_installs_fastps_keras(tmp_path: Path) -> None:
    pytest.importorskip("scikit_build_core")
    if not _core_built():
        pytest.skip("no C++ core built in core/ for this interpreter")
    _pip(["wheel", str(ROOT), *NO_CMAKE, "-w", str(tmp_path / "dist")], tmp_path)
    (wheel,) = (tmp_path / "dist").glob("fastps-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "fastps/keras.py" in names and "fastps/tensorflow/keras/__init__.py" in names
    assert not [n for n in names if "_alias" in n], names
    _pip(["install", "--no-deps", "--target", str(tmp_path / "site"), str(wheel)], tmp_path)
    env = _without_checkout_paths()
    env["PYTHONPATH"] = str(tmp_path / "site")
    out = _same_modules(SAME_MODULES.format(first=""), env, tmp_path)
    assert str(tmp_path / "site" / "fastps" / "__init__.py") in out, out


def test_an_editable_install_serves_fastps_keras(tmp_path: Path) -> None:
    pytest.importorskip("scikit_build_core")
    if not _core_built():
        pytest.skip("no C++ core built in core/ for this interpreter")
    prefix = tmp_path / "prefix"
    _pip(["install", *NO_CMAKE, "--prefix", str(prefix), "-e", str(ROOT)], tmp_path)
    site = sysconfig.get_path("purelib", vars={"base": str(prefix), "platbase": str(prefix)})
    assert any(Path(site).glob("*.pth")), os.listdir(site)
    # First on the path, so that its .pth's import finds its own finder module and not one
    # of the same name that another editable install of fastps may have left further on.
    start = f"import site, sys\nsys.path.insert(0, {site!r})\nsite.addsitedir({site!r})\n"
    out = _same_modules(start + SAME_MODULES.format(first=""), _without_checkout_paths(), tmp_path)
    assert str(ROOT / "core" / "__init__.py") in out, out


@pytest.mark.shared_check("keras3", "alias")
def test_fastps_keras_trains_a_model_in_a_job(shared_check) -> None:
    p = shared_check  # workers/keras_alias_worker.py, in a shared job (tfjobs.py)
    assert p.returncode == 0, tail(p)
    for r in range(2):
        assert f"rank {r} OK" in p.stdout, tail(p)
