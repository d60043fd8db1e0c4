"""The typed boundary between Python and the C++ core (csrc/bindings/module.cc).

Options go by field name and come only from Config; unset or bad fields are refused by
name; core errors arrive as fastps.errors types; the stub matches the module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from fastps import _core
from fastps.config import Config
from fastps.control.server import server_options
from fastps.errors import FastPSAbort, FastPSError, FastPSTimeoutError
from fastps.worker.api import worker_options

STUB = Path(__file__).resolve().parents[2] / "core" / "_core.pyi"


def test_core_errors_are_the_public_error_types() -> None:
    assert issubclass(_core.CoreError, FastPSError)
    assert issubclass(_core.CoreTimeoutError, FastPSTimeoutError)
    assert issubclass(_core.CoreAbort, FastPSAbort)
    assert not issubclass(_core.CoreTimeoutError, FastPSAbort)


def test_worker_options_come_from_config_field_by_field() -> None:
    cfg = Config(
        rank=1,
        num_workers=3,
        job_id="j",
        token="t",
        window_bytes=12345,
        fusion_threshold=4321,
        notsent_lowat=777,
        pacing_burst_bytes=333,
        conns_per_server=2,
        timeout=7.5,
        shm=False,
        shm_bytes=1 << 20,
        partition_bytes=64 << 10,
        credit_bytes=32 << 10,
    )
    o = worker_options(
        cfg,
        ["a", "b"],
        servers=["h:1", "h:2"],
        server_weights=[1, 3],
        pacing_bytes_per_s=[0, 5e6],
        pacing_burst_bytes_per_s=1.25e7,
        local_ranks=[1],
        local_servers=[False, True],
        num_hosts=2,
    )
    assert (o.rank, o.num_workers, o.job_id, o.token) == (1, 3, "j", "t")
    assert (o.partition_bytes, o.credit_bytes) == (64 << 10, 32 << 10)
    assert (o.window_bytes, o.notsent_lowat, o.conns_per_server) == (12345, 777, 2)
    assert o.fusion_threshold == 4321
    assert (o.connect_timeout_s, o.shm, o.shm_bytes) == (7.5, False, 1 << 20)
    assert o.servers == ("h:1", "h:2") and o.server_weights == (1.0, 3.0)
    assert o.pacing_bytes_per_s == (0.0, 5e6) and o.local_ranks == (1,)
    assert (o.pacing_burst_bytes, o.pacing_burst_bytes_per_s) == (333, 1.25e7)
    assert o.local_servers == (False, True) and o.num_hosts == 2


def test_server_options_come_from_config() -> None:
    cfg = Config(
        role="server",
        server_id=1,
        num_servers=2,
        num_workers=4,
        job_id="j",
        token="t",
        host="127.0.0.2",
        server_port=4321,
        engine_threads=3,
        io_threads=2,
        handshake_timeout=2.5,
    )
    o = server_options(cfg)
    assert (o.server_id, o.num_workers, o.job_id, o.token) == (1, 4, "j", "t")
    assert (o.host, o.port, o.engine_threads, o.io_threads) == ("127.0.0.2", 4321, 3, 2)
    assert o.handshake_timeout_s == 2.5


def test_unset_options_are_refused_by_name() -> None:
    # The C++ structs hold no defaults of their own: a field nobody set is an error.
    with pytest.raises(ValueError, match=r"WorkerOptions\.num_workers = 0"):
        _core.Worker(_core.WorkerOptions())
    o = worker_options(Config(num_workers=2), ["a"], servers=["127.0.0.1:1"])
    o.connect_timeout_s = 0
    with pytest.raises(ValueError, match=r"WorkerOptions\.connect_timeout_s"):
        _core.Worker(o)
    o = worker_options(Config(num_workers=2), ["a"], servers=["127.0.0.1:1"])
    o.rank = 2
    with pytest.raises(ValueError, match=r"WorkerOptions\.rank = 2: must be < num_workers \(2\)"):
        _core.Worker(o)
    s = server_options(Config(role="server"))
    s.engine_threads = -1
    with pytest.raises(ValueError, match=r"ServerOptions\.engine_threads = -1: must be >= 0"):
        _core.Server(s)


def test_misspelt_fields_and_list_edits_fail_loudly() -> None:
    o = _core.WorkerOptions()
    with pytest.raises(AttributeError):
        o.partiton_bytes = 1  # type: ignore[attr-defined]
    o.servers = ["a:1"]
    with pytest.raises(AttributeError):
        o.servers.append("b:2")  # type: ignore[attr-defined]
    assert o.servers == ("a:1",)


def test_connect_timeout_is_a_timeout_error() -> None:
    # Nothing listens on port 1: the connect retries until the timeout, then says so.
    o = worker_options(Config(num_workers=2, timeout=0.3), ["a"], servers=["127.0.0.1:1"])
    w = _core.Worker(o)
    with pytest.raises(FastPSTimeoutError, match=r"cannot connect to 127\.0\.0\.1:1 within"):
        w.start()
    w.shutdown()


def _stub_names() -> set:
    tree = ast.parse(STUB.read_text())
    names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    # Module constants (``NAME: int``).
    names |= {
        n.target.id
        for n in tree.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }
    return names


def test_stub_lists_what_the_module_exports() -> None:
    exported = {n for n in dir(_core) if not n.startswith("_")}
    assert _stub_names() == exported
    for cls in ("Worker", "Server", "WorkerOptions", "ServerOptions"):
        tree = ast.parse(STUB.read_text())
        node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
        in_stub = {s.name for s in node.body if isinstance(s, ast.FunctionDef)}
        in_stub |= {
            s.target.id
            for s in node.body
            if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
        }
        in_module = {n for n in dir(getattr(_core, cls)) if not n.startswith("_")}
        assert in_stub - {"__init__"} == in_module, cls
