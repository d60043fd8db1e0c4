"""Host discovery with real processes: a discovery script that fails or hangs is named, and
host updates reach a worker's notification thread through a real rendezvous service. The
elastic pieces that need no job: tests/unit/test_elastic_units.py."""

from __future__ import annotations

import pytest
from fastps.elastic.state import ObjectState
from fastps.errors import FastPSError
from fastps.launch import discovery


def test_discovery_script_failure_is_named(tmp_path):
    with pytest.raises(FastPSError, match="exited with code 3: boom"):
        discovery.discover("echo boom >&2; exit 3")
    with pytest.raises(FastPSError, match="ran longer than 0.5 s"):
        discovery.discover("sleep 5", timeout=0.5)


def test_watchers_hear_of_host_updates(monkeypatch):
    """A worker's notification thread, against a real rendezvous service: a worker added,
    then one removed, reach the registered state's queue as Horovod's flags."""
    import time

    from fastps.control import elastic_wire as wire
    from fastps.elastic import notifications
    from fastps.launch.elastic_driver import ElasticLauncher

    driver = ElasticLauncher(["true"], discovery_script="echo localhost:1", min_np=1, max_np=2)
    driver._open_service()
    monkeypatch.setenv(wire.ADDR_VAR, driver._service_addr)
    monkeypatch.setenv(wire.JOB_VAR, driver.job_id)
    monkeypatch.setenv("FASTPS_TOKEN", driver.token)
    state = ObjectState(bcast_object=lambda obj: obj, get_rank=lambda: 0)
    notifications.register_listener(state)
    try:
        got = []
        for added in (True, False):
            time.sleep(0.3)  # the watcher has its first answer and waits for news
            with driver.cond:
                driver._host_update(added=added)
            got.append(state._host_messages.get(timeout=10))
        assert got == [
            (1, notifications.HostUpdateResult.added),
            (2, notifications.HostUpdateResult.removed),
        ]
    finally:
        notifications.remove_listener(state)
        driver._service.close()
