"""Quorum rounds (FASTPS_ROUND_QUORUM, docs/guide/async.md) through the TensorFlow plugin's
gradient path: tests/workers/quorum_worker.py's steps, each sum the gradient of
``sum(w * x)`` (exactly x) through ``DistributedGradientTape(op=Sum)``, which pushes
straight to the core. (``hvd.allreduce`` goes through the negotiated collective layer,
which waits for every rank before it starts: quorum rounds are for gradients.)
Arguments: steps slow at delay pace elems."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workers"))

import fastps  # noqa: E402
import fastps.tensorflow as hvd  # noqa: E402
import tensorflow as tf  # noqa: E402
from quorum_worker import run_steps  # noqa: E402


def main() -> None:
    hvd.init()
    rank = hvd.rank()

    elems = int(sys.argv[6])
    w = tf.Variable(tf.zeros([elems], tf.float64))

    def summed(x, _step):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w * tf.constant(x))
        tape = hvd.DistributedGradientTape(tape, op=hvd.Sum)
        return tape.gradient(loss, [w])[0].numpy()

    run_steps(summed, rank, hvd.size(), sys.argv[1:])
    fastps.barrier()
    print(f"rank {rank} OK quorum", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
