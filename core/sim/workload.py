"""What a worker computes and sends per iteration: layers in forward order, each with its
forward and backward seconds and its gradient tensors (name, bytes).

The built-in models are the tables of ``fastps.sim.models`` (real parameter shapes,
per-layer FLOPs, a V100's published ResNet-50 rate), which the GPU-profile emulator
(benchmarks/emulator) trains too, so the simulator and the emulated rack train the same
layers. A JSON file describes any other model::

    {"name": "mine", "iteration_s": 0.25,            # forward + backward on one GPU
     "layers": [{"name": "embed", "flops": 1e9,       # share of the time by FLOPs ...
                 "tensors": {"weight": 93763584}},    # ... bytes per gradient tensor
                {"name": "head", "forward_s": 0.01, "backward_s": 0.02,   # or explicit
                 "tensors": {"weight": 4096, "bias": 8}}]}
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..errors import FastPSError
from . import models

# The torch plugin names a gradient "grad." + the parameter's name; the emulator's model
# registers layer "a.b" as module "layers.a_b" (benchmarks/emulator/sleeper.py).
GRAD_PREFIX = "grad."


@dataclass(frozen=True)
class Layer:
    name: str
    forward_s: float
    backward_s: float
    tensors: Tuple[Tuple[str, int], ...]  # (gradient name, bytes), in registration order

    @property
    def nbytes(self) -> int:
        return sum(b for _, b in self.tensors)


@dataclass(frozen=True)
class Workload:
    name: str
    layers: Tuple[Layer, ...]
    elem_size: int = 4

    @property
    def nbytes(self) -> int:
        return sum(layer.nbytes for layer in self.layers)

    @property
    def compute_s(self) -> float:
        return sum(layer.forward_s + layer.backward_s for layer in self.layers)

    @property
    def tensors(self) -> int:
        return sum(len(layer.tensors) for layer in self.layers)

    def with_compute(self, iteration_s: float) -> Workload:
        """The same layers with forward + backward rescaled to ``iteration_s``."""
        if iteration_s < 0:
            raise FastPSError(f"compute time must be >= 0 s, got {iteration_s}")
        total = self.compute_s
        f = iteration_s / total if total > 0 else 0.0
        return Workload(
            self.name,
            tuple(
                Layer(la.name, la.forward_s * f, la.backward_s * f, la.tensors)
                for la in self.layers
            ),
            self.elem_size,
        )


BUILTIN = ("resnet50", "vgg16", "bert-base")


def builtin(name: str, iteration_s: Optional[float] = None) -> Workload:
    """One of the built-in models; ``iteration_s`` defaults to its V100 time (FP32)."""
    key = {"bert-base": "bert", "bert": "bert", "resnet50": "resnet50", "vgg16": "vgg16"}.get(name)
    if key is None:
        raise FastPSError(f"unknown model {name!r}: choose one of {', '.join(BUILTIN)} or a FILE")
    spec = models.spec(key)
    seconds = models.reference_iteration_s(spec) if iteration_s is None else iteration_s
    times = models.layer_times(spec, seconds)
    layers = []
    for layer, (fwd, bwd) in zip(spec.layers, times):
        module = "layers." + layer.name.replace(".", "_")
        tensors = []
        for pname, shape in layer.params:
            numel = 1
            for d in shape:
                numel *= d
            tensors.append((f"{GRAD_PREFIX}{module}.{pname}", 4 * numel))
        layers.append(Layer(layer.name, fwd, bwd, tuple(tensors)))
    return Workload(name, tuple(layers))


def from_file(path: str, iteration_s: Optional[float] = None) -> Workload:
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise FastPSError(f"model file {path!r}: {e}") from None
    where = f"model file {path!r}"
    layers_doc = doc.get("layers")
    if not isinstance(layers_doc, list) or not layers_doc:
        raise FastPSError(f"{where}: 'layers' must be a non-empty list")
    total_flops = sum(float(la.get("flops", 0.0)) for la in layers_doc)
    it_s = iteration_s if iteration_s is not None else doc.get("iteration_s")
    layers: List[Layer] = []
    for i, la in enumerate(layers_doc):
        lname = str(la.get("name", f"layer{i}"))
        tens: Dict[str, Any] = la.get("tensors", {})
        if not isinstance(tens, dict):
            raise FastPSError(f"{where}: layer {lname!r}: 'tensors' must map names to bytes")
        for t, b in tens.items():
            if not isinstance(b, int) or b < 0:
                raise FastPSError(f"{where}: layer {lname!r} tensor {t!r}: bytes must be >= 0")
        if "forward_s" in la:
            fwd, bwd = float(la["forward_s"]), float(la.get("backward_s", 2 * la["forward_s"]))
        elif it_s is not None and total_flops > 0:
            share = float(la.get("flops", 0.0)) / total_flops
            fwd, bwd = it_s * share / 3.0, 2.0 * it_s * share / 3.0
        else:
            raise FastPSError(
                f"{where}: layer {lname!r} has no forward_s, and the file gives no "
                "iteration_s with per-layer flops"
            )
        if fwd < 0 or bwd < 0:
            raise FastPSError(f"{where}: layer {lname!r}: times must be >= 0")
        layers.append(
            Layer(lname, fwd, bwd, tuple((f"{GRAD_PREFIX}{lname}.{t}", b) for t, b in tens.items()))
        )
    w = Workload(str(doc.get("name", Path(path).stem)), tuple(layers))
    if iteration_s is not None and any("forward_s" in la for la in layers_doc):
        w = w.with_compute(iteration_s)
    return w


def load(model: str, iteration_s: Optional[float] = None) -> Workload:
    """A built-in model by name or a JSON file by path."""
    if model in BUILTIN or model == "bert":
        return builtin(model, iteration_s)
    if Path(model).exists():
        return from_file(model, iteration_s)
    raise FastPSError(
        f"unknown model {model!r}: choose one of {', '.join(BUILTIN)} or a JSON file path"
    )
