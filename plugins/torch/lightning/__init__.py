"""fastps for Lightning: ``Trainer(strategy="fastps")``.

::

    import fastps.torch.lightning  # registers "fastps" with Lightning's StrategyRegistry
    trainer = lightning.Trainer(strategy="fastps", accelerator="cpu", devices=2)

(``import fastps.torch`` registers it too when ``lightning`` was imported first.)
``FastPSStrategy`` takes ``DistributedOptimizer``'s options:
``Trainer(strategy=FastPSStrategy(compression=hvd.Compression.fp16))``. For DDP on fastps
instead, ``DDPStrategy(process_group_backend="fastps")`` needs nothing from here.
"""

from __future__ import annotations

try:
    from lightning.pytorch.strategies import StrategyRegistry
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "fastps.torch.lightning needs the `lightning` package (pip install lightning)"
    ) from exc

from fastps.torch.lightning.environment import FastPSEnvironment
from fastps.torch.lightning.strategy import FastPSStrategy

__all__ = ["FastPSStrategy", "FastPSEnvironment", "register"]


def register() -> None:
    """Makes ``strategy="fastps"`` resolve (idempotent)."""
    if FastPSStrategy.strategy_name not in StrategyRegistry:
        FastPSStrategy.register_strategies(StrategyRegistry)


register()
