"""The sufficient-factor cost model (core/collectives/sfb.py): bytes per layer and the choice
per mode."""

from __future__ import annotations

import pytest
from fastps.collectives import sfb


def test_vgg16_fc_layers_choose_factors_at_batch_32() -> None:
    # VGG-16's fc6: 4096x25088 weights, 32 rows per worker, 4 workers, float32.
    fc6 = sfb.LayerCost("fc6", 4096, 25088, 32, 4, 4)
    assert fc6.server_bytes == 2 * 4096 * 25088 * 4
    assert fc6.factor_bytes == 4 * 32 * (4096 + 25088) * 4
    assert fc6.server_bytes / fc6.factor_bytes > 40
    assert fc6.use_factors("auto") and fc6.use_factors("on") and not fc6.use_factors("off")
    assert fc6.rebuild_flops == 2 * 4 * 32 * 4096 * 25088


def test_many_rows_choose_the_servers() -> None:
    # A transformer FFN at batch 32 x 128 positions: 4096 rows per worker.
    ffn = sfb.LayerCost("ffn1", 4096, 1024, 32 * 128, 4, 4)
    assert ffn.factor_bytes > ffn.server_bytes
    assert not ffn.use_factors("auto")
    assert ffn.use_factors("on")
    # The break-even: P·K·(M+N) == 2·M·N.
    even = sfb.LayerCost("x", 100, 100, 10, 2, 4)  # 2·10·200 = 4000 < 2·10000
    assert even.use_factors("auto")
    assert not sfb.LayerCost("x", 100, 100, 50, 2, 4).use_factors("auto")  # 20000 == 20000


def test_mode_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FASTPS_SFB", raising=False)
    assert sfb.mode() == "off"
    monkeypatch.setenv("FASTPS_SFB", " Auto ")
    assert sfb.mode() == "auto"
    monkeypatch.setenv("FASTPS_SFB", "yes")
    with pytest.raises(ValueError, match="FASTPS_SFB='yes'"):
        sfb.mode()


def test_bad_layer_and_report() -> None:
    with pytest.raises(ValueError, match="layer 'w': rows"):
        sfb.LayerCost("w", 0, 3, 1, 2, 4)
    with pytest.raises(ValueError, match="batch must be >= 0"):
        sfb.LayerCost("w", 3, 3, -1, 2, 4)
    lines = sfb.report([sfb.LayerCost("fc", 4096, 4096, 32, 4, 4)], "auto", ["b: servers (x)"])
    assert lines[0].startswith("fastps SFB (auto): 1 fully-connected")
    assert "-> sufficient factors" in lines[1] and "fc: 4096x4096" in lines[1]
    assert lines[2].endswith("b: servers (x)")
