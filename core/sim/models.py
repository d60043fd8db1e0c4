"""Layer tables of ResNet-50, VGG-16 and BERT-base: the built-in models of the simulator
(``fastps.sim.workload``) and of the GPU-profile training emulator (benchmarks/emulator,
which builds on this module).

Each model is a list of :class:`Layer` in forward order: the layer's trainable tensors with
their real shapes and the layer's forward FLOPs per sample (2 x multiply-accumulates; batch
norm and layer norm ~ a few FLOPs per element). A layer's share of the model's FLOPs sets
its share of the per-iteration compute time; the backward pass is taken as twice the
forward pass (gradients with respect to inputs and to weights), the usual estimate.

Reference per-iteration times (docs/performance.md, "GPU-profile training emulator"):

* ResNet-50 v1.5 on one V100 16 GB in FP32 trains 367 images/s (NVIDIA
  DeepLearningExamples, PyTorch ResNet50 v1.5 README, "Training performance: NVIDIA DGX-1
  16GB (8x V100 16GB)", 1 GPU); with the batch NVIDIA suggests for FP32 on a V100 16 GB
  (128 images) that is 0.349 s per iteration.
* VGG-16 and BERT-base: no figure from the same source; their times are derived from their
  FLOPs at the FP32 rate that ResNet-50 sustains in that measurement
  (3 x forward FLOPs x 367 images/s), so all three share one GPU speed.

Standard library only: the installed package plans with these tables
(``python -m fastps.plan --model resnet50``), no source tree needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

Shape = Tuple[int, ...]

V100_RESNET50_IMAGES_S = 367.0  # FP32, 1x V100 16 GB, NVIDIA DeepLearningExamples (PyTorch)


@dataclass(frozen=True)
class Layer:
    name: str
    params: Tuple[Tuple[str, Shape], ...]  # (parameter name, shape)
    flops: float  # forward FLOPs per sample

    @property
    def numel(self) -> int:
        total = 0
        for _, shape in self.params:
            n = 1
            for d in shape:
                n *= d
            total += n
        return total


@dataclass(frozen=True)
class ModelSpec:
    name: str
    layers: Tuple[Layer, ...]
    batch: int  # samples per GPU per iteration at the reference point
    unit: str  # what a sample is

    @property
    def numel(self) -> int:
        return sum(layer.numel for layer in self.layers)

    @property
    def forward_flops(self) -> float:
        return sum(layer.flops for layer in self.layers)

    @property
    def tensors(self) -> int:
        return sum(len(layer.params) for layer in self.layers)


def _conv(name: str, cin: int, cout: int, k: int, out_hw: int, bias: bool) -> Layer:
    params: List[Tuple[str, Shape]] = [("weight", (cout, cin, k, k))]
    if bias:
        params.append(("bias", (cout,)))
    return Layer(name, tuple(params), 2.0 * cout * cin * k * k * out_hw * out_hw)


def _norm(name: str, channels: int, elements: float) -> Layer:
    # normalise, scale, shift, plus the statistics: ~8 FLOPs per element
    return Layer(name, (("weight", (channels,)), ("bias", (channels,))), 8.0 * elements)


def _linear(name: str, fin: int, fout: int, rows: float = 1.0) -> Layer:
    return Layer(name, (("weight", (fout, fin)), ("bias", (fout,))), 2.0 * fin * fout * rows)


def resnet50() -> ModelSpec:
    """torchvision's resnet50 (v1.5: the stride sits in the 3x3 convolution), 224x224."""
    layers = [_conv("conv1", 3, 64, 7, 112, False), _norm("bn1", 64, 64 * 112 * 112)]
    inplanes, hw = 64, 56  # after the max pool
    for stage, (planes, blocks, stride) in enumerate(
        ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)), 1
    ):
        for b in range(blocks):
            s = stride if b == 0 else 1
            out_hw = hw // s
            p = f"layer{stage}.{b}"
            layers += [
                _conv(f"{p}.conv1", inplanes, planes, 1, hw, False),
                _norm(f"{p}.bn1", planes, planes * hw * hw),
                _conv(f"{p}.conv2", planes, planes, 3, out_hw, False),
                _norm(f"{p}.bn2", planes, planes * out_hw * out_hw),
                _conv(f"{p}.conv3", planes, planes * 4, 1, out_hw, False),
                _norm(f"{p}.bn3", planes * 4, planes * 4 * out_hw * out_hw),
            ]
            if b == 0:
                layers += [
                    _conv(f"{p}.downsample.0", inplanes, planes * 4, 1, out_hw, False),
                    _norm(f"{p}.downsample.1", planes * 4, planes * 4 * out_hw * out_hw),
                ]
            inplanes, hw = planes * 4, out_hw
    layers.append(_linear("fc", 2048, 1000))
    return ModelSpec("resnet50", tuple(layers), 128, "images")


def vgg16() -> ModelSpec:
    """torchvision's vgg16 (configuration D, no batch norm), 224x224."""
    layers: List[Layer] = []
    cin, hw, idx = 3, 224, 0
    for item in (
        64,
        64,
        "M",
        128,
        128,
        "M",
        256,
        256,
        256,
        "M",
        512,
        512,
        512,
        "M",
        512,
        512,
        512,
        "M",
    ):
        if item == "M":
            hw //= 2
            idx += 1
            continue
        layers.append(_conv(f"features.{idx}", cin, int(item), 3, hw, True))
        cin = int(item)
        idx += 2  # convolution, ReLU
    dims = [512 * 7 * 7, 4096, 4096, 1000]
    for i in range(3):
        layers.append(_linear(f"classifier.{3 * i}", dims[i], dims[i + 1]))
    return ModelSpec("vgg16", tuple(layers), 64, "images")


BERT_SEQ = 128
BERT_VOCAB = 30522
BERT_HIDDEN = 768


def bert_base(seq: int = BERT_SEQ) -> ModelSpec:
    """BERT-base encoder (12 layers, hidden 768, 12 heads, FFN 3072, vocabulary 30522) with
    the pooler and a 2-way classification head; a sample is a sequence of ``seq`` tokens."""
    h, ffn, vocab = BERT_HIDDEN, 3072, BERT_VOCAB
    layers: List[Layer] = [
        Layer(
            "embeddings",
            (
                ("word_embeddings", (vocab, h)),
                ("position_embeddings", (512, h)),
                ("token_type_embeddings", (2, h)),
            ),
            2.0 * h * seq,
        ),
        _norm("embeddings.LayerNorm", h, h * seq),
    ]
    for i in range(12):
        p = f"encoder.layer.{i}"
        layers += [
            _linear(f"{p}.attention.self.query", h, h, seq),
            _linear(f"{p}.attention.self.key", h, h, seq),
            _linear(f"{p}.attention.self.value", h, h, seq),
        ]
        # scores (QK^T) and context (AV): 2 x 2 x seq x h per token, before the projection
        out = _linear(f"{p}.attention.output.dense", h, h, seq)
        layers += [
            Layer(out.name, out.params, out.flops + 4.0 * seq * seq * h),
            _norm(f"{p}.attention.output.LayerNorm", h, h * seq),
            _linear(f"{p}.intermediate.dense", h, ffn, seq),
            _linear(f"{p}.output.dense", ffn, h, seq),
            _norm(f"{p}.output.LayerNorm", h, h * seq),
        ]
    layers += [_linear("pooler.dense", h, h), _linear("classifier", h, 2)]
    return ModelSpec("bert", tuple(layers), 32, f"sequences of {seq} tokens")


MODELS = {"resnet50": resnet50, "vgg16": vgg16, "bert": bert_base}


def spec(name: str) -> ModelSpec:
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known: {sorted(MODELS)}")
    return MODELS[name]()


def sustained_flops_s() -> float:
    """The FP32 rate ResNet-50 sustains on a V100 in the reference measurement."""
    return 3.0 * resnet50().forward_flops * V100_RESNET50_IMAGES_S


def reference_iteration_s(model: ModelSpec) -> float:
    """Compute time of one training iteration (forward + backward) on one V100, FP32."""
    return 3.0 * model.forward_flops * model.batch / sustained_flops_s()


def layer_times(model: ModelSpec, iteration_s: float) -> List[Tuple[float, float]]:
    """(forward, backward) seconds of every layer when an iteration's compute takes
    ``iteration_s``: a third forward, two thirds backward, split by FLOPs."""
    total = model.forward_flops
    return [
        (iteration_s * layer.flops / total / 3.0, 2.0 * iteration_s * layer.flops / total / 3.0)
        for layer in model.layers
    ]
