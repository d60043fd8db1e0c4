"""Adasum's formula and its tree alone (core/collectives/adasum.py). In real jobs of 2 and 4
workers, against a numpy reference: tests/integration/test_adasum.py."""

from __future__ import annotations

import numpy as np
import pytest
from fastps.collectives import adasum


def _keep(x: np.ndarray) -> np.ndarray:
    return x


def test_pair_formula() -> None:
    a = np.array([1.0, 2.0, 0.0])
    b = np.array([0.5, -1.0, 3.0])
    dot, na, nb = 0.5 - 2.0, 5.0, 10.25
    want = (1 - dot / (2 * na)) * a + (1 - dot / (2 * nb)) * b
    assert np.allclose(adasum.combine(a, b), want, rtol=1e-15)


def test_special_cases() -> None:
    a = np.array([3.0, -4.0])
    assert np.allclose(adasum.combine(a, a), a)  # equal: their average
    e1, e2 = np.array([1.0, 0.0]), np.array([0.0, 2.0])
    assert np.allclose(adasum.combine(e1, e2), e1 + e2)  # orthogonal: their sum
    zero = np.zeros(2)
    assert np.array_equal(adasum.combine(a, zero), a)  # no division by a zero norm
    assert np.array_equal(adasum.combine(zero, zero), zero)


def test_tree_order_for_four_and_three() -> None:
    rows = [np.random.default_rng(i).standard_normal(5) for i in range(4)]
    c = adasum.combine
    four = adasum.reduce_rows(rows, _keep)
    assert np.allclose(four, c(c(rows[0], rows[1]), c(rows[2], rows[3])), rtol=1e-14)
    three = adasum.reduce_rows(rows[:3], _keep)
    assert np.allclose(three, c(c(rows[0], rows[1]), rows[2]), rtol=1e-14)
    assert np.array_equal(adasum.reduce_rows(rows[:1], _keep), rows[0])
    with pytest.raises(ValueError):
        adasum.reduce_rows([], _keep)


def test_integer_dtype_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="op 'g': op=Adasum .* not int32"):
        adasum.check_dtype("g", "int32")
    adasum.check_dtype("g", "bfloat16")
