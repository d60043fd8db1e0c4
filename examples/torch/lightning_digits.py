"""Lightning on fastps: the digits model with Trainer(strategy="fastps").

python examples/torch/lightning_digits.py                        # Lightning starts 2
torchrun --standalone --nproc-per-node 2 examples/torch/lightning_digits.py
fastpsrun -np 2 python examples/torch/lightning_digits.py
"""

from __future__ import annotations

from typing import Any

import fastps.torch.lightning  # noqa: F401  (registers strategy="fastps")
import lightning as L
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, random_split


class Digits(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))

    def training_step(self, batch: Any, idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch: Any, idx: int) -> None:
        x, y = batch
        acc = (self.net(x).argmax(1) == y).float().mean()
        self.log("val_acc", acc, sync_dist=True)  # averaged over the ranks

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def main() -> None:
    L.seed_everything(0)
    x, y = load_digits(return_X_y=True)
    data = TensorDataset(torch.tensor(x, dtype=torch.float32) / 16, torch.tensor(y))
    train, val = random_split(data, [1437, 360], torch.Generator().manual_seed(0))
    trainer = L.Trainer(strategy="fastps", accelerator="cpu", devices=2, max_epochs=3)
    trainer.fit(
        Digits(), DataLoader(train, batch_size=32, shuffle=True), DataLoader(val, batch_size=64)
    )
    trainer.save_checkpoint("digits.ckpt")  # written once, by rank 0
    if trainer.is_global_zero:
        print(f"val_acc {float(trainer.callback_metrics['val_acc']):.3f}")


if __name__ == "__main__":
    main()
