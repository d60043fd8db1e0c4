"""Rack-level hierarchy across emulated racks (benchmarks/rack with ``racks=2``): the
sums are exact and each rack's uplink carries one copy of the model each way, where the
flat scheme sends twice that.

Rack prefix ``fpsy`` (tests/rack/test_rack.py uses fpst/fpsx/fpss, the smoke test fpsk).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # plain `pytest` does not put the repo root on sys.path
    sys.path.insert(0, str(REPO))

from benchmarks import rack_common as rc  # noqa: E402
from benchmarks.rack import Rack, find_stale, is_supported  # noqa: E402

_OK, _WHY = is_supported()
pytestmark = [pytest.mark.root, pytest.mark.skipif(not _OK, reason=_WHY), pytest.mark.timeout(180)]

PREFIX = "fpsy"
COUNT = 1 << 20  # float32 elements: 4 MiB per worker

WORKER = textwrap.dedent(f"""
    import json, os, sys
    import numpy as np
    import fastps

    fastps.init()
    rank, n = fastps.rank(), fastps.size()
    x = np.arange({COUNT}, dtype=np.float32) + rank
    fastps.push_pull_async(x, average=False, name="grad", out=x).synchronize()
    want = np.arange({COUNT}, dtype=np.float32) * n + n * (n - 1) / 2
    bad = int(np.count_nonzero(x != want))
    with open(os.path.join(os.environ["RACK_RESULT_DIR"], f"rank{{rank}}.json"), "w") as fh:
        json.dump({{"bad": bad, "rack": os.environ.get("FASTPS_RACK", "")}}, fh)
    fastps.barrier()
    fastps.shutdown()
    sys.exit(1 if bad else 0)
""")


def _uplink_tx_bytes(rack: Rack, k: int) -> int:
    out = subprocess.run(
        ["ip", "-n", f"{rack.prefix}-s{k}", "-s", "-j", "link", "show", "uplink"],
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    ).stdout
    return int(json.loads(out)[0]["stats64"]["tx"]["bytes"])


def _run(rack: Rack, flat: bool, port: int) -> list:
    before = [_uplink_tx_bytes(rack, k) for k in range(2)]
    with tempfile.TemporaryDirectory(prefix="rack-hier-") as tmp:
        env = {"RACK_RESULT_DIR": tmp, "FASTPS_PARTITION_BYTES": "256K"}
        if flat:
            env["FASTPS_RACK"] = ""
        launch = rc.start_fastps(
            rack,
            4,
            0,
            [sys.executable, "-c", WORKER],
            port,
            extra_env=env,
            timeout_s=60,
            label="flat" if flat else "hier",
        )
        ok, err = rc.wait_all(rack, launch, timeout_s=120)
        assert ok, err
        res = rc.read_results(Path(tmp))
    assert sorted(res) == [0, 1, 2, 3], res
    for rank, r in res.items():
        assert r["bad"] == 0, f"worker {rank}: {r['bad']} wrong elements"
        assert r["rack"] == ("" if flat else f"r{rank // 2}")
    return [_uplink_tx_bytes(rack, k) - before[k] for k in range(2)]


def test_each_rack_sends_one_copy_up() -> None:
    if find_stale(PREFIX):
        pytest.fail(f"stale rack objects {find_stale(PREFIX)}")
    model = 4 * COUNT
    with Rack(
        n_workers=4, n_cpu_hosts=0, rate_mbit=500, prefix=PREFIX, racks=2, uplink_mbit=500
    ) as rack:
        assert [h.rack for h in rack.workers] == ["r0", "r0", "r1", "r1"]
        hier = _run(rack, flat=False, port=29420)
        flat = _run(rack, flat=True, port=29421)
    # Two racks: each uplink carries the other rack's half of the sums up and its own
    # half of the answers out, M in all (plus headers and the control plane); flat
    # carries 2 M: both workers' pushes of the other rack's half and answers to both.
    for k in range(2):
        assert 0.95 * model < hier[k] < 1.15 * model, (hier, model)
        assert 1.9 * model < flat[k] < 2.3 * model, (flat, model)
    assert find_stale(PREFIX) == []
