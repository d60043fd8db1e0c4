"""The training tasks of ``benchmarks/bench_compression_accuracy.py``: data, model and
optimizer settings, nothing distributed.

- ``digits``: examples/torch/train_digits.py exactly (its split, its MLP, Adam at 1e-3 per
  worker, batch 16 per worker), so its final accuracies are the example's.
- ``cifar``: a CIFAR-shaped synthetic task (32x32x3 images, 10 classes) generated
  deterministically here, no download. Each class is a template of three coloured
  sinusoidal gratings (random orientation, frequency and phase); an image is its class's
  template, shifted by up to 8 pixels (wrapping), scaled in contrast and colour, with a
  shifted template of another class mixed in and Gaussian noise on top. A small CNN (two
  3x3 convolutions with pooling, then two dense layers, 137k parameters) needs a few
  epochs to reach its plateau (about 0.85 test accuracy), and the noise keeps it off
  100%, so the compressors' final accuracies can differ.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Tuple

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DIGITS_EXAMPLE = REPO / "examples" / "torch" / "train_digits.py"
TASKS = ("digits", "cifar")

# The synthetic data: fixed, whatever the training seed (the seed varies the model's
# initialisation and the batch order only).
CIFAR_DATA_SEED = 0
CIFAR_SIDE = 32
CIFAR_CLASSES = 10
CIFAR_SHIFT = 8  # pixels, each direction
CIFAR_NOISE = 2.5  # standard deviation, against templates of unit standard deviation
CIFAR_DISTRACTOR = 0.8  # weight of the other class's template (times U(0.5, 1))


@dataclass
class Task:
    """Data (torch tensors) and the training recipe of one task."""

    name: str
    x_train: Any
    y_train: Any
    x_test: Any
    y_test: Any
    build_model: Callable[[], Any]
    lr: float  # per worker; synchronous training scales it by the number of workers
    batch_size: int  # per worker
    epochs: int  # the benchmark's default


def _digits_module() -> Any:
    spec = importlib.util.spec_from_file_location("train_digits", DIGITS_EXAMPLE)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {DIGITS_EXAMPLE}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def digits_task() -> Task:
    example = _digits_module()
    x_train, y_train, x_test, y_test = example.load_data()
    return Task(
        "digits",
        x_train,
        y_train,
        x_test,
        y_test,
        lambda: example.build_model("mlp"),
        lr=1e-3,
        batch_size=16,
        epochs=30,
    )


def cifar_templates(rng: np.random.Generator) -> np.ndarray:
    """One (3, 32, 32) template per class, each of unit standard deviation."""
    yy, xx = np.mgrid[0:CIFAR_SIDE, 0:CIFAR_SIDE] / float(CIFAR_SIDE)
    out = np.zeros((CIFAR_CLASSES, 3, CIFAR_SIDE, CIFAR_SIDE), dtype=np.float64)
    for c in range(CIFAR_CLASSES):
        for _ in range(3):
            theta = rng.uniform(0.0, np.pi)
            freq = rng.integers(1, 5)  # whole periods: the wrap-around shift stays seamless
            phase = rng.uniform(0.0, 2.0 * np.pi)
            colour = rng.normal(size=3)
            wave = np.sin(2.0 * np.pi * freq * (xx * np.cos(theta) + yy * np.sin(theta)) + phase)
            out[c] += colour[:, None, None] * wave
        out[c] /= out[c].std()
    return out.astype(np.float32)


def cifar_images(
    n: int, rng: np.random.Generator, templates: np.ndarray
) -> Tuple[np.ndarray, np.ndarray]:
    """n images (float32, (n, 3, 32, 32)) and their labels (int64)."""
    labels = rng.integers(0, CIFAR_CLASSES, n)
    others = (labels + rng.integers(1, CIFAR_CLASSES, n)) % CIFAR_CLASSES
    images = np.empty((n, 3, CIFAR_SIDE, CIFAR_SIDE), dtype=np.float32)
    for i in range(n):
        dy, dx = rng.integers(-CIFAR_SHIFT, CIFAR_SHIFT + 1, 2)
        img = rng.uniform(0.6, 1.4) * np.roll(templates[labels[i]], (dy, dx), (1, 2))
        oy, ox = rng.integers(-CIFAR_SHIFT, CIFAR_SHIFT + 1, 2)
        distractor = np.roll(templates[others[i]], (oy, ox), (1, 2))
        img = img + CIFAR_DISTRACTOR * rng.uniform(0.5, 1.0) * distractor
        img = img * (1.0 + 0.3 * rng.normal(size=(3, 1, 1)))  # colour jitter per channel
        images[i] = img + CIFAR_NOISE * rng.normal(size=img.shape)
    return images, labels.astype(np.int64)


def cifar_model() -> Any:
    import torch

    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(32 * 8 * 8, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, CIFAR_CLASSES),
    )


def cifar_task(n_train: int = 6000, n_test: int = 1000) -> Task:
    import torch

    rng = np.random.default_rng(CIFAR_DATA_SEED)
    templates = cifar_templates(rng)
    x_train, y_train = cifar_images(n_train, rng, templates)
    x_test, y_test = cifar_images(n_test, rng, templates)
    return Task(
        "cifar",
        torch.from_numpy(x_train),
        torch.from_numpy(y_train),
        torch.from_numpy(x_test),
        torch.from_numpy(y_test),
        cifar_model,
        lr=1e-3,
        batch_size=32,
        epochs=10,
    )


def make_task(name: str, n_train: int = 0) -> Task:
    """The task called ``name``; ``n_train`` > 0 keeps only that many training examples
    (digits) or generates that many (cifar), for quick checks."""
    if name == "digits":
        task = digits_task()
        if n_train > 0:
            task.x_train, task.y_train = task.x_train[:n_train], task.y_train[:n_train]
        return task
    if name == "cifar":
        return cifar_task(n_train) if n_train > 0 else cifar_task()
    raise ValueError(f"unknown task {name!r} (one of {', '.join(TASKS)})")
