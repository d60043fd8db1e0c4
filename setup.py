"""Builds the C++ core (fastps._core) with CMake and maps the source folders to packages.

The tree keeps the architecture visible (core/, plugins/<framework>/), so the
installed package names are mapped from those folders here.
"""

import os
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        out_dir = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        build_type = os.environ.get("FASTPS_BUILD_TYPE", "Release")
        build_dir = Path(self.build_temp).resolve() / build_type
        build_dir.mkdir(parents=True, exist_ok=True)
        cfg = [
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out_dir}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-DCMAKE_BUILD_TYPE={build_type}",
            "-GNinja",
        ]
        if os.environ.get("FASTPS_SANITIZE"):
            cfg.append("-DFASTPS_SANITIZE=ON")
        subprocess.check_call(["cmake", str(ROOT), *cfg], cwd=build_dir)
        jobs = str(os.cpu_count() or 2)
        subprocess.check_call(["cmake", "--build", ".", "-j", jobs], cwd=build_dir)


setup(
    packages=[
        "fastps",
        "fastps.torch",
        "fastps.tensorflow",
        "fastps.tensorflow.keras",
        "fastps.mxnet",
    ],
    package_dir={
        "fastps": "core",
        "fastps.torch": "plugins/torch",
        "fastps.tensorflow": "plugins/tensorflow",
        "fastps.tensorflow.keras": "plugins/tensorflow/keras",
        "fastps.mxnet": "plugins/mxnet",
    },
    ext_modules=[CMakeExtension("fastps._core")],
    cmdclass={"build_ext": CMakeBuild},
    zip_safe=False,
)
