"""Gradient compression chosen per tensor and carried out by the C++ core.

``Compression.fp16``, ``.bf16``, ``.onebit``, ``.topk(k)``, ``.randomk(k)`` and
``.dithering(levels)`` name a codec of ``csrc/compression/``: the worker compresses each
part before the push, the server decodes every worker's part, sums in float32, compresses
the sum again and answers, and the worker decodes into the output (docs/guide/compression.md).
``error_feedback=True`` carries what each compression dropped into the next round, on the
worker and on the server. A compressor applies to float tensors of at least ``min_bytes``
whose name matches one of ``names`` (shell patterns; default: every name); the others go
uncompressed. ``Compression.select`` picks a compressor by name pattern, and
``FASTPS_COMPRESSION`` (with ``FASTPS_COMPRESSION_MIN_BYTES``) sets the default used where
a plugin is given none.

The compressor a tensor gets is part of its declaration to the scheduler, so workers that
compress one tensor differently fail naming both settings.
"""

from __future__ import annotations

import fnmatch
from typing import Any, Optional, Sequence, Tuple

from fastps.errors import FastPSError

__all__ = [
    "CoreCompressor",
    "Compression",
    "spec_for",
    "default_compressor",
    "canonical_spec",
    "is_core",
]

_FLOAT_DTYPES = frozenset({"float32", "float64", "float16", "bfloat16"})


def canonical_spec(text: str) -> str:
    """The core's canonical form of a compressor spec (``"topk:0.01:ef"``); FastPSError
    naming the spec when it is bad."""
    from fastps import _core

    try:
        return str(_core.compression_spec(text))
    except ValueError as exc:
        raise FastPSError(str(exc)) from None


class CoreCompressor:
    """One codec of the core with its settings; immutable. Call it to change settings:
    ``Compression.onebit(error_feedback=True)``, ``Compression.fp16(min_bytes=1 << 16)``."""

    def __init__(
        self,
        codec: str,
        param: Optional[float] = None,
        error_feedback: bool = False,
        min_bytes: int = 0,
        names: Optional[Sequence[str]] = None,
        momentum: float = 0.0,
        warmup: int = 0,
    ) -> None:
        text = codec if param is None else f"{codec}:{param}"
        if error_feedback:
            text += ":ef"
        if momentum:
            text += f":momentum={momentum}"
        if warmup:
            text += f":warmup={warmup}"
        self.spec = canonical_spec(text)
        self.codec = codec
        self.param = param
        self.error_feedback = bool(error_feedback)
        self.momentum = float(momentum)
        self.warmup = int(warmup)
        if int(min_bytes) < 0:
            raise FastPSError(f"compression {self.spec}: min_bytes = {min_bytes} must be >= 0")
        self.min_bytes = int(min_bytes)
        self.names: Optional[Tuple[str, ...]] = None if names is None else tuple(names)

    def __call__(
        self,
        error_feedback: Optional[bool] = None,
        min_bytes: Optional[int] = None,
        names: Optional[Sequence[str]] = None,
    ) -> CoreCompressor:
        return CoreCompressor(
            self.codec,
            self.param,
            self.error_feedback if error_feedback is None else error_feedback,
            self.min_bytes if min_bytes is None else min_bytes,
            self.names if names is None else names,
            self.momentum,
            self.warmup,
        )

    def spec_for(self, name: str, nbytes: int, dtype: str) -> str:
        """The spec this tensor is pushed with: ``""`` (uncompressed) for non-float
        dtypes, tensors under ``min_bytes`` and names outside ``names``."""
        if dtype not in _FLOAT_DTYPES or nbytes < self.min_bytes or nbytes == 0:
            return ""
        if self.names is not None and not any(fnmatch.fnmatchcase(name, p) for p in self.names):
            return ""
        return self.spec

    def __repr__(self) -> str:
        extra = f", min_bytes={self.min_bytes}" if self.min_bytes else ""
        if self.names is not None:
            extra += f", names={list(self.names)}"
        return f"Compression({self.spec}{extra})"


class _Select:
    """The first rule whose pattern matches a tensor's name picks its compressor."""

    def __init__(self, rules: Sequence[Tuple[str, Optional[CoreCompressor]]]) -> None:
        self.rules = [(str(p), c) for p, c in rules]

    def spec_for(self, name: str, nbytes: int, dtype: str) -> str:
        for pattern, comp in self.rules:
            if fnmatch.fnmatchcase(name, pattern):
                return "" if comp is None else comp.spec_for(name, nbytes, dtype)
        return ""

    def __repr__(self) -> str:
        return f"Compression.select({self.rules!r})"


class Compression:
    """The core's compressors (docs/guide/compression.md)."""

    none: Optional[CoreCompressor] = None
    fp16 = CoreCompressor("fp16")
    bf16 = CoreCompressor("bf16")
    onebit = CoreCompressor("onebit")

    @staticmethod
    def topk(
        k: float,
        error_feedback: bool = False,
        min_bytes: int = 0,
        momentum: float = 0.0,
        warmup: int = 0,
    ) -> CoreCompressor:
        """The k largest magnitudes of each part (k < 1: that fraction of its values).
        ``momentum`` (with error feedback): Deep Gradient Compression's momentum
        correction and factor masking (Lin et al. 2018); use it with an optimizer
        without momentum of its own. ``warmup`` (k < 1): DGC's sparsity warm-up over
        that many rounds of each part (docs/guide/compression.md)."""
        return CoreCompressor(
            "topk", k, error_feedback, min_bytes, momentum=momentum, warmup=warmup
        )

    @staticmethod
    def randomk(
        k: float, error_feedback: bool = False, min_bytes: int = 0, warmup: int = 0
    ) -> CoreCompressor:
        """k values of each part at indices every worker draws alike. ``warmup`` (k < 1):
        the kept fraction falls from all values to k over that many rounds of each part
        (Deep Gradient Compression's sparsity warm-up; docs/guide/compression.md)."""
        return CoreCompressor("randomk", k, error_feedback, min_bytes, warmup=warmup)

    @staticmethod
    def dithering(levels: int, error_feedback: bool = False, min_bytes: int = 0) -> CoreCompressor:
        """Stochastic rounding to ``levels`` levels of each part's largest magnitude."""
        return CoreCompressor("dithering", levels, error_feedback, min_bytes)

    @staticmethod
    def from_spec(text: str, min_bytes: int = 0) -> Optional[CoreCompressor]:
        """The compressor a spec string names (``"onebit:ef"``, ``"topk:0.01"``); None for
        ``""`` or ``"none"``."""
        spec = canonical_spec(text.strip()) if text.strip() else "none"
        if spec == "none":
            return None
        fields = spec.split(":")
        warmup = 0
        if fields[-1].startswith("warmup="):
            warmup = int(fields[-1].split("=", 1)[1])
            fields = fields[:-1]
        momentum = 0.0
        if fields[-1].startswith("momentum="):
            momentum = float(fields[-1].split("=", 1)[1])
            fields = fields[:-1]
        ef = fields[-1] == "ef"
        if ef:
            fields = fields[:-1]
        param = float(fields[1]) if len(fields) > 1 else None
        return CoreCompressor(fields[0], param, ef, min_bytes, momentum=momentum, warmup=warmup)

    @staticmethod
    def select(rules: Sequence[Tuple[str, Optional[CoreCompressor]]]) -> _Select:
        """Per-layer choice: ``[(pattern, compressor or None), ...]``, first match wins,
        no match: uncompressed."""
        return _Select(rules)


def is_core(compression: Any) -> bool:
    """Whether ``compression`` is carried out by the core (a fastps.Compression choice)
    rather than a compress/decompress pair a plugin runs."""
    return isinstance(compression, CoreCompressor) or hasattr(compression, "spec_for")


def default_compressor(cfg: object) -> Optional[CoreCompressor]:
    """The compressor ``FASTPS_COMPRESSION`` names (``Config.compression``), or None."""
    text = str(getattr(cfg, "compression", "") or "")
    if not text:
        return None
    try:
        return Compression.from_spec(text, int(getattr(cfg, "compression_min_bytes", 0)))
    except FastPSError as exc:
        raise FastPSError(f"FASTPS_COMPRESSION={text!r}: {exc}") from None


def spec_for(compression: object, name: str, nbytes: int, dtype: str) -> str:
    """The spec ``compression`` (a CoreCompressor, a selection, a spec string already
    chosen, or None) gives a tensor."""
    if compression is None:
        return ""
    if isinstance(compression, str):
        return canonical_spec(compression) if compression not in ("", "none") else ""
    pick = getattr(compression, "spec_for", None)
    if pick is None:
        raise FastPSError(
            f"tensor '{name}': compression={compression!r} is not one of fastps's core "
            "compressors (fastps.Compression.fp16, .onebit, .topk(k), ...)"
        )
    return str(pick(name, nbytes, dtype))
