"""The settings every plugin's ``LocalSGD``/``DiLoCo`` must refuse, naming the culprit:
shared by the torch, TensorFlow and MXNet tests, since the three plugins check them with
the same framework-free code (fastps.worker.algorithm_args) and must say the same."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest


def assert_local_sgd_refusals(local_sgd: Any, diloco: Any) -> None:
    for bad in (-1, 0, 2.5, True):
        with pytest.raises(ValueError, match=rf"LocalSGD: H .* got {re.escape(repr(bad))}"):
            local_sgd(H=bad)
    with pytest.raises(ValueError, match=r"DiLoCo: outer momentum 1 is not in \[0, 1\)"):
        diloco(H=4, momentum=1.0)
    with pytest.raises(ValueError, match=r"DiLoCo: outer momentum 1.5"):
        diloco(H=4, momentum=1.5)
    with pytest.raises(ValueError, match="DiLoCo: outer learning rate nan"):
        diloco(H=4, outer_lr=math.nan)
    with pytest.raises(ValueError, match="LocalSGD: outer learning rate 0 "):
        local_sgd(H=4, outer_lr=0.0)
    with pytest.raises(TypeError, match="DiLoCo: nesterov must be True or False, got 1"):
        diloco(H=4, nesterov=1)


def assert_overlap_refusals(local_sgd: Any, diloco: Any) -> None:
    """The overlapped rounds' settings (torch and MXNet)."""
    with pytest.raises(TypeError, match="LocalSGD: overlap must be True or False, got 1"):
        local_sgd(H=4, overlap=1)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match=rf"DiLoCo: overlap_warmup .* got {bad!r}"):
            diloco(H=4, overlap=True, overlap_warmup=bad)
    shown = repr(local_sgd(H=4, overlap=True, overlap_warmup=3))
    assert shown.endswith("overlap=True, overlap_warmup=3)"), shown
