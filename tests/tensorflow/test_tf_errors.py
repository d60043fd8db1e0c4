"""The TensorFlow plugin's errors are fastps errors too (``except fastps.FastPSError``
catches every failure fastps raises), and keep the TensorFlow and Python types Horovod's
users catch: ``UsageError`` is an ``InvalidArgumentError`` and a ``ValueError``,
``MismatchError`` a ``FailedPreconditionError``. In this process: no job is needed."""

from __future__ import annotations

import pytest

tf = pytest.importorskip("tensorflow")

import fastps  # noqa: E402
import fastps.tensorflow as hvd  # noqa: E402
from fastps import collectives as C  # noqa: E402
from fastps.tensorflow import _engine as E  # noqa: E402


def test_usage_error_is_a_fastps_error_and_keeps_its_other_types() -> None:
    for base in (fastps.FastPSError, tf.errors.InvalidArgumentError, ValueError):
        assert issubclass(hvd.UsageError, base), base
    assert issubclass(hvd.MismatchError, fastps.FastPSError)
    assert issubclass(hvd.MismatchError, tf.errors.FailedPreconditionError)


def _raise_layer_usage_error() -> None:
    raise C.UsageError("push_pull: name 'w' is already in flight")


@pytest.mark.parametrize(
    "clause",
    [fastps.FastPSError, tf.errors.InvalidArgumentError, tf.errors.OpError, ValueError],
    ids=lambda c: c.__name__,
)
def test_every_except_clause_catches_a_usage_error(clause: type) -> None:
    """The layer's usage error, as the plugin raises it (translated to TensorFlow's type)."""
    with pytest.raises(clause) as info:
        E.call(_raise_layer_usage_error)
    assert type(info.value) is hvd.UsageError
    assert info.value.message == "push_pull: name 'w' is already in flight"
