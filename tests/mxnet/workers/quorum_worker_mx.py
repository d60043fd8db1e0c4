"""Quorum rounds (FASTPS_ROUND_QUORUM, docs/async.md) through the MXNet plugin's allreduce:
tests/workers/quorum_worker.py's steps, each sum an ``hvd.allreduce(average=False)`` of an
NDArray. Arguments: steps slow at delay pace elems."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workers"))

import fastps  # noqa: E402
import fastps.mxnet as hvd  # noqa: E402
import mxnet as mx  # noqa: E402
from quorum_worker import run_steps  # noqa: E402


def main() -> None:
    hvd.init()
    rank = hvd.rank()

    def summed(x, _step):
        arr = mx.nd.array(x, dtype="float64")
        return hvd.allreduce(arr, average=False, name="grad").asnumpy()

    run_steps(summed, rank, hvd.size(), sys.argv[1:])
    fastps.barrier()
    print(f"rank {rank} OK quorum", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
