"""transformers' Trainer on fastps: one line before TrainingArguments.

HF_HUB_OFFLINE=1 torchrun --standalone --nproc-per-node 2 examples/torch/hf_trainer_tiny_bert.py
"""

from __future__ import annotations

from typing import Dict

import torch
import torch.distributed as dist
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments


class Synthetic(torch.utils.data.Dataset):
    """Label 1 when the first token is from the upper half of the vocabulary."""

    def __init__(self, n: int = 640) -> None:
        self.ids = torch.randint(1, 64, (n, 16), generator=torch.Generator().manual_seed(0))
        self.labels = (self.ids[:, 0] >= 32).long()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> Dict[str, torch.Tensor]:
        ids = self.ids[i]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": self.labels[i]}


def main() -> None:
    dist.init_process_group("fastps")  # before Trainer/Accelerate create a gloo group
    config = BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=16, num_labels=2,
    )  # fmt: skip
    args = TrainingArguments(
        output_dir="hf-out", max_steps=20, per_device_train_batch_size=16, learning_rate=5e-3,
        use_cpu=True, report_to=[], save_strategy="no", logging_steps=5,
    )  # fmt: skip
    trainer = Trainer(
        model=BertForSequenceClassification(config), args=args, train_dataset=Synthetic()
    )
    trainer.train()
    print(f"rank {dist.get_rank()}: backend {dist.get_backend()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
