"""``hvd.SyncBatchNorm``: batch normalization over the whole global batch.

Each rank normalizes its slice of the batch with the mean and variance of every rank's
slice together, as one process would normalize the concatenated batch: small per-rank
batches (detection, segmentation) otherwise normalize with noisy statistics. The channel
sums travel in one differentiable ``allreduce`` (sum), so autograd's backward pass
allreduces the statistics' gradients too, and the input gradient equals one process's on
the whole batch. Running statistics are updated with the global mean and the unbiased
global variance, on every rank alike.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from hvdprof.torch.mpi_ops import (
    Sum,
    allreduce,
)
from hvdprof.torch.process_sets import check_process_set, global_process_set, size_of


class SyncBatchNorm(_BatchNorm):
    """Drop-in for ``torch.nn.BatchNorm1d/2d/3d`` (any input of at least 2 dimensions,
    channels second), synchronized across every rank in training mode."""

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        process_set: Any = global_process_set,
    ) -> None:
        check_process_set(process_set, "SyncBatchNorm")
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        if not self.training or size_of(self.process_set) == 1:
            return super().forward(input)
        momentum = self.momentum
        if self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if momentum is None:  # cumulative moving average
                momentum = 1.0 / float(self.num_batches_tracked)
        dims = [0, *range(2, input.dim())]
        count = torch.tensor(
            [float(input.numel() // input.size(1))], dtype=input.dtype, device=input.device
        )
        local = torch.cat([input.sum(dims), (input * input).sum(dims), count])
        total = allreduce(local, op=Sum, name=None, process_set=self.process_set)
        c = self.num_features
        n = total[2 * c]
        mean = total[:c] / n
        var = total[c : 2 * c] / n - mean * mean
        if self.track_running_stats and self.running_mean is not None:
            with torch.no_grad():
                unbiased = var * (n / (n - 1)) if float(n) > 1 else var
                self.running_mean.mul_(1 - momentum).add_(mean.detach(), alpha=momentum)
                self.running_var.mul_(1 - momentum).add_(unbiased.detach(), alpha=momentum)
        shape = [1, c] + [1] * (input.dim() - 2)
        out = (input - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out

    @classmethod
    def convert_sync_batchnorm(cls, module: torch.nn.Module) -> torch.nn.Module:
        """``module`` with every BatchNorm layer replaced by a SyncBatchNorm (weights and
        running statistics kept), as ``torch.nn.SyncBatchNorm.convert_sync_batchnorm``."""
        out = module
        if isinstance(module, _BatchNorm) and not isinstance(module, SyncBatchNorm):
            out = cls(
                module.num_features,
                module.eps,
                module.momentum,
                module.affine,
                module.track_running_stats,
            )
            if module.affine:
                with torch.no_grad():
                    out.weight.copy_(module.weight)
                    out.bias.copy_(module.bias)
            if module.track_running_stats:
                out.running_mean = module.running_mean
                out.running_var = module.running_var
                out.num_batches_tracked = module.num_batches_tracked
            out.train(module.training)
        for name, child in module.named_children():
            out.add_module(name, cls.convert_sync_batchnorm(child))
        return out


__all__ = ["SyncBatchNorm"]
