"""How the ``fastps`` backend gets registered: ``import torch`` (the ``torch.backends`` entry
point, hook module ``fastps_torch_backend``) without loading fastps; a broken fastps never
breaks ``import torch`` and is reported by ``init_process_group``; ``import fastps.torch``
registers it when torch's autoload is off."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict

from torchrun import free_port


def _python(code: str, env: Dict[str, str], timeout: float = 120.0) -> dict:
    """Runs ``code`` in a fresh interpreter; its last stdout line is JSON, returned."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _env(**extra: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    env.update(extra)
    return env


REPORT = """
    import json, sys
    import torch.distributed as dist
    print(json.dumps({
        "registered": "fastps" in dist.Backend.backend_list,
        "plugin": "FASTPS" in getattr(dist.Backend, "_plugins", {}),
        "devices": dist.Backend.backend_capability.get("fastps"),
        "fastps_loaded": sorted(m for m in sys.modules if m == "fastps" or m.startswith("fastps.")),
        "core_loaded": "fastps._core" in sys.modules,
    }))
"""


def test_import_torch_registers_without_loading_fastps() -> None:
    """``import torch`` alone registers the backend, and neither ``fastps`` nor its C++
    core (``fastps._core``) is imported by it."""
    got = _python("import torch\n" + textwrap.dedent(REPORT), env=_env())
    assert got["registered"] and got["plugin"], got
    assert got["fastps_loaded"] == [], got
    # the hook names the devices the backend itself registers (CUDA staged through host)
    from fastps.torch.process_group import DEVICES

    assert got["devices"] == list(DEVICES) == ["cpu", "cuda"], got
    assert not got["core_loaded"], got


def test_broken_fastps_keeps_import_torch_working(tmp_path: Path) -> None:
    """A broken fastps package first on the path: ``import torch`` still works (the backend
    is registered), and ``init_process_group("fastps")`` raises a RuntimeError that names
    the failure and the backend."""
    broken = tmp_path / "fastps"
    broken.mkdir()
    (broken / "__init__.py").write_text(
        'raise ImportError("deliberately broken fastps for a test")\n'
    )
    spec = importlib.util.find_spec("fastps_torch_backend")
    assert spec is not None and spec.origin, "the hook module fastps_torch_backend is not installed"
    shutil.copy(spec.origin, tmp_path / "fastps_torch_backend.py")
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p)
    code = f"""
        import json
        import sys
        # An editable install finds fastps through a meta-path finder ahead of PYTHONPATH:
        # without it, the broken copy is what this process finds (as with a wheel install).
        sys.meta_path[:] = [f for f in sys.meta_path if "fastps" not in type(f).__module__]
        import torch
        import torch.distributed as dist
        import fastps_torch_backend
        out = {{"hook": fastps_torch_backend.__file__}}
        out["registered"] = "fastps" in dist.Backend.backend_list
        try:
            dist.init_process_group(
                "fastps", init_method="tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
            )
        except Exception as exc:
            out["error"] = type(exc).__name__
            out["runtime_error"] = isinstance(exc, RuntimeError)
            out["message"] = str(exc)
        else:
            out["error"] = None
        print(json.dumps(out))
    """
    got = _python(code, env=_env(PYTHONPATH=path))
    assert Path(got["hook"]).parent == tmp_path, got  # the copy, next to the broken package
    assert got["registered"], got
    assert got["error"] is not None, f"init_process_group worked with a broken fastps: {got}"
    assert got["runtime_error"], got
    msg = got["message"]
    assert "fastps" in msg and "deliberately broken fastps for a test" in msg, msg
    assert "ImportError" in msg, msg


def test_autoload_off_then_import_fastps_torch_registers() -> None:
    """With ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` ``import torch`` registers nothing (torch's
    switch is honoured) and ``import fastps.torch`` registers the backend."""
    code = "import torch\n" + textwrap.dedent(REPORT).replace("print(", "before = (", 1)
    code += textwrap.dedent(
        """
        import fastps.torch
        after = "fastps" in dist.Backend.backend_list
        devices = dist.Backend.backend_capability.get("fastps")
        print(json.dumps({"before": json.loads(before)["registered"], "after": after,
                          "devices": devices}))
        """
    )
    got = _python(code, env=_env(TORCH_DEVICE_BACKEND_AUTOLOAD="0"))
    assert got == {"before": False, "after": True, "devices": ["cpu", "cuda"]}, got
