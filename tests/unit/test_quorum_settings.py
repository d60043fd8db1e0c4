"""Quorum rounds' settings (FASTPS_ROUND_QUORUM, FASTPS_QUORUM_HISTORY, docs/guide/async.md):
parsed, and refused by name when they cannot hold. Quorum rounds in real jobs:
tests/integration/test_quorum.py."""

from __future__ import annotations

import pytest


def test_quorum_and_async_settings_are_parsed_and_refused_by_name() -> None:
    from fastps.config import Config
    from fastps.errors import FastPSError

    cfg = Config.from_env({"FASTPS_ROUND_QUORUM": "3", "FASTPS_NUM_WORKERS": "4"})
    assert (cfg.round_quorum, cfg.round_quorum_fraction) == (3, 0.0)
    cfg = Config.from_env({"FASTPS_ROUND_QUORUM": "0.75", "FASTPS_STALENESS": "2"})
    assert (cfg.round_quorum, cfg.round_quorum_fraction, cfg.staleness) == (0, 0.75, 2)
    assert Config.from_env({}).staleness == -1 and Config.from_env({}).mode == "sync"
    for var, value in [
        ("FASTPS_ROUND_QUORUM", "0"),
        ("FASTPS_ROUND_QUORUM", "1.5"),
        ("FASTPS_ROUND_QUORUM", "three"),
        ("FASTPS_MODE", "lockstep"),
        ("FASTPS_STALENESS", "-2"),
        ("FASTPS_QUORUM_HISTORY", "0"),
    ]:
        with pytest.raises(FastPSError, match=var):
            Config.from_env({var: value})


def test_servers_refuse_a_quorum_above_the_workers() -> None:
    from fastps import _core
    from fastps.config import Config
    from fastps.control.server import server_options

    cfg = Config.from_env(
        {"FASTPS_ROLE": "server", "FASTPS_NUM_WORKERS": "2", "FASTPS_ROUND_QUORUM": "3"}
    )
    with pytest.raises(ValueError, match="round_quorum = 3: exceeds the job's 2 workers"):
        _core.Server(server_options(cfg))
