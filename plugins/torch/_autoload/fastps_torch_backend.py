"""Makes ``torch.distributed.init_process_group("fastps")`` work without ``import fastps``.

``import torch`` calls :func:`register` through the ``torch.backends`` entry point
(pyproject.toml), in every process where fastps is installed. An exception here would break
``import torch`` for everyone, so this module is installed outside the ``fastps`` package
(``fastps_torch_backend``), imports nothing of fastps, and only registers a creator: fastps
itself is loaded when a process group of this backend is created, and a broken installation
is reported there, naming what failed. ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` (torch's switch)
skips the hook; ``import fastps.torch`` registers the backend as well.
"""

from __future__ import annotations

import logging
from typing import Any

BACKEND = "fastps"


def _create(dist_options: Any, backend_options: Any) -> Any:
    try:
        from fastps.torch.process_group import create_process_group
    except Exception as exc:  # noqa: BLE001 - reported to the caller of init_process_group
        raise RuntimeError(
            f"the fastps torch.distributed backend could not load fastps: "
            f"{type(exc).__name__}: {exc} (reinstall fastps: pip install fastps)"
        ) from exc
    return create_process_group(dist_options, backend_options)


def register() -> None:
    """Registers the ``fastps`` backend with torch.distributed; never raises."""
    try:
        import torch.distributed as dist

        if not dist.is_available():
            return
        if BACKEND.upper() in getattr(dist.Backend, "_plugins", {}):
            return  # registered already (import fastps.torch, or a second call)
        # The same devices as fastps.torch.process_group.DEVICES (this module must not
        # import fastps; tests/torch/backend/test_backend_autoload.py checks they agree).
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu", "cuda"])
    except Exception as exc:  # noqa: BLE001 - import torch must keep working
        logging.getLogger("fastps").debug("fastps backend not registered: %s", exc)
