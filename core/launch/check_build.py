"""``fastpsrun --check-build`` and ``python -m fastps --check-build``: what this installation
of fastps can do, for a bug report or a first sanity check.

It names the core's build (compiler, build type, sanitizers, the SIMD variants of the sum
kernels, shared memory, the compression codecs, the timeline), each framework with its
version and whether fastps's plugin for it loads (and, for PyTorch, whether the ``fastps``
torch.distributed backend is registered), whether a GPU is visible for the GPU staging path,
the libraries and cluster engines fastps plugs into, and the launch tools on ``PATH``.

Each framework is imported in a process of its own, all at once and each bounded by
``PROBE_TIMEOUT``: importing TensorFlow and PyTorch into one process is slow and, with some
builds, unsafe, and a broken framework must not take the report down with it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

__all__ = ["FrameworkReport", "collect", "render", "main", "PROBE_TIMEOUT"]

PROBE_TIMEOUT = 120.0  # seconds one framework may take to import (TensorFlow: ~10 s)

# (name shown, module, fastps plugin)
FRAMEWORKS: Tuple[Tuple[str, str, str], ...] = (
    ("PyTorch", "torch", "fastps.torch"),
    ("TensorFlow", "tensorflow", "fastps.tensorflow"),
    ("MXNet", "mxnet", "fastps.mxnet"),
)
# (name shown, distribution on PyPI, module): read from the installed metadata, not imported.
INTEGRATIONS: Tuple[Tuple[str, str, str], ...] = (
    ("Lightning", "lightning", "lightning"),
    ("Hugging Face Transformers", "transformers", "transformers"),
    ("Hugging Face Accelerate", "accelerate", "accelerate"),
    ("Ray", "ray", "ray"),
    ("PySpark", "pyspark", "pyspark"),
)
LAUNCH_TOOLS = ("ssh", "srun", "mpirun")

# Runs in the probe process: imports the framework and the plugin, prints one JSON line.
_PROBE = r"""
import json, sys
framework, plugin = sys.argv[1], sys.argv[2]
out = {"version": None, "plugin": None, "plugin_error": None, "gpus": None, "extra": {}}
try:
    mod = __import__(framework)
    out["version"] = getattr(mod, "__version__", "unknown")
except BaseException as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(out)); sys.exit(0)
try:
    __import__(plugin)
    out["plugin"] = True
except BaseException as exc:
    out["plugin"] = False
    out["plugin_error"] = f"{type(exc).__name__}: {exc}"
try:
    if framework == "torch":
        out["gpus"] = mod.cuda.device_count() if mod.cuda.is_available() else 0
        import torch.distributed as dist
        if dist.is_available():
            out["extra"]["backend"] = "fastps" in dist.Backend.backend_list
    elif framework == "tensorflow":
        out["gpus"] = len(mod.config.list_physical_devices("GPU"))
    elif framework == "mxnet":
        out["gpus"] = mod.context.num_gpus()
except BaseException as exc:
    out["extra"]["gpu_error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


@dataclass
class FrameworkReport:
    name: str
    module: str
    plugin_module: str
    installed: bool
    version: Optional[str] = None
    plugin_ok: Optional[bool] = None
    problem: Optional[str] = None  # why the framework or its plugin did not load
    gpus: Optional[int] = None
    backend_registered: Optional[bool] = None  # PyTorch: the "fastps" c10d backend
    extra: Dict[str, Any] = field(default_factory=dict)


def _start_probe(module: str, plugin: str) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TensorFlow's start-up banner out
    env.pop("FASTPS_SCHEDULER_ADDR", None)  # a probe never joins a job
    return subprocess.Popen(
        [sys.executable, "-c", _PROBE, module, plugin],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _finish_probe(report: FrameworkReport, proc: subprocess.Popen[str], timeout: float) -> None:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        report.problem = f"importing {report.module} took over {timeout:g} s"
        return
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if not lines:
        tail = (err.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        report.problem = f"the import probe failed: {tail}"
        return
    data = json.loads(lines[-1])
    report.version = data.get("version")
    if data.get("error"):
        report.problem = data["error"]
        return
    report.plugin_ok = bool(data.get("plugin"))
    report.problem = data.get("plugin_error")
    report.gpus = data.get("gpus")
    report.backend_registered = data.get("extra", {}).get("backend")


def probe_frameworks(timeout: float = PROBE_TIMEOUT) -> List[FrameworkReport]:
    reports: List[FrameworkReport] = []
    running: List[Tuple[FrameworkReport, subprocess.Popen[str]]] = []
    for name, module, plugin in FRAMEWORKS:
        installed = importlib.util.find_spec(module) is not None
        report = FrameworkReport(name, module, plugin, installed)
        reports.append(report)
        if installed:
            running.append((report, _start_probe(module, plugin)))
    for report, proc in running:
        _finish_probe(report, proc, timeout)
    return reports


def _distribution_version(dist: str) -> Optional[str]:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def collect(timeout: float = PROBE_TIMEOUT) -> Dict[str, Any]:
    """Everything the report shows, as plain data."""
    import fastps

    core: Dict[str, Any]
    try:
        from fastps import _core

        core = {"path": _core.__file__, **_core.build_info()}
    except Exception as exc:  # a broken core is what the user needs to see first
        core = {"error": f"{type(exc).__name__}: {exc}"}
    return {
        "fastps": {"version": fastps.__version__, "path": os.path.dirname(fastps.__file__)},
        "python": sys.version.split()[0],
        "core": core,
        "frameworks": probe_frameworks(timeout),
        "integrations": [
            (name, _distribution_version(dist)) for name, dist, _module in INTEGRATIONS
        ],
        "launch_tools": [(tool, shutil.which(tool)) for tool in LAUNCH_TOOLS],
    }


def _box(ok: Optional[bool]) -> str:
    return "[X]" if ok else "[ ]"


def render(info: Dict[str, Any]) -> str:
    fastps = info["fastps"]
    lines = [f"fastps {fastps['version']} ({fastps['path']}), Python {info['python']}"]
    core = info["core"]
    lines += ["", "Core (fastps._core):"]
    if "error" in core:
        lines.append(f"    [ ] does not load: {core['error']}")
    else:
        sanitizers = ", ".join(core["sanitizers"]) or "none"
        lines += [
            f"    {core['compiler']}, C++ {core['cxx_standard']}, {core['build_type']} build, "
            f"sanitizers: {sanitizers}",
            f"    {core['path']}",
            f"    [X] SIMD sum kernels: {core['simd_active']} in use; built: "
            f"{' '.join(core['simd_built'])}; this CPU runs: {' '.join(core['simd_supported'])}",
            f"    {_box(core['shared_memory'])} shared memory between the processes of a host",
            f"    {_box(core['timeline'])} timeline recorder",
            f"    [X] compression codecs: {' '.join(core['codecs'])}",
        ]
    lines += ["", "Frameworks (version, fastps plugin):"]
    gpu_lines = []
    for fw in info["frameworks"]:
        if not fw.installed:
            lines.append(f"    [ ] {fw.name}: not installed")
            continue
        if fw.plugin_ok:
            text = f"    [X] {fw.name} {fw.version}: {fw.plugin_module} loads"
            if fw.backend_registered is not None:
                state = "registered" if fw.backend_registered else "NOT registered"
                text += f"; torch.distributed backend 'fastps' {state}"
            lines.append(text)
        else:
            version = f" {fw.version}" if fw.version else ""
            lines.append(f"    [ ] {fw.name}{version}: {fw.problem}")
        if fw.gpus is not None:
            gpu_lines.append(f"    {_box(fw.gpus > 0)} {fw.name}: {fw.gpus} GPU(s) visible")
    lines += ["", "GPU staging (device tensors staged through pinned host memory):"]
    lines += gpu_lines or ["    [ ] no framework that can see a GPU is installed"]
    lines += ["", "Libraries and cluster engines fastps plugs into:"]
    for name, version in info["integrations"]:
        lines.append(f"    {_box(version is not None)} {name}{' ' + version if version else ''}")
    lines += ["", "Launch tools on PATH:"]
    for tool, path in info["launch_tools"]:
        lines.append(f"    {_box(path is not None)} {tool}{': ' + path if path else ''}")
    return "\n".join(lines)


def main() -> int:
    """Prints the report; 0 whatever it finds (the report is the answer)."""
    print(render(collect()), flush=True)
    return 0
