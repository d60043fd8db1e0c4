"""A Lightning digits model (scikit-learn's load_digits) trained by every rank of a job,
whatever started the job: Lightning itself (devices=2), torchrun, SLURM's variables or
fastpsrun. Each rank writes ``rank<R>.json`` into --out with what it saw.

    --strategy fastps | ddp-gloo | ddp-fastps-hook
    --load CKPT      after fit, a fresh model and Trainer validate the checkpoint CKPT
    --die R:S        rank R SIGKILLs itself before training step S; the survivors print
                     "SURVIVOR rank <r>: <error>" and exit 1
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Dict, List, Optional

import fastps.torch as hvd
import fastps.torch.lightning  # noqa: F401  (registers strategy="fastps")
import lightning as L
import torch
import torch.distributed as dist
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.strategies import DDPStrategy
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

VAL = 360  # the last 360 of a fixed shuffle of the 1797 digits


def datasets() -> tuple[TensorDataset, TensorDataset]:
    x, y = load_digits(return_X_y=True)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    xs = torch.tensor(x, dtype=torch.float32)[order] / 16.0
    ys = torch.tensor(y, dtype=torch.long)[order]
    return TensorDataset(xs[:-VAL], ys[:-VAL]), TensorDataset(xs[-VAL:], ys[-VAL:])


class Digits(L.LightningModule):
    def __init__(self, lr: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def _evaluate(self, batch: Any, prefix: str) -> None:
        x, y = batch
        acc = (self(x).argmax(1) == y).float().mean()
        self.log(f"{prefix}_acc", acc, sync_dist=True)
        # differs per rank: only a reduction across the ranks gives (0 + 1) / 2
        self.log(f"{prefix}_rank_mean", float(self.global_rank), sync_dist=True)

    def validation_step(self, batch: Any, idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: Any, idx: int) -> None:
        self._evaluate(batch, "test")

    def predict_step(self, batch: Any, idx: int) -> torch.Tensor:
        return self(batch[0]).argmax(1)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


class RecordingIO(TorchCheckpointIO):
    """Writes checkpoints as Lightning does, and notes which rank wrote each."""

    def __init__(self, out: Path) -> None:
        super().__init__()
        self.out = out

    def save_checkpoint(
        self, checkpoint: Dict[str, Any], path: Any, storage_options: Any = None
    ) -> None:
        super().save_checkpoint(checkpoint, path, storage_options)
        with open(self.out / "saves.log", "a") as f:
            f.write(f"{os.environ.get('FASTPS_TEST_RANK', '?')} {path}\n")


class Die(L.Callback):
    def __init__(self, rank: int, step: int) -> None:
        self.rank, self.step = rank, step

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_rank == self.rank and trainer.global_step == self.step:
            print(f"rank {self.rank}: SIGKILL at step {self.step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


def strategy(name: str) -> Any:
    if name == "fastps":
        return "fastps"
    if name == "ddp-gloo":
        return DDPStrategy(process_group_backend="gloo")
    if name == "ddp-fastps-hook":
        return DDPStrategy(process_group_backend="fastps", ddp_comm_hook=hvd.ddp_comm_hook())
    raise SystemExit(f"unknown --strategy {name!r}")


def trainer(args: argparse.Namespace, out: Path, callbacks: List[Any], **kw: Any) -> L.Trainer:
    return L.Trainer(
        strategy=strategy(args.strategy),
        accelerator="cpu",
        devices=2,
        max_epochs=args.epochs,
        callbacks=callbacks,
        plugins=[RecordingIO(out)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(out),
        **kw,
    )


def metrics(t: L.Trainer) -> Dict[str, float]:
    return {k: float(v) for k, v in t.callback_metrics.items()}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--strategy", default="fastps")
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--load", default=None)
    p.add_argument("--die", default=None)
    args = p.parse_args()
    out = Path(args.out)
    torch.set_num_threads(1)
    L.seed_everything(0, verbose=False)
    train, val = datasets()
    train_dl = DataLoader(train, batch_size=32, shuffle=True)
    val_dl = DataLoader(val, batch_size=64)
    callbacks: List[Any] = []
    if args.die:
        r, s = args.die.split(":")
        callbacks.append(Die(int(r), int(s)))
    model = Digits()
    t = trainer(args, out, callbacks)
    rank: Optional[int] = None
    t0 = time.monotonic()
    try:
        t.fit(model, train_dl, val_dl)
    except BaseException as exc:  # noqa: BLE001 - reported, then the process fails
        rank = t.global_rank
        print(
            f"SURVIVOR rank {rank}: {type(exc).__name__} after {time.monotonic() - t0:.1f} s: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}",
            flush=True,
        )
        traceback.print_exc()
        return 1
    rank = t.global_rank
    os.environ["FASTPS_TEST_RANK"] = str(rank)
    report: Dict[str, Any] = {
        "rank": rank,
        "world_size": t.world_size,
        "strategy": type(t.strategy).__name__,
        "environment": type(t.strategy.cluster_environment).__name__,
        "backend": dist.get_backend(),
        "hvd_size": hvd.size() if hvd.is_initialized() else None,
        "fit": metrics(t),
        "weights": [float(w.double().sum()) for w in model.parameters()],
        "optimizer": type(t.optimizers[0]).__mro__[1].__module__,
    }
    report["validate"] = t.validate(model, val_dl, verbose=False)[0]
    report["test"] = t.test(model, val_dl, verbose=False)[0]
    preds = t.predict(model, val_dl)
    report["predicted"] = sum(int(x.numel()) for x in preds)
    ckpt = out / "digits.ckpt"
    t.save_checkpoint(ckpt)
    t.strategy.barrier()
    if args.load:
        fresh = trainer(args, out, [])
        report["loaded"] = fresh.validate(Digits(), val_dl, ckpt_path=args.load, verbose=False)[0]
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    print(f"rank {rank} done: {report['validate']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
