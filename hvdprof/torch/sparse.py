"""``sparse_allreduce_async``: Horovod's allreduce of a sparse (COO) tensor.

A sparse gradient (``nn.Embedding(sparse=True)``) touches a few rows, different ones on
every rank: reducing it dense would move the whole table. As Horovod does, every rank's
indices and values are allgathered instead, and the result is the sparse tensor holding
all of them (duplicate indices are summed when it is coalesced or applied). ``Average``
divides the values by the number of ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hvdprof.torch.mpi_ops import (
    Average,
    Sum,
    allgather_async,
    synchronize,
)
from hvdprof.torch.process_sets import check_process_set, global_process_set, size_of


def sparse_allreduce_async(
    tensor: torch.Tensor,
    name: str,
    op: int = Average,
    process_set: Any = global_process_set,
) -> Callable[[], torch.Tensor]:
    """Start the allreduce of a sparse tensor; returns a function that waits for it and
    gives the reduced sparse tensor (as Horovod's: call it, or ``hvd.synchronize`` it)."""
    check_process_set(process_set, "sparse_allreduce_async")
    ranks = size_of(process_set)
    if not tensor.is_sparse:
        raise ValueError(
            f"sparse_allreduce_async needs a sparse (COO) tensor, got layout {tensor.layout}; "
            "use allreduce_async for dense tensors"
        )
    if op not in (Average, Sum):
        raise ValueError("sparse_allreduce_async supports op=Average and op=Sum only")
    t = tensor.coalesce() if not tensor.is_coalesced() else tensor
    # allgather concatenates along the first dimension: indices go (nnz, ndim), not
    # (ndim, nnz), so that every rank's entries follow each other
    indices = allgather_async(
        t.indices().t().contiguous(), name=f"{name}.indices", process_set=process_set
    )
    values = allgather_async(
        t.values().contiguous(), name=f"{name}.values", process_set=process_set
    )

    def wait() -> torch.Tensor:
        all_values = synchronize(values)
        all_indices = synchronize(indices)
        if op == Average:
            all_values = all_values / ranks
        return torch.sparse_coo_tensor(
            all_indices.t(), all_values, t.size(), dtype=t.dtype, device=t.device
        )

    return wait


__all__ = ["sparse_allreduce_async"]
