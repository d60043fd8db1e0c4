"""Adasum: adaptive summation of gradients (Maleki et al., MLSys 2021; Horovod's ``op=Adasum``).

Two gradients ``a`` and ``b`` combine as::

    adasum(a, b) = (1 - a·b / (2 |a|²)) a + (1 - a·b / (2 |b|²)) b

so orthogonal gradients add up, equal ones average, and anything in between gets a
weight in between. Over ranks the pairs form a binary tree in rank order, as Horovod's
recursive halving combines them for power-of-two sizes: level 1 combines ranks (0, 1),
(2, 3), ...; level 2 combines those results pairwise; and so on. For other sizes fastps
uses the same tree where a node without a partner at a level moves up unchanged (Horovod
refuses those sizes); with 3 ranks the result is ``adasum(adasum(g0, g1), g2)``.

Numerics follow Horovod's CPU path: dot products and squared norms accumulate in float64
over the whole tensor; each combination is computed in float64 from the operands and
rounded to the tensor's dtype before the next level, as Horovod keeps its intermediate
sums in the tensor's buffers. A vector whose squared norm is below ``NORM_FLOOR`` keeps
coefficient 1 (the formula would divide by ~0): ``adasum(a, 0) = a``. Floating-point
dtypes only.

This module is the algorithm alone, on numpy rows; ``core/collectives/ops.py`` gathers every
rank's tensor and calls :func:`reduce_rows`.
"""

from __future__ import annotations

from typing import Callable, List

import numpy as np

# Squared norms below this count as zero (coefficient 1), as in Horovod's kernel.
NORM_FLOOR = 1e-30

FLOAT_DTYPES = ("float32", "float64", "float16", "bfloat16")


def check_dtype(op_name: str, dtype: str) -> None:
    """Raises ValueError naming the op when Adasum is undefined for ``dtype``."""
    if dtype not in FLOAT_DTYPES:
        raise ValueError(
            f"op '{op_name}': op=Adasum combines floating-point gradients only, not {dtype} "
            f"(supported: {', '.join(FLOAT_DTYPES)})"
        )


def combine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """adasum(a, b) in float64 (the caller rounds to its dtype)."""
    a64 = np.asarray(a, dtype=np.float64).ravel()
    b64 = np.asarray(b, dtype=np.float64).ravel()
    dot = float(np.dot(a64, b64))
    anormsq = float(np.dot(a64, a64))
    bnormsq = float(np.dot(b64, b64))
    acoeff = 1.0 - dot / anormsq * 0.5 if anormsq >= NORM_FLOOR else 1.0
    bcoeff = 1.0 - dot / bnormsq * 0.5 if bnormsq >= NORM_FLOOR else 1.0
    return (acoeff * a64 + bcoeff * b64).reshape(np.shape(a))


def reduce_rows(rows: List[np.ndarray], round_to: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """Adasum of ``rows`` (one per rank, in rank order) over the binary tree described
    above. ``round_to`` turns a float64 result into the tensor's stored values (each
    level's results are rounded, as Horovod's are)."""
    if not rows:
        raise ValueError("Adasum of no tensors")
    level = list(rows)
    while len(level) > 1:
        nxt = [round_to(combine(level[i], level[i + 1])) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])  # no partner at this level: moves up unchanged
        level = nxt
    return level[0]
