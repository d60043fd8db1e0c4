"""Link-rate detection for pacing (core/control/linkspeed.py, FASTPS_LINK_MBIT=auto).

The tc parser is checked on the text tc prints for the shapers it must read; the whole
detection runs for real inside an emulated rack host (root only) in
tests/rack/test_linkspeed_emulated.py.
"""

from __future__ import annotations

import pytest
from fastps.config import Config
from fastps.control import linkspeed
from fastps.errors import FastPSError

HTB_QDISC = (
    "qdisc htb 1: root refcnt 3 r2q 10 default 0x1 direct_packets_stat 0 direct_qlen 1000\n"
    "qdisc pfifo 10: parent 1:1 limit 1000p\n"
)
HTB_CLASSES = (
    "class htb 1:1 root leaf 10: prio 0 rate 2500Mbit ceil 2500Mbit burst 1375b cburst 1375b\n"
    "class htb 1:2 root prio 0 rate 100Mbit ceil 100Mbit burst 1600b cburst 1600b\n"
)


def test_htb_default_class_ceiling() -> None:
    assert linkspeed.parse_tc_rate(HTB_QDISC, HTB_CLASSES) == pytest.approx(2500.0)
    # The ceiling, not the guaranteed rate, is what unclassified traffic may use.
    borrow = "class htb 1:1 root prio 0 rate 100Mbit ceil 1Gbit burst 1600b cburst 1600b\n"
    assert linkspeed.parse_tc_rate(HTB_QDISC, borrow) == pytest.approx(1000.0)
    # Traffic goes to class 1:2 when that is the default.
    other = HTB_QDISC.replace("default 0x1", "default 0x2")
    assert linkspeed.parse_tc_rate(other, HTB_CLASSES) == pytest.approx(100.0)
    # No class for the default: no cap known.
    assert linkspeed.parse_tc_rate(HTB_QDISC, "") is None


def test_tbf_netem_and_units() -> None:
    tbf = "qdisc tbf 8001: root refcnt 2 rate 40Mbit burst 32Kb lat 50ms\n"
    assert linkspeed.parse_tc_rate(tbf, "") == pytest.approx(40.0)
    netem = "qdisc netem 8002: root refcnt 2 limit 1000 delay 1ms rate 1Gbit\n"
    assert linkspeed.parse_tc_rate(netem, "") == pytest.approx(1000.0)
    bytes_unit = "qdisc tbf 8001: root refcnt 2 rate 125Mbps burst 32Kb lat 50ms\n"
    assert linkspeed.parse_tc_rate(bytes_unit, "") == pytest.approx(1000.0)
    # A shaper below the root (on one class only) says nothing about the whole link.
    child = "qdisc htb 1: root refcnt 2\nqdisc tbf 20: parent 1:5 rate 5Mbit burst 4Kb\n"
    assert linkspeed.parse_tc_rate(child, "") is None


def test_no_shaper() -> None:
    plain = "qdisc noqueue 0: root refcnt 2\n"
    assert linkspeed.parse_tc_rate(plain, "") is None
    fq = "qdisc fq_codel 0: root refcnt 2 limit 10240p flows 1024 quantum 1514\n"
    assert linkspeed.parse_tc_rate(fq, "") is None


def test_loopback_and_unknown_addresses_are_not_paced() -> None:
    assert linkspeed.detect_link_mbit("127.0.0.1")[0] == 0.0
    mbit, why = linkspeed.detect_link_mbit("198.19.254.254")  # no interface holds it
    assert mbit == 0.0 and "198.19.254.254" in why
    assert linkspeed.link_mbit_for(40.0, "127.0.0.1") == (40.0, "FASTPS_LINK_MBIT")
    assert linkspeed.link_mbit_for(0.0, "198.18.1.1")[0] == 0.0


def test_config_link_mbit() -> None:
    assert Config.from_env({}).link_mbit is None  # auto
    assert Config.from_env({"FASTPS_LINK_MBIT": "auto"}).link_mbit is None
    assert Config.from_env({"FASTPS_LINK_MBIT": "AUTO"}).link_mbit is None
    assert Config.from_env({"FASTPS_LINK_MBIT": "0"}).link_mbit == 0.0
    assert Config.from_env({"FASTPS_LINK_MBIT": "2500"}).link_mbit == 2500.0
    with pytest.raises(FastPSError, match="FASTPS_LINK_MBIT"):
        Config.from_env({"FASTPS_LINK_MBIT": "fast"})
