"""Layer tables of ResNet-50, VGG-16 and BERT-base for the training emulator.

The tables, their FLOPs and the reference per-iteration times on one V100 are the package's
(``fastps.sim.models``: the simulator and ``python -m fastps.plan`` use them, installed,
without this source tree); they are re-exported here under their old names. This module
adds what only the emulator needs: BERT's token sampling for the sparse embedding gradient,
the optimizer's update time on a V100, and shrunken models.

The emulator multiplies these times by the ratio of the reference cluster's link (10 Gbit/s)
to the emulated one (1 Gbit/s), i.e. x10, so that compute and communication keep the
proportions of a V100 cluster on 10 Gbit/s.
"""

from __future__ import annotations

from typing import Dict

import numpy as np
from fastps.sim.models import (
    BERT_HIDDEN,
    BERT_SEQ,
    BERT_VOCAB,
    MODELS,
    V100_RESNET50_IMAGES_S,
    Layer,
    ModelSpec,
    Shape,
    bert_base,
    layer_times,
    reference_iteration_s,
    resnet50,
    spec,
    sustained_flops_s,
    vgg16,
)

__all__ = [
    "BERT_CLS",
    "BERT_HIDDEN",
    "BERT_SEP",
    "BERT_SEQ",
    "BERT_VOCAB",
    "MODELS",
    "REFERENCE_LINK_MBIT",
    "SPARSE_PARAM",
    "V100_MEMORY_BYTES_S",
    "V100_RESNET50_IMAGES_S",
    "ZIPF_EXPONENT",
    "Layer",
    "ModelSpec",
    "Shape",
    "bert_base",
    "expected_rows",
    "has_table",
    "layer_times",
    "reference_iteration_s",
    "resnet50",
    "sample_rows",
    "scaled",
    "sparse_bytes",
    "spec",
    "summary",
    "sustained_flops_s",
    "update_time",
    "vgg16",
]

# HBM2 bandwidth of a V100 SXM2 (NVIDIA Tesla V100 datasheet): what an optimizer's update,
# a few streams over every parameter, runs at on the GPU.
V100_MEMORY_BYTES_S = 900e9
REFERENCE_LINK_MBIT = 10_000.0  # the reference cluster's link the times belong to

BERT_CLS, BERT_SEP = 101, 102  # in every sequence (bert-base-uncased's vocabulary)
# Token frequencies: Zipf's law with exponent 1 over the vocabulary ranked by frequency (word
# frequencies in natural text, Zipf 1949; Piantadosi 2014, "Zipf's word frequency law in
# natural language", Psychon. Bull. Rev. 21: exponent ~1). WordPiece splits rare words into
# frequent pieces, which concentrates the tokens further, so this rather overestimates the
# rows a batch touches.
ZIPF_EXPONENT = 1.0
SPARSE_PARAM = "word_embeddings"  # the tensor whose gradient may be sparse


def _zipf(vocab: int, exponent: float) -> np.ndarray:
    p = 1.0 / np.arange(1, vocab + 1, dtype=np.float64) ** exponent
    return p / p.sum()


def expected_rows(
    batch: int = 32, seq: int = BERT_SEQ, vocab: int = BERT_VOCAB, exponent: float = ZIPF_EXPONENT
) -> float:
    """Expected number of distinct embedding rows one worker's batch touches: [CLS] and
    [SEP] plus the distinct tokens among batch x (seq - 2) Zipf draws."""
    p = _zipf(vocab, exponent)
    return 2.0 + float((1.0 - (1.0 - p) ** (batch * (seq - 2))).sum())


def sample_rows(
    seed: int,
    batch: int = 32,
    seq: int = BERT_SEQ,
    vocab: int = BERT_VOCAB,
    exponent: float = ZIPF_EXPONENT,
) -> np.ndarray:
    """The sorted distinct rows of one batch of Zipf-distributed tokens (frequency ranks
    mapped to token ids by a fixed permutation), with [CLS] and [SEP]."""
    ids = np.random.default_rng(12345).permutation(vocab)
    ranks = np.random.default_rng(seed).choice(
        vocab, size=batch * (seq - 2), p=_zipf(vocab, exponent)
    )
    return np.unique(np.concatenate([ids[ranks], [BERT_CLS, BERT_SEP]]))


def has_table(model: ModelSpec) -> bool:
    """Whether ``model`` has the word embedding a sparse gradient applies to."""
    return any(pname == SPARSE_PARAM for layer in model.layers for pname, _ in layer.params)


def sparse_bytes(rows: float, width: int = BERT_HIDDEN) -> float:
    """Bytes of a sparse gradient of ``rows`` float32 rows with int64 indices."""
    return rows * (4.0 * width + 8.0)


def scaled(model: ModelSpec, scale: float) -> ModelSpec:
    """The same layers and tensor count with every tensor shrunk to ``scale`` of its
    elements (1-D, at least one): the Python-side cost of a model without its bytes."""
    if not 0 < scale <= 1:
        raise ValueError(f"scale must be in (0, 1], got {scale}")
    layers = []
    for layer in model.layers:
        params = []
        for pname, shape in layer.params:
            n = 1
            for d in shape:
                n *= d
            params.append((pname, (max(1, int(round(n * scale))),)))
        layers.append(Layer(layer.name, tuple(params), layer.flops))
    return ModelSpec(model.name, tuple(layers), model.batch, model.unit)


def update_time(numel: float, iteration_s: float, model: ModelSpec) -> float:
    """Seconds a V100 takes for plain SGD's update of ``numel`` float32 parameters (read the
    parameter and its gradient, write the parameter), on the same scale as the layers when an
    iteration's compute takes ``iteration_s``."""
    return 3 * 4 * numel / V100_MEMORY_BYTES_S * iteration_s / reference_iteration_s(model)


def summary() -> Dict[str, Dict[str, float]]:
    out: Dict[str, Dict[str, float]] = {}
    for name in MODELS:
        m = spec(name)
        out[name] = {
            "params_m": m.numel / 1e6,
            "tensors": m.tensors,
            "gflops_fwd": m.forward_flops / 1e9,
            "batch": m.batch,
            "v100_s": reference_iteration_s(m),
        }
    return out


if __name__ == "__main__":
    for key, row in summary().items():
        print(key, {k: round(v, 4) for k, v in row.items()})
