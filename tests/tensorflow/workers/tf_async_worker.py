"""Async mode through the Keras optimizer wrapper, run with FASTPS_MODE=async by
tests/tensorflow/test_tf_async.py: the mode comes from the environment, the steps run
eagerly and inside tf.function, and the parameters the servers keep are exactly rank 0's
initial value plus every worker's SGD deltas (float64, small integers: exact).
``pull_parameters`` reads them on any worker; ``push_parameters`` replaces them with rank
0's."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import fastps  # noqa: E402
import fastps.tensorflow as hvd  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from fastps.worker import api  # noqa: E402

STEPS = 4


def main() -> int:
    hvd.init()
    rank, n = hvd.rank(), hvd.size()
    assert api.mode() == "async", api.mode()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=1.0))
    assert hasattr(opt, "pull_parameters"), "FASTPS_MODE=async did not select async"
    ramp = np.arange(6, dtype=np.float64).reshape(2, 3)
    w = keras.Variable(np.full((2, 3), 1.0 + 4 * rank), dtype="float64", name="w")
    grad = tf.constant((rank + 1) * ramp)

    @tf.function
    def graph_step() -> None:
        opt.apply_gradients([(grad, w)])

    for step in range(STEPS):
        if step < 2:
            opt.apply_gradients([(grad, w)])  # eagerly
        else:
            graph_step()
    fastps.barrier()
    # Every worker's STEPS deltas -(r+1)*ramp are on the servers, from rank 0's 1.0.
    want = 1.0 - STEPS * sum(r + 1 for r in range(n)) * ramp
    w.assign(np.zeros((2, 3)))
    opt.pull_parameters()
    got = w.numpy()
    if not np.array_equal(got, want):
        print(f"rank {rank}: pulled {got.tolist()}, want {want.tolist()}", flush=True)
        return 1
    fastps.barrier()
    w.assign(np.full((2, 3), 7.0 + rank))
    opt.push_parameters()  # rank 0's 7.0 everywhere, on the servers too
    if not np.array_equal(w.numpy(), np.full((2, 3), 7.0)):
        print(f"rank {rank}: after push_parameters {w.numpy().tolist()}", flush=True)
        return 1
    print(f"rank {rank} ASYNC OK", flush=True)
    fastps.barrier()
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
