"""Sufficient-factor broadcasting of Gluon Dense weights (plugins/mxnet/sfb.py) against the
dense path, with 2 processes (workers/sfb_worker_mx.py)."""

from __future__ import annotations

from mxnet_jobs import WORKERS, fastpsrun, require_mxnet

require_mxnet()


def test_gluon_sfb_equals_dense() -> None:
    """Bit-equal gradients on integer-valued float64 data (a flattening Dense with its own
    activation, a Dense applied twice, a flatten=False Dense on a sequence, a Dense one
    rank skips); 5 SGD-momentum steps equal the dense path (1e-12) and one process (1e-9);
    auto picks by the cost model; hybridized nets, shared weights, grad_req='add',
    compression and no model= use the servers; a loss term on an SFB weight and a late
    hybridize() are errors naming the layer."""
    res = fastpsrun(2, WORKERS / "sfb_worker_mx.py", timeout=240)
    assert res.returncode == 0, res.stdout[-6000:]
    out = res.stdout
    for case in ("exact", "train", "auto", "fallbacks", "outside", "late"):
        assert out.count(f"SFB OK {case}") == 2, (case, out[-4000:])
    # Rank 0 printed the decision per layer, once per trainer.
    lines = [line for line in out.splitlines() if "fastps SFB   " in line]
    assert any("_wide_weight: 256x256, 4 rows x 2 workers" in line for line in lines), out[-4000:]
    assert any("_wide_weight" in line and "-> sufficient factors" in line for line in lines)
    assert any("_thin_weight" in line and "-> servers" in line for line in lines), out[-4000:]
    for reason in (
        "hybridized: the cached graph bypasses the capture",
        "weight shared with another block",
        "grad_req='add'",
        "all layers use the servers: gradient compression is on",
    ):
        assert reason in out, (reason, out[-4000:])


def test_gluon_sfb_with_cross_barrier_equals_dense() -> None:
    """Cross-barrier updates: the factor weights' waits stay in step(), the others go to
    the engine; 5 steps still equal the dense path and one process."""
    res = fastpsrun(
        2, WORKERS / "sfb_worker_mx.py", "train", env={"FASTPS_CROSS_BARRIER": "1"}, timeout=240
    )
    assert res.returncode == 0, res.stdout[-6000:]
    assert res.stdout.count("SFB OK train") == 2, res.stdout[-4000:]


def test_gluon_sfb_in_a_process_set_equals_dense() -> None:
    """3 processes, a set of ranks 0 and 1: the set's broadcast and allgather."""
    res = fastpsrun(3, WORKERS / "sfb_worker_mx.py", "set", timeout=240)
    assert res.returncode == 0, res.stdout[-6000:]
    assert res.stdout.count("SFB OK set") == 3, res.stdout[-4000:]
