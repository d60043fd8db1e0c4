"""A tiny BERT (from a BertConfig: nothing downloaded) trained for 20 steps on a synthetic
classification set, first by transformers' Trainer, then by a plain Accelerate loop, in one
torchrun job. With ``--backend fastps`` the default process group is created on fastps
before Trainer/Accelerate look for one (they then use it); with ``--backend gloo`` they
create their own, as they do on CPU. Each rank saves ``<mode>_rank<R>.pt``: its parameters
after training, its losses, and the process group's backend."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Dict, List

import torch
import torch.distributed as dist

STEPS = 20
SEQ = 16
LR = 5e-3


class Synthetic(torch.utils.data.Dataset):
    """Label 1 when the first token is from the upper half of the vocabulary; 640 rows:
    20 batches of 16 for each of 2 ranks."""

    def __init__(self, n: int = 640, vocab: int = 64) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1, vocab, (n, SEQ), generator=g)
        self.labels = (self.ids[:, 0] >= vocab // 2).long()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> Dict[str, torch.Tensor]:
        ids = self.ids[i]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": self.labels[i]}


def model() -> Any:
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=SEQ, num_labels=2,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    return BertForSequenceClassification(cfg)


def flat(m: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).double() for p in m.parameters()])


def with_trainer(out: Path) -> Dict[str, Any]:
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(
        output_dir=str(out / "trainer"), max_steps=STEPS, per_device_train_batch_size=16,
        learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, logging_steps=1,
        save_strategy="no", report_to=[], use_cpu=True, seed=0, disable_tqdm=True,
        dataloader_num_workers=0,
    )  # fmt: skip
    m = model()
    trainer = Trainer(model=m, args=args, train_dataset=Synthetic())
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return {"params": flat(m), "losses": losses}


def with_accelerate(out: Path) -> Dict[str, Any]:
    from accelerate import Accelerator

    acc = Accelerator(cpu=True)
    m = model()
    opt = torch.optim.AdamW(m.parameters(), lr=LR)
    loader = torch.utils.data.DataLoader(Synthetic(), batch_size=16, shuffle=False)
    m, opt, loader = acc.prepare(m, opt, loader)
    losses: List[float] = []
    batches = iter(loader)
    for _ in range(STEPS):
        batch = next(batches)
        loss = m(**batch).loss
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(float(acc.reduce(loss.detach(), "mean")))
    return {"params": flat(acc.unwrap_model(m)), "losses": losses}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--backend", choices=["fastps", "gloo"], required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    out = Path(args.out)
    torch.set_num_threads(1)
    if args.backend == "fastps":
        dist.init_process_group("fastps")  # the one line: before Trainer/Accelerate
    rank = int(os.environ["RANK"])
    for mode, run in (("trainer", with_trainer), ("accelerate", with_accelerate)):
        result = run(out)
        result["backend"] = dist.get_backend()
        result["world_size"] = dist.get_world_size()
        torch.save(result, out / f"{mode}_rank{rank}.pt")
        print(f"rank {rank} {mode}: losses {result['losses'][0]:.4f} -> {result['losses'][-1]:.4f}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
