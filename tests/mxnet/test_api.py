"""Every collective of fastps.mxnet, for every dtype MXNet has and the core sums, with real
worker and server processes started by fastpsrun; and the same checks in one process."""

from __future__ import annotations

import subprocess
import sys

from mxnet_jobs import WORKERS, fastpsrun, job_env, require_mxnet

require_mxnet()


def test_plugin_registers_kvstores() -> None:
    import fastps.mxnet as hvd
    import mxnet as mx

    registry = mx.kvstore.KVStoreBase.kv_registry
    assert registry["fastps"] is hvd.KVStore
    assert issubclass(registry["dist_sync_fastps"], hvd.KVStore)


def test_fp16_compression_round_trip() -> None:
    import fastps.mxnet as hvd
    import mxnet as mx
    import numpy as np

    x = mx.nd.array([1.5, -2.25, 1024.0])
    sent, ctx = hvd.Compression.fp16.compress(x)
    assert sent.dtype == np.float16
    back = hvd.Compression.fp16.decompress(sent, ctx)
    assert back.dtype == np.float32 and np.array_equal(back.asnumpy(), x.asnumpy())
    ints = mx.nd.array([1, 2], dtype="int32")
    assert hvd.Compression.fp16.compress(ints)[0] is ints
    assert hvd.Compression.none.compress(x)[0] is x


def test_api_three_workers_two_servers() -> None:
    res = fastpsrun(3, WORKERS / "api_worker.py", num_servers=2)
    assert res.returncode == 0, res.stdout[-6000:]
    for r in range(3):
        assert f"[worker {r}] API OK {r}" in res.stdout, res.stdout[-6000:]


def test_api_single_process_without_launcher() -> None:
    res = subprocess.run(
        [sys.executable, str(WORKERS / "api_worker.py")],
        env=job_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout[-6000:]
    assert "API OK 0" in res.stdout
