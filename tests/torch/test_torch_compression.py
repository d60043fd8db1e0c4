"""fastps.torch with the core's compressors: allreduce against the codec reference, the
DistributedOptimizer training with top-k and error feedback, and a mismatch named
(tests/torch/workers/compression_ops.py)."""

from __future__ import annotations

from typing import Dict

from torchjobs import WORKERS, fastpsrun, lines_of


def test_torch_with_core_compressors(subprocess_env: Dict[str, str]) -> None:
    res = fastpsrun(WORKERS / "compression_ops.py", env=subprocess_env, timeout=300)
    assert res.returncode == 0, res.stdout[-6000:]
    for what in ("allreduce", "optimizer", "mismatch"):
        assert len(lines_of(res.stdout, f"COMPRESSION OK {what}")) == 2, res.stdout[-4000:]


def test_randomk_error_feedback_matches_reference_in_training(
    subprocess_env: Dict[str, str],
) -> None:
    # Every step of Adam training with random-k 5% and error feedback: the gradients the
    # optimizer gets equal the algorithm's reference on the allgathered raw gradients.
    res = fastpsrun(WORKERS / "randomk_reference.py", env=subprocess_env, timeout=300)
    assert res.returncode == 0, res.stdout[-6000:]
    assert len(lines_of(res.stdout, "RANDOMK REFERENCE OK")) == 2, res.stdout[-4000:]
