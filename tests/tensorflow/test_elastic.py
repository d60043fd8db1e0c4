"""Horovod's elastic API in fastps.tensorflow / fastps.tensorflow.keras: the state's commit,
restore and sync (Horovod's test_elastic_state, in one process), and a 3-worker job that
loses a worker by SIGKILL and ends with the single-process parameters."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tfjobs import tail

tf = pytest.importorskip("tensorflow")

HERE = Path(__file__).resolve().parent
TRAIN = HERE / "workers" / "train_elastic.py"


def test_keras_state_commit_restore_sync():
    import fastps.tensorflow.keras as hvd

    hvd.init()
    model = tf.keras.Sequential([tf.keras.layers.Dense(2)])
    model.build((2, 2))
    model.set_weights([np.ones((2, 2), np.float32), np.ones(2, np.float32)])
    other = [np.array([[1.0, 2.0], [3.0, 4.0]], np.float32), np.zeros(2, np.float32)]
    opt = tf.keras.optimizers.Adam(0.001)
    opt.build(model.trainable_variables)
    state = hvd.elastic.KerasState(model, opt, batch=20, epoch=10)
    state.sync()
    model.set_weights(other)
    state.batch, state.epoch = 21, 11
    state.restore()
    for w in model.get_weights():
        np.testing.assert_array_equal(w, np.ones_like(w))
    assert (state.batch, state.epoch) == (20, 10)
    model.set_weights(other)
    state.batch, state.epoch = 21, 11
    state.commit()
    state.restore()
    for w, want in zip(model.get_weights(), other):
        np.testing.assert_array_equal(w, want)
    assert (state.batch, state.epoch) == (21, 11)
    # A variables-only state (eager TensorFlow 2) rolls back by assignment.
    v = tf.Variable([1.0, 2.0])
    import fastps.tensorflow as hvd_tf

    vstate = hvd_tf.elastic.TensorFlowState([v], step=3)
    v.assign([5.0, 6.0])
    vstate.step = 4
    vstate.restore()
    np.testing.assert_array_equal(v.numpy(), [1.0, 2.0])
    assert vstate.step == 3
    with pytest.raises(hvd_tf.FastPSError, match="session"):
        hvd_tf.elastic.TensorFlowState([v], session=object())


def test_keras_callbacks_keep_the_state():
    import fastps.tensorflow.keras as hvd

    hvd.init()
    model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.01), loss="mse")
    x, y = np.ones((8, 3), np.float32), np.ones((8, 1), np.float32)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)  # builds model and optimizer
    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    commits = []
    state.save = (lambda orig: lambda: (commits.append(1), orig())[1])(state.save)
    model.fit(
        x,
        y,
        batch_size=2,
        epochs=2,
        verbose=0,
        callbacks=[
            hvd.elastic.CommitStateCallback(state, batches_per_commit=2),
            hvd.elastic.UpdateBatchStateCallback(state),
            hvd.elastic.UpdateEpochStateCallback(state),
        ],
    )
    assert len(commits) == 4  # 8 batches, a commit every 2
    assert state.epoch == 2 and state.batch == 0
    with pytest.raises(ValueError, match="batches_per_commit"):
        hvd.elastic.CommitStateCallback(state, batches_per_commit=0)


@pytest.mark.slow
@pytest.mark.parametrize("tf_function", ["0", "1"])
def test_killed_worker_tf_training_finishes_smaller(tmp_path, subprocess_env, tf_function):
    hosts = tmp_path / "discover.sh"
    hosts.write_text("#!/bin/sh\necho localhost:3\n")
    hosts.chmod(hosts.stat().st_mode | stat.S_IXUSR)
    result = tmp_path / "result.json"
    steps = 10
    env = {**subprocess_env, "STEPS": str(steps), "FAIL_AT": "localhost:2@4"}
    env.update(RESULT=str(result), TF_FUNCTION=tf_function)
    cmd = [sys.executable, "-m", "fastps.launcher", "--min-np", "2", "--max-np", "3"]
    cmd += ["--host-discovery-script", str(hosts), "--elastic-timeout", "120"]
    cmd += [sys.executable, str(TRAIN)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "size=3" in proc.stdout and f"STEP {steps} size=2" in proc.stdout, proc.stdout[-3000:]
    out = json.loads(result.read_text())
    sys.path.insert(0, str(HERE / "workers"))
    import train_elastic

    want = train_elastic.reference(steps)
    for got, ref in zip(out["params"], want):
        np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-12)


def test_commit_callback_counts_from_each_fit_start():
    """A commit that raises (HostsUpdatedInterrupt) must not leave the count where a
    newcomer's differs: every fit() starts counting afresh, on every rank."""
    from fastps.tensorflow.keras.elastic import CommitStateCallback

    class Interrupting:
        def __init__(self):
            self.commits = 0

        def commit(self):
            self.commits += 1
            if self.commits == 1:
                raise RuntimeError("hosts updated")

    state = Interrupting()
    cb = CommitStateCallback(state, batches_per_commit=3)
    cb.on_train_begin()
    cb.on_train_batch_end(0)
    cb.on_train_batch_end(1)
    with pytest.raises(RuntimeError):
        cb.on_train_batch_end(2)
    cb.on_train_begin()  # the next fit(), in the new world
    for b in range(6):
        cb.on_train_batch_end(b)
    assert state.commits == 3  # after batches 2 and 5 of the new fit


@pytest.mark.slow
@pytest.mark.timeout(900)  # TensorFlow starts slowly on a loaded machine
def test_worker_joins_keras_fit(tmp_path, subprocess_env):
    """A worker added through the discovery script while the others are inside
    ``model.fit``: the survivors run the train step ``fit`` compiled in the first
    generation again (same shapes), the newcomer traces its own; both must check the
    gradients together and average over the new world (this hung until
    FASTPS_OP_TIMEOUT: the survivors had cached the first generation's gradient check)."""
    sys.path.insert(0, str(HERE.parent / "integration" / "elastic"))
    sys.path.insert(0, str(HERE / "workers"))
    import keras_fit_elastic
    from live_job import LiveJob, discovery_script

    hosts, script = discovery_script(tmp_path, "localhost:2")
    result = tmp_path / "result.json"
    steps = 40
    env = {**subprocess_env, "STEPS": str(steps), "STEP_SLEEP": "0.25", "RESULT": str(result)}
    env.update(CUDA_VISIBLE_DEVICES="-1", FASTPS_OP_TIMEOUT="60")
    args = ["-np", "2", "--min-np", "2", "--max-np", "3"]
    args += ["--host-discovery-script", str(script), "--elastic-timeout", "120"]
    args += [sys.executable, str(HERE / "workers" / "keras_fit_elastic.py")]
    job = LiveJob(args, env, cwd=tmp_path)
    try:
        job.wait_for(r"STEP 3 size=2", 300)
        hosts.write_text("localhost:3\n")
        job.wait_for(r"generation 1: 3 workers", 240)
        job.wait_for(r"STEP \d+ size=3", 120)
        rc = job.finish(300)
    finally:
        job.stop()
    assert rc == 0, job.tail()
    out = json.loads(result.read_text())
    sizes = out["sizes"]
    assert len(sizes) == steps and sizes[0] == 2 and sizes[-1] == 3, sizes
    assert sizes == sorted(sizes), sizes  # one change of world: 2 workers, then 3
    for got, ref in zip(out["params"], keras_fit_elastic.reference(sizes)):
        np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(
    "keras",
    [
        pytest.param(k, marks=pytest.mark.shared_check(k, "elastic-state"))
        for k in ("keras3", "keras2")
    ],
)
def test_state_sync_across_ranks(shared_check, keras):
    """TensorFlowState and KerasState (Keras 3, and Keras 2 models and optimizers) in a
    2-worker job: sync gives every rank rank 0's values, and a restore after the sync goes
    back to those, not to the rank's own from before (tests/tensorflow/workers/
    tf_elastic_state_worker.py)."""
    p = shared_check  # workers/tf_elastic_state_worker.py KERAS, in a shared job (tfjobs.py)
    assert p.returncode == 0, tail(p)
    for r in range(2):
        assert f"rank {r} OK" in p.stdout, tail(p)
