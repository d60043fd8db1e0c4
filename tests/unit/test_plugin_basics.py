"""The plugins' shared basics (``fastps.collectives.basics``) outside a session: the error a
who-am-I call raises before init, the cross-barrier policy (argument, FASTPS_CROSS_BARRIER,
the plugin's default) and the SFB decision's entry. Starts nothing."""

from __future__ import annotations

import warnings

import pytest
from fastps.collectives.basics import Basics, SfbChoice, sfb_choice
from fastps.errors import ConfigError, FastPSError


def test_rank_before_init_raises_the_plugins_error() -> None:
    torch_like = Basics("torch", uninitialized=ValueError)
    assert not torch_like.is_initialized()
    for call in (torch_like.rank, torch_like.size):
        with pytest.raises(ValueError, match="not been initialized; use hvd.init"):
            call()
    core_asked = Basics("tensorflow")
    for call in (core_asked.rank, core_asked.size, core_asked.local_rank, core_asked.num_servers):
        with pytest.raises(FastPSError, match="not initialized"):
            call()
    with pytest.raises(FastPSError, match=r"fastps\.mxnet\.init\(comm=\.\.\.\)"):
        Basics("mxnet").init(comm=object())


def test_cross_barrier_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    on, off = Basics("torch", cross_barrier_default=True), Basics("mxnet")
    monkeypatch.delenv("FASTPS_CROSS_BARRIER", raising=False)
    assert on.cross_barrier(None) and not off.cross_barrier(None)  # the plugins' defaults
    assert not Basics.cross_barrier_explicit(None) and Basics.cross_barrier_explicit(True)
    assert not on.cross_barrier(False) and off.cross_barrier(True)  # the argument wins
    monkeypatch.setenv("FASTPS_CROSS_BARRIER", "off")
    assert not on.cross_barrier(None) and not off.cross_barrier(None)
    monkeypatch.setenv("FASTPS_CROSS_BARRIER", " Yes ")
    assert on.cross_barrier(None) and off.cross_barrier(None)
    assert Basics.cross_barrier_explicit(None)
    monkeypatch.setenv("FASTPS_CROSS_BARRIER", "maybe")
    with pytest.raises(ConfigError, match="FASTPS_CROSS_BARRIER='maybe'"):
        off.cross_barrier(None)
    assert issubclass(ConfigError, ValueError)  # what the plugins raised before
    with pytest.raises(TypeError, match="cross_barrier"):
        on.cross_barrier(1)  # type: ignore[arg-type]


def test_sfb_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    model = object()
    monkeypatch.delenv("FASTPS_SFB", raising=False)
    assert sfb_choice("DistributedOptimizer", model, "nn.Linear layers") is None  # off
    monkeypatch.setenv("FASTPS_SFB", "auto")
    assert sfb_choice("X", model, "Dense layers", active=False) is None
    with pytest.warns(UserWarning, match=r"FASTPS_SFB=auto needs X\(model=\.\.\.\) to find"):
        assert sfb_choice("X", None, "Dense layers") is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sfb_choice("X", model, "Dense layers") == SfbChoice("auto", None)
    monkeypatch.setenv("FASTPS_SFB", "on")
    why = sfb_choice("X", model, "Dense layers", op="Adasum", elastic=True)
    assert why == SfbChoice("on", "the reduction op (Adasum) is not a sum of the gradients")
    first = sfb_choice("X", model, "Dense layers", compressed=True, asynchronous=True)
    assert first is not None and first.why_not == "gradient compression is on"
    monkeypatch.setenv("FASTPS_SFB", "yes")
    with pytest.raises(ValueError, match="FASTPS_SFB='yes'"):
        sfb_choice("X", model, "Dense layers")
