"""Quorum rounds (FASTPS_ROUND_QUORUM, docs/async.md) through the TensorFlow plugin's
allreduce: tests/workers/quorum_worker.py's steps, each sum an ``hvd.allreduce(op=Sum)`` of
a tf.Tensor. Arguments: steps slow at delay pace elems."""

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

    def summed(x, _step):
        return hvd.allreduce(tf.constant(x), op=hvd.Sum, name="grad").numpy()

    run_steps(summed, rank, hvd.size(), sys.argv[1:])
    fastps.barrier()
    print(f"rank {rank} OK quorum", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
