"""fastps.tensorflow's gradient reducer with the core's compressors
(tests/tensorflow/workers/tf_compression_worker.py)."""

from __future__ import annotations

import pytest
from tfjobs import tail


@pytest.mark.shared_check("keras3", "compression")
def test_gradient_tape_with_core_compressors(shared_check) -> None:
    p = shared_check  # workers/tf_compression_worker.py, in a shared job (tfjobs.py)
    assert p.returncode == 0, tail(p)
    for r in range(2):
        assert f"rank {r} OK" in p.stdout, tail(p)
