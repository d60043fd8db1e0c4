"""Smoke test of fastps across emulated machines (benchmarks/rack), as the rack benchmarks
run it: 2 worker hosts + 1 CPU host, each link shaped, scheduler on w0, a server on every
host (w0, w1, c0), one worker per worker host, each process in its host's namespace.

One push_pull of a tensor spanning several partitions (so every server gets parts) is
checked element by element on both workers. Needs root; skipped with the reason otherwise.
Rack prefix ``fpsk`` (the benchmarks use ``fpsr``, tests/rack/test_rack.py ``fpst/fpsx/fpss``).
"""

from __future__ import annotations

import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import rack_common as rc  # noqa: E402
from benchmarks.rack import Rack, find_stale, is_supported  # noqa: E402

_OK, _WHY = is_supported()
pytestmark = [pytest.mark.root, pytest.mark.skipif(not _OK, reason=_WHY), pytest.mark.timeout(90)]

PREFIX = "fpsk"

WORKER = textwrap.dedent("""
    import json, os, sys
    import numpy as np
    import fastps

    fastps.init()
    rank, n = fastps.rank(), fastps.size()
    assert os.environ["FASTPS_HOSTNAME"] == f"w{rank}", os.environ["FASTPS_HOSTNAME"]
    count = 3 * 262144 + 123          # 3 MiB + a bit: 4 parts at FASTPS_PARTITION_BYTES=1M
    x = np.arange(count, dtype=np.float32) * (rank + 1) + rank
    fastps.push_pull_async(x, average=False, name="grad", priority=0, out=x).synchronize()
    idx = np.arange(count, dtype=np.float32)
    want = idx * (n * (n + 1) / 2) + n * (n - 1) / 2
    bad = int(np.count_nonzero(x != want))
    out = os.path.join(os.environ["RACK_RESULT_DIR"], f"rank{rank}.json")
    with open(out, "w") as fh:
        json.dump({"bad": bad, "n": n, "servers": fastps.num_servers(),
                   "host": os.environ["FASTPS_HOST"]}, fh)
    fastps.barrier()
    fastps.shutdown()
    sys.exit(1 if bad else 0)
""")


def test_push_pull_across_rack_hosts() -> None:
    if find_stale(PREFIX):
        pytest.fail(
            f"stale rack objects {find_stale(PREFIX)}; run python -m "
            f"benchmarks.rack.cli down --prefix {PREFIX}"
        )
    with (
        tempfile.TemporaryDirectory(prefix="rack-smoke-") as tmp,
        Rack(n_workers=2, n_cpu_hosts=1, rate_mbit=500, prefix=PREFIX) as rack,
    ):
        launch = rc.start_fastps(
            rack,
            n=2,
            k=1,
            worker_argv=[sys.executable, "-c", WORKER],
            port=29390,
            extra_env={
                "RACK_RESULT_DIR": tmp,
                "FASTPS_PARTITION_BYTES": "1M",
                "FASTPS_HEARTBEAT_TIMEOUT": "20",
            },
            timeout_s=40,
            label="smoke",
        )
        ok, err = rc.wait_all(rack, launch, timeout_s=60)
        assert ok, err
        res = rc.read_results(Path(tmp))
    assert sorted(res) == [0, 1], res
    for rank, r in res.items():
        assert r["bad"] == 0, f"worker {rank}: {r['bad']} wrong elements"
        assert r["n"] == 2 and r["servers"] == 3
        assert r["host"] == f"198.18.1.{rank + 1}"
    assert find_stale(PREFIX) == []
