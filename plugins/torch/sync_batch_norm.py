"""``hvd.SyncBatchNorm``: batch normalization whose batch statistics span every rank.

In training, each rank's per-channel count, sum and sum of squares are summed over the
process set with the differentiable allreduce, so the mean and variance are those of the
global batch and the gradient flows back through the sums to every rank's inputs. In eval
mode (or without ``track_running_stats`` and outside training) it is plain batch norm.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from fastps.torch.ops import Sum, allreduce
from torch.nn.modules.batchnorm import _BatchNorm

__all__ = ["SyncBatchNorm"]


class SyncBatchNorm(_BatchNorm):
    """Drop-in for ``torch.nn.BatchNorm{1,2,3}d`` (any input of shape N x C x ...)."""

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: Optional[float] = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        process_set: Any = None,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        if not self.training:
            return F.batch_norm(
                input,
                self.running_mean,
                self.running_var,
                self.weight,
                self.bias,
                False,
                0.0,
                self.eps,
            )
        channels = input.shape[1]
        flat = input.transpose(0, 1).reshape(channels, -1)
        local = torch.cat(
            [
                torch.full((1,), float(flat.shape[1]), dtype=flat.dtype, device=flat.device),
                flat.sum(dim=1),
                (flat * flat).sum(dim=1),
            ]
        )
        total = allreduce(local, op=Sum, process_set=self.process_set)
        count = total[0]
        mean = total[1 : 1 + channels] / count
        var = total[1 + channels :] / count - mean * mean  # biased, as batch norm normalizes
        if (
            self.track_running_stats
            and self.running_mean is not None
            and self.running_var is not None
            and self.num_batches_tracked is not None
        ):
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                momentum = self.momentum
                if momentum is None:
                    momentum = 1.0 / float(self.num_batches_tracked)
                unbiased = var * count / torch.clamp(count - 1, min=1)
                self.running_mean.mul_(1 - momentum).add_(mean.detach() * momentum)
                self.running_var.mul_(1 - momentum).add_(unbiased.detach() * momentum)
        shape = [1, channels] + [1] * (input.dim() - 2)
        out = (input - mean.view(shape)) / torch.sqrt(var.view(shape) + self.eps)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out
