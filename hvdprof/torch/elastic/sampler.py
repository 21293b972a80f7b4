"""``ElasticSampler``: shards a dataset over the ranks of the current generation and
remembers how much of this epoch the job has trained on, so a re-formed job neither
loses nor repeats committed samples.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch

from hvdprof.torch.mpi_ops import rank, size


class ElasticSampler(torch.utils.data.Sampler):
    """Like ``DistributedSampler``, but the shard is recomputed after every reset.

    Each epoch has one order of the whole dataset (shuffled with ``seed + epoch``), the
    same on every rank. The ranks deal the not-yet-processed tail of that order out
    round-robin, so after ``k`` batches of ``b`` samples on ``n`` ranks exactly the first
    ``k * b * n`` samples of the tail are done, whatever rank trained them. That count
    (not a list of indices, which would die with a killed rank) is what
    ``record_batch`` advances and ``TorchState`` commits; after a reset the new ranks
    deal out what is left. ``set_epoch`` starts a new epoch.
    """

    def __init__(self, dataset: Any, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0
        self.indices: list[int] = []
        self.remaining_indices: list[int] = []
        self.num_replicas = 1
        self.rank = 0
        self.num_samples = 0
        self.total_size = 0
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """A new epoch: every sample is available again, in a new order when shuffling."""
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """One batch of ``batch_size`` per rank has been trained (on every rank)."""
        self.processed_num = min(
            len(self.dataset), self.processed_num + batch_size * self.num_replicas
        )

    def get_indices(self, batch_idx: int, batch_size: int) -> list[int]:
        """This rank's dataset indices of batch ``batch_idx`` since the last reset."""
        start = batch_idx * batch_size
        return self.indices[start : min(start + batch_size, len(self.indices))]

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])
        self.processed_num = int(state["processed_num"])
        self.reset()

    def _order(self) -> list[int]:
        n = len(self.dataset)
        if not self.shuffle:
            return list(range(n))
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        return torch.randperm(n, generator=g).tolist()

    def reset(self) -> None:
        """Deal the rest of this epoch's order out over the current ranks."""
        try:
            self.num_replicas, self.rank = size(), rank()
        except ValueError:  # not initialized yet: behave as a single process
            self.num_replicas, self.rank = 1, 0
        self.remaining_indices = self._order()[self.processed_num :]
        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas
        order = list(self.remaining_indices)
        if order:  # pad by wrapping so every rank gets the same number of samples
            while len(order) < self.total_size:
                order += order[: self.total_size - len(order)]
        self.indices = order[self.rank : self.total_size : self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return self.num_samples
