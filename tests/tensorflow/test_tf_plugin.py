"""fastps.tensorflow and fastps.tensorflow.keras, through real multi-process jobs."""

from __future__ import annotations

import re
import time

import pytest
from tfjobs import WORKERS, fastpsrun, tail


def _ok(p, n: int) -> None:
    assert p.returncode == 0, tail(p)
    for r in range(n):
        assert f"rank {r} OK" in p.stdout, tail(p)


@pytest.mark.shared_check("keras3", "api")
def test_every_function_on_every_dtype(shared_check) -> None:
    """push_pull (Sum/Average, async, compression, scaling, gradients, IndexedSlices),
    allgather, broadcast (root = last rank), broadcast_variables (eager and in a graph),
    broadcast_object, allgather_object and the Keras callbacks, on float16, bfloat16,
    float32, float64, int8, uint8, int16, int32, int64 and bool, eagerly and in tf.function."""
    _ok(shared_check, 2)  # workers/tf_api_worker.py


@pytest.mark.shared_check("keras2", "fit")
def test_keras2_fit(shared_check) -> None:
    """Under Keras 2 (tf_keras, TF_USE_LEGACY_KERAS=1): DistributedOptimizer around a current
    and a legacy tf_keras optimizer plus the callbacks in model.fit leave every rank with
    the same weights and averaged losses, and the scheduled learning rates."""
    _ok(shared_check, 2)  # workers/tf_keras2_worker.py


@pytest.mark.parametrize(
    "n,modes",
    [
        pytest.param(
            2,
            "tape,tape-eager,tape-grouped,fit,fit-grouped",
            marks=pytest.mark.shared_check("keras3", "train"),  # these modes: tfjobs.py
        ),
        (3, "tape,fit"),
    ],
)
def test_training_equals_single_process(request, n: int, modes: str) -> None:
    """N workers, each on its slice of every batch, end with the weights one process gets
    on the whole batches: DistributedGradientTape in tf.function (one op pair per gradient,
    and num_groups=2) and eagerly (SGD with momentum), and model.fit with
    DistributedOptimizer(Adam) (also num_groups=1) + BroadcastGlobalVariablesCallback (every
    rank starts from different weights)."""
    if request.node.get_closest_marker("shared_check"):
        p = request.getfixturevalue("shared_check")
    else:
        p = fastpsrun(n, [str(WORKERS / "tf_train_worker.py"), modes])
    _ok(p, n)
    diffs = re.findall(r"max \|difference\| (\S+)", p.stdout)
    assert len(diffs) == len(modes.split(",")), tail(p)
    # The small gradients travelled fused (the default FASTPS_FUSION_THRESHOLD).
    buckets = [int(b) for b in re.findall(r"fusion buckets (\d+)", p.stdout)]
    assert len(buckets) == n and min(buckets) > 0, tail(p)


@pytest.mark.shared_check("keras3", "cross-barrier")
def test_keras_cross_barrier_equals_synchronous_updates(shared_check) -> None:
    """DistributedOptimizer(cross_barrier=True): apply() returns with updates deferred (rank
    1 is late on some steps, so rank 0's sums are not in), the next forward pass applies them,
    and the weights, optimizer variables and iterations equal the synchronous step's bit
    for bit in float64: SGD+momentum, Adam with a schedule, AdamW with weight decay, clipnorm
    and a learning rate changed while updates pend, and model.fit(run_eagerly=True);
    global_clipnorm falls back to synchronous steps with a warning."""
    p = shared_check  # workers/tf_cross_barrier_worker.py 6
    _ok(p, 2)
    for case in ("sgd", "adam-schedule", "adamw-clip", "fit"):
        m = re.search(rf"rank 0 CB EQUAL {case} deferred=(\d+)", p.stdout)
        assert m and int(m.group(1)) > 0, tail(p)


@pytest.mark.parametrize(
    "mode,expect",
    [
        (
            "tape-shape",
            r"gradients reduced by DistributedGradientTape differ between workers: "
            r"rank 0 has 4 and rank 1 has 4; the first difference is rank 0 "
            r"#0 '\S*kernel' float32\[8, 16\] vs rank 1 #0 '\S*kernel' float32\[8, 17\]",
        ),
        (
            "fit-layers",
            r"gradients reduced by DistributedOptimizer differ between workers: "
            r"rank 0 has 4 and rank 1 has 6",
        ),
        (
            "broadcast-count",
            r"variables passed to broadcast_variables\('keras.broadcast.model'\) "
            r"differ between workers: rank 0 has 4 and rank 1 has 6",
        ),
    ],
    ids=["tape-shape", "fit-layers", "broadcast-count"],
)
def test_mismatched_models_fail_fast(mode: str, expect: str) -> None:
    """A model that differs between workers stops the job at the first step with an error
    naming the difference, on every worker, instead of hanging."""
    t0 = time.monotonic()
    # Were the check missing, the job would end only at the operation timeout (100 s).
    p = fastpsrun(2, [str(WORKERS / "tf_mismatch_worker.py"), mode], timeout=180, op_timeout=100)
    elapsed = time.monotonic() - t0
    assert p.returncode != 0, tail(p)
    assert "finished without an error" not in p.stdout, tail(p)
    assert re.search(expect, p.stdout + p.stderr), tail(p)
    assert elapsed < 90, f"took {elapsed:.0f} s\n" + tail(p)


@pytest.mark.shared_check("keras3", "keras-digits")
def test_keras_digits_example(shared_check) -> None:
    p = shared_check  # examples/tensorflow/keras_digits.py, in a shared job (tfjobs.py)
    assert p.returncode == 0, tail(p)
    m = re.search(r"test accuracy: (\d\.\d+)", p.stdout)
    assert m and float(m.group(1)) >= 0.95, tail(p)


@pytest.mark.shared_check("keras3", "tape-digits")
def test_tape_digits_example(shared_check) -> None:
    p = shared_check  # examples/tensorflow/tape_digits.py, in a shared job (tfjobs.py)
    assert p.returncode == 0, tail(p)
    m = re.search(r"test accuracy: (\d\.\d+)", p.stdout)
    assert m and float(m.group(1)) >= 0.95, tail(p)


@pytest.mark.parametrize(
    "n", [pytest.param(2, marks=pytest.mark.shared_check("keras3", "layers")), 3]
)
def test_sync_batch_norm_and_partial_tape(request, n: int) -> None:
    """SyncBatchNormalization equals BatchNormalization over the global batch (outputs,
    moving statistics, gradients; eager and tf.function); PartialDistributedGradientTape
    keeps its local layers' gradients local and averages the rest."""
    if request.node.get_closest_marker("shared_check"):
        _ok(request.getfixturevalue("shared_check"), n)  # the same worker and modes
    else:
        _ok(fastpsrun(n, [str(WORKERS / "tf_layers_worker.py"), "syncbn,partial"]), n)


@pytest.mark.parametrize(
    "mode",
    [
        pytest.param("graph", marks=pytest.mark.shared_check("keras2", "syncbn-graph")),
        pytest.param("eager", marks=pytest.mark.shared_check("keras2", "syncbn-eager")),
    ],
)
def test_keras2_sync_batch_norm(shared_check, mode: str) -> None:
    """Under Keras 2, hvd.SyncBatchNormalization is a tf_keras layer: in a TF1 session (as
    Horovod's test_horovod_syncbn_cpu runs it) and eagerly, each rank's slice normalizes to
    Keras 2's BatchNormalization over the whole batch, moving statistics alike."""
    p = shared_check  # workers/tf_keras2_syncbn_worker.py MODE
    assert p.returncode == 0, tail(p)
    for r in range(2):
        assert f"rank {r} {mode} OK" in p.stdout, tail(p)
