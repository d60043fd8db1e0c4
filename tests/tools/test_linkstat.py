"""benchmarks/rack/linkstat.py: link samples turned into rates and a per-bin table."""

from __future__ import annotations

import gzip
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.rack import linkstat

ROOT = Path(__file__).resolve().parents[2]


def _write(path: Path) -> None:
    # Switch side: rx = the host's egress, tx = its ingress. 10 ms samples, t0 = 100 s.
    # w0 idles for 20 ms, then sends 1.25 MB per 10 ms (1000 Mbit/s) while receiving at half
    # that; c0 only receives, at 250 Mbit/s.
    rows = ["t,host,rx_bytes,tx_bytes"]
    w_rx = w_tx = c_tx = 0
    for i in range(7):
        t = 100.0 + 0.01 * i
        if i > 2:
            w_rx += 1_250_000
            w_tx += 625_000
            c_tx += 312_500
        rows += [f"{t:.6f},w0,{w_rx},{w_tx}", f"{t:.6f},c0,0,{c_tx}"]
    path.write_text("\n".join(rows) + "\n")


def test_utilisation_reads_egress_and_ingress(tmp_path: Path) -> None:
    f = tmp_path / "l.csv"
    _write(f)
    s = linkstat.utilisation(f)
    assert sorted(s) == ["c0", "w0"]
    w0 = s["w0"]
    assert [round(e) for _, e, _ in w0] == [0, 0, 1000, 1000, 1000, 1000]
    assert [round(i) for _, _, i in w0] == [0, 0, 500, 500, 500, 500]
    assert [round(i) for _, _, i in s["c0"]][-1] == 250
    busy = linkstat.busy_fraction(s, w0[1][0], w0[-1][0], 1000.0)  # the 4 busy intervals
    assert busy["w0"] == pytest.approx((1.0, 0.5))


def test_table_starts_at_the_first_busy_bin(tmp_path: Path) -> None:
    f = tmp_path / "l.csv"
    _write(f)
    rows = linkstat.table(linkstat.utilisation(f), 1000.0, 0.01)
    assert "c0" in rows[0] and "w0" in rows[0]
    first = rows[1].split()
    # time 0 is the first busy bin: w0 at 100% out, 50% in; c0 25% in
    assert first[0] == "0.00"
    assert first[1] == "0/25" and first[2] == "100/50"
    assert len(rows) == 1 + 4
    assert len(linkstat.table(linkstat.utilisation(f), 1000.0, 0.01, start_s=0.02)) == 1 + 2
    assert linkstat.table({}, 1000.0, 0.01) == []


def test_push_ends_names_the_last_worker() -> None:
    # 5 ms samples: w0 sends until 50 ms, w1 until 70 ms (one sample missing at 30 ms), then
    # both idle while w0 receives answers for 15 ms more; a second round from 150 to 200 ms.
    def rates(t_ms: int) -> dict:
        w0 = 900.0 if t_ms <= 50 or 150 <= t_ms <= 200 else 0.0
        w1 = 900.0 if t_ms <= 70 or 150 <= t_ms <= 200 else 0.0
        ans = 800.0 if 70 < t_ms <= 85 else 0.0
        return {"w0": (w0, ans), "w1": (w1, 0.0), "c0": (0.0, w0 + w1)}

    series: linkstat.Series = {"w0": [], "w1": [], "c0": []}
    for t_ms in range(5, 260, 5):
        for h, (e, i) in rates(t_ms).items():
            if not (h == "w1" and t_ms == 30):
                series[h].append((1000.0 + t_ms / 1000.0, e, i))
    ends = linkstat.push_ends(series, 1000.0)
    assert len(ends) == 2
    t, before, tail = ends[0]
    assert t == pytest.approx(0.070, abs=0.006)
    assert before["w1"] == 0.0 and before["w0"] == pytest.approx(0.020, abs=0.006)
    assert tail == pytest.approx(0.015, abs=0.006)
    assert set(ends[1][1].values()) == {0.0}
    assert linkstat.push_ends(series, 1000.0, prefix="x") == []


def test_show_prints_the_table_and_rejects_bad_rates(tmp_path: Path) -> None:
    f = tmp_path / "l.csv"
    _write(f)
    cmd = [sys.executable, "-m", "benchmarks.rack.linkstat", "--show", str(f), "--bin-ms", "10"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "100/50" in out.stdout
    bad = subprocess.run(
        cmd + ["--rate", "0"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert bad.returncode != 0 and "--rate" in bad.stderr
    ends = subprocess.run(cmd + ["--ends"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert ends.returncode == 0 and "no push ends" in ends.stdout  # w0 never stops here


def test_train_emulated_samples_links_only_on_the_rack(tmp_path: Path) -> None:
    from benchmarks import train_emulated

    with pytest.raises(SystemExit):
        train_emulated.parse_args(["--network", "loopback", "--linkstats", str(tmp_path)])
    a = train_emulated.parse_args(["--linkstats", str(tmp_path)])
    assert a.linkstats == tmp_path


def test_gzipped_samples_and_unreadable_files(tmp_path: Path) -> None:
    f = tmp_path / "l.csv"
    _write(f)
    gz = tmp_path / "l.csv.gz"
    gz.write_bytes(gzip.compress(f.read_bytes()))
    assert linkstat.utilisation(gz) == linkstat.utilisation(f)
    for bad, why in (
        (tmp_path / "missing.csv", "FileNotFoundError"),
        (tmp_path / "x.csv", "KeyError"),
    ):
        if why == "KeyError":
            bad.write_text("time,dev\n1,w0\n")
        cmd = [sys.executable, "-m", "benchmarks.rack.linkstat", "--show", str(bad)]
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and str(bad) in out.stderr and why in out.stderr
        assert "Traceback" not in out.stderr


@pytest.mark.skipif(shutil.which("ip") is None, reason="needs iproute2's ip")
def test_sampling_says_when_the_sampler_failed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "s" / "l.csv"
    with linkstat.sampling("fastps-no-such-namespace", out, 5.0) as path:
        assert path == out and out.parent.is_dir()
        time.sleep(1.0)  # let `ip netns exec` fail on its own
    err = capsys.readouterr().err
    assert "fastps-no-such-namespace" in err and str(out) in err


def test_egress_bytes_counts_each_named_host_once() -> None:
    # /proc/net/dev's layout: two header lines, then rx bytes in field 1, tx bytes in field 9.
    def dev(w0: int, c0: int) -> str:
        head = "Inter-|   Receive |  Transmit\n face |bytes packets ...|bytes packets ...\n"
        rows = [f"    w0: {w0} 10 0 0 0 0 0 0 {w0 // 2} 5 0 0 0 0 0 0"]
        rows.append(f"    c0: {c0} 10 0 0 0 0 0 0 7 5 0 0 0 0 0 0")
        rows.append("    lo: 99 1 0 0 0 0 0 0 99 1 0 0 0 0 0 0")
        return head + "\n".join(rows) + "\n"

    before = linkstat._parse_dev(dev(1000, 500))
    after = linkstat._parse_dev(dev(4000, 2500))
    assert before["w0"] == (1000, 500)
    assert linkstat.egress_bytes(before, after, ["w0", "c0"]) == 3000 + 2000
    # A host missing on either side (a link set up during the run) counts nothing.
    assert linkstat.egress_bytes(before, after, ["w0", "w9"]) == 3000
