"""Helpers built on the ops: broadcasting model and optimizer state, and Python objects."""

from __future__ import annotations

import collections.abc
import io
import pickle
from typing import Any

import torch

from hvdprof.torch.mpi_ops import (
    allgather,
    broadcast_,
    broadcast_async_,
    rank,
    synchronize,
)
from hvdprof.torch.process_sets import global_process_set


def broadcast_parameters(
    params: Any, root_rank: int, process_set: Any = global_process_set
) -> None:
    """Overwrite every rank's parameters with ``root_rank``'s, in place.

    ``params`` is a ``state_dict()``, ``named_parameters()`` or a list of (name, tensor).
    """
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, collections.abc.Iterable):
        items = list(params)
        for item in items:
            if not (isinstance(item, tuple) and len(item) == 2):
                raise ValueError("broadcast_parameters expects a dict or (name, tensor) pairs")
    else:
        raise ValueError(f"invalid params of type: {type(params).__name__}")
    handles = []
    copied = []  # (parameter, its contiguous copy): written back once the copy has arrived
    for name, p in items:
        if p is None:
            continue
        tensor = p.data if isinstance(p, torch.nn.Parameter) else p
        if not isinstance(tensor, torch.Tensor):
            continue
        if not tensor.is_contiguous():  # channels_last weights: an in-place op needs contiguous
            copied.append((tensor, tensor.contiguous()))
            tensor = copied[-1][1]
        handles.append(
            broadcast_async_(
                tensor, root_rank, name=f"broadcast.param.{name}", process_set=process_set
            )
        )
    for h in handles:
        synchronize(h)
    for original, received in copied:
        original.copy_(received)


def broadcast_object(
    obj: Any, root_rank: int = 0, name: str | None = None, process_set: Any = global_process_set
) -> Any:
    """``root_rank``'s object on every rank (pickled; the size travels first)."""
    base = name or type(obj).__name__
    if rank() == root_rank:
        buf = io.BytesIO()
        pickle.dump(obj, buf, protocol=pickle.HIGHEST_PROTOCOL)
        payload = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
        length = torch.tensor([payload.numel()], dtype=torch.int64)
    else:
        length = torch.zeros(1, dtype=torch.int64)
    broadcast_(length, root_rank, name=f"{base}.sz", process_set=process_set)
    if rank() != root_rank:
        payload = torch.empty(int(length.item()), dtype=torch.uint8)
    broadcast_(payload, root_rank, name=f"{base}.t", process_set=process_set)
    if rank() == root_rank:
        return obj
    return pickle.loads(payload.numpy().tobytes())


def allgather_object(
    obj: Any, name: str | None = None, process_set: Any = global_process_set
) -> list[Any]:
    """Every rank's object, in rank order."""
    base = name or type(obj).__name__
    payload = torch.frombuffer(
        bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)), dtype=torch.uint8
    )
    sizes = allgather(
        torch.tensor([payload.numel()], dtype=torch.int64),
        name=f"{base}.sz",
        process_set=process_set,
    )
    data = allgather(payload, name=f"{base}.t", process_set=process_set)
    out = []
    offset = 0
    for n in sizes.tolist():
        out.append(pickle.loads(data[offset : offset + n].numpy().tobytes()))
        offset += n
    assert len(out) == len(sizes)
    return out


def _initialize_state(optimizer: torch.optim.Optimizer) -> None:
    """Create the optimizer's state (momentum buffers, ...) before the first step, as
    Horovod does: a step on zero gradients for every parameter that requires one. A
    parameter without ``requires_grad`` keeps ``grad`` None. The wrapped optimizer's own
    ``step`` runs, never DistributedOptimizer's: that would allreduce, and deadlock unless
    every rank did the same."""
    sparse = isinstance(optimizer, torch.optim.SparseAdam)  # it refuses dense gradients
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)
                if sparse:
                    p.grad = p.grad.to_sparse()
    if hasattr(optimizer, "_allreduce_delay"):  # a DistributedOptimizer: its base's step
        super(optimizer.__class__, optimizer).step()
    else:
        optimizer.step()


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int) -> None:
    """Make every rank's optimizer state (buffers and hyper-parameters) equal root's."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    if not optimizer.state_dict()["state"]:
        _initialize_state(optimizer)
    state = broadcast_object(optimizer.state_dict(), root_rank, name="optimizer.state_dict")
    if rank() != root_rank:
        optimizer.load_state_dict(state)
