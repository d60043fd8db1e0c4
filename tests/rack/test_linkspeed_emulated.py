"""Link-rate detection for pacing (core/control/linkspeed.py, FASTPS_LINK_MBIT=auto) run for
real inside an emulated rack host (root only), whose link is an htb class on a veth whose
driver claims 10 Gbit/s. The tc parser alone: tests/unit/test_linkspeed.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.root
def test_detected_inside_an_emulated_host() -> None:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from benchmarks.rack import Rack, is_supported

    ok, why = is_supported()
    if not ok:
        pytest.skip(why)
    probe = (
        "import json, os, sys; from fastps import linkspeed; "
        "print(json.dumps(linkspeed.detect_link_mbit(os.environ['FASTPS_HOST'])))"
    )
    with Rack(2, 0, 300.0, prefix="fpsl") as rack:
        proc = rack.spawn("w0", [sys.executable, "-c", probe])
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        assert proc.returncode == 0, rack.logs()
        line = [x for x in rack.logs()["w0"].splitlines() if "[" in x and "tc" in x][-1]
        mbit, how = json.loads(line.split("]", 1)[1])
    # The veth claims 10 Gbit/s; the htb class on it allows 300 Mbit/s.
    assert mbit == pytest.approx(300.0) and "tc" in how, (mbit, how)
