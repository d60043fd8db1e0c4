"""Sufficient-factor broadcasting (Poseidon, ATC'17 §3.2): the per-layer cost model.

A fully-connected layer y = W x (W is M×N) gets the gradient dW = sum_k g_k x_k^T over the
K rows of a batch (g_k: the output gradient, x_k: the input). Instead of pushing the dense
M×N gradient through the servers and pulling the sum back, every worker can send its K
factor rows (g_k, x_k) — K·(M+N) numbers — to all the others (an allgather), and each
rebuilds the summed gradient locally from all P·K rows. Which is cheaper depends on the
layer's shape, the rows per step and the number of workers; this module decides, the
framework plugins only capture the factors and rebuild (plugins/torch/sfb.py).

Bytes per worker and step, both directions together (the core's allgather sends each
worker's rows once and delivers the P-1 others' rows to it; a push_pull sends and receives
the whole tensor once):

    servers:             2 · M · N · itemsize
    sufficient factors:  P · K · (M + N) · itemsize

The servers carry the same ratio (a push_pull loads them with 2·P·M·N, the allgather with
P²·K·(M+N)), so the per-worker comparison decides for the whole job. Rebuilding costs
2·P·K·M·N flops on every worker; that is reported, not weighed: Poseidon's model is the
network's, and the flops are those of one local matrix product.

``FASTPS_SFB``: ``off`` (default: every layer through the servers), ``auto`` (each layer
the cheaper way), ``on`` (every eligible layer by sufficient factors).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

from fastps import config

__all__ = ["MODES", "LayerCost", "mode", "report"]

MODES = config.SFB_MODES


def mode(value: Optional[str] = None) -> str:
    """The SFB mode: ``value`` if given, else ``FASTPS_SFB`` (default ``off``), as
    :func:`fastps.config.sfb_mode` reads it (a ConfigError, also a ValueError, names a bad
    value)."""
    return config.sfb_mode(None if value is None else {"FASTPS_SFB": str(value)})


@dataclass(frozen=True)
class LayerCost:
    """One fully-connected layer's two ways of synchronising its weight gradient."""

    name: str
    rows: int  # M: output features
    cols: int  # N: input features
    batch: int  # K: factor rows per worker and exchange (batch × positions × passes)
    workers: int  # P
    itemsize: int

    def __post_init__(self) -> None:
        for field in ("rows", "cols", "workers", "itemsize"):
            if getattr(self, field) < 1:
                raise ValueError(f"layer '{self.name}': {field} must be >= 1")
        if self.batch < 0:
            raise ValueError(f"layer '{self.name}': batch must be >= 0, got {self.batch}")

    @property
    def server_bytes(self) -> int:
        """Push the dense gradient, pull the sum: bytes per worker and step."""
        return 2 * self.rows * self.cols * self.itemsize

    @property
    def factor_bytes(self) -> int:
        """Send own K factor rows once, receive the other P-1 workers' rows."""
        return self.workers * self.batch * (self.rows + self.cols) * self.itemsize

    @property
    def rebuild_flops(self) -> int:
        return 2 * self.workers * self.batch * self.rows * self.cols

    def use_factors(self, how: str) -> bool:
        """Whether this layer sends sufficient factors under mode ``how``."""
        if how == "on":
            return True
        if how == "off":
            return False
        return self.factor_bytes < self.server_bytes

    def describe(self, how: str) -> str:
        ratio = self.server_bytes / max(1, self.factor_bytes)
        choice = "sufficient factors" if self.use_factors(how) else "servers"
        return (
            f"{self.name}: {self.rows}x{self.cols}, {self.batch} rows x {self.workers} workers: "
            f"factors {_mb(self.factor_bytes)} vs servers {_mb(self.server_bytes)} per worker "
            f"({ratio:.1f}x), rebuild {self.rebuild_flops / 1e9:.2f} GFLOP -> {choice}"
        )


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB"


def report(layers: Sequence[LayerCost], how: str, skipped: Sequence[str] = ()) -> List[str]:
    """The start-up lines: the mode, each candidate layer's costs and choice, the layers
    that cannot use factors with the reason, and those no pass ran before the choice."""
    lines = [f"fastps SFB ({how}): {len(layers)} fully-connected layer(s) considered"]
    lines += [f"fastps SFB   {layer.describe(how)}" for layer in layers]
    lines += [f"fastps SFB   {why}" for why in skipped]
    unseen = [layer.name for layer in layers if layer.batch == 0]
    if unseen:
        lines.append(
            "fastps SFB   not run in the first forward pass, servers: " + ", ".join(unseen)
        )
    return lines
