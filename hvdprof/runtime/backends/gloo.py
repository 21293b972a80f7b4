"""Gloo through torch.distributed, for CPU tensors.

Uses a ``ProcessGroupGloo`` of our own rather than the default group, so a user's own
``torch.distributed`` set-up is left alone, and skips the Python wrappers on the hot path.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from hvdprof.runtime.backends.base import DONE
from hvdprof.runtime.dtypes import ITEMSIZE, torch_attr
from hvdprof.runtime.requests import ReduceOp

_OPS = {
    ReduceOp.SUM: dist.ReduceOp.SUM,
    ReduceOp.AVERAGE: dist.ReduceOp.SUM,
    ReduceOp.MIN: dist.ReduceOp.MIN,
    ReduceOp.MAX: dist.ReduceOp.MAX,
    ReduceOp.PRODUCT: dist.ReduceOp.PRODUCT,
}

SUPPORTED_DTYPES = frozenset(getattr(torch, torch_attr(name)) for name in ITEMSIZE)
#: dtypes in our table that Gloo itself refuses ("Invalid scalar type"): reductions go
#: through a wider integer (every op gives the same result modulo 2**16), data movement
#: through a byte view of the same memory.
_WIDENED = {torch.int16: torch.int32}


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """``t`` (contiguous) as uint8 rows: same first dimension, same memory."""
    rows = t.shape[0] if t.dim() else 1
    per_row = 1
    for d in t.shape[1:]:
        per_row *= d
    return t.view(rows, per_row).view(torch.uint8)


class GlooBackend:
    name = "GLOO"

    def __init__(self, pg: dist.ProcessGroup, rank: int, size: int) -> None:
        self.pg = pg
        self.rank = rank
        self.size = size
        #: one rank: every collective is the identity, and the group is not called
        self.identity = size == 1
        self._options: dict[ReduceOp, dist.AllreduceOptions] = {}
        for op, native in _OPS.items():
            options = dist.AllreduceOptions()
            options.reduceOp = native
            self._options[op] = options

    def supports(self, tensor: torch.Tensor) -> bool:
        return tensor.device.type == "cpu" and tensor.dtype in SUPPORTED_DTYPES

    def allreduce_async(self, tensor: torch.Tensor, op: ReduceOp):
        if self.identity:
            return DONE
        wide = _WIDENED.get(tensor.dtype)
        if wide is not None:
            work = tensor.to(wide)
            self.pg.allreduce([work], self._options[op]).wait()
            tensor.copy_(work)
            return DONE
        return self.pg.allreduce([tensor], self._options[op])

    def allgather(self, outputs: list[torch.Tensor], tensor: torch.Tensor) -> None:
        if self.identity:
            outputs[0].copy_(tensor)
            return
        if tensor.dtype in _WIDENED:
            outputs = [_as_bytes(o) for o in outputs]
            tensor = _as_bytes(tensor)
        self.pg.allgather([outputs], [tensor]).wait()

    def broadcast(self, tensor: torch.Tensor, root_rank: int) -> None:
        if self.identity:
            return
        if tensor.dtype in _WIDENED:
            tensor = _as_bytes(tensor)
        options = dist.BroadcastOptions()
        options.rootRank = root_rank
        self.pg.broadcast([tensor], options).wait()

    def alltoall(
        self,
        output: torch.Tensor,
        tensor: torch.Tensor,
        output_splits: list[int],
        input_splits: list[int],
    ) -> None:
        if self.identity:
            output.copy_(tensor)
            return
        if tensor.dtype in _WIDENED:  # splits count rows: byte rows keep them
            output, tensor = _as_bytes(output), _as_bytes(tensor)
        self.pg.alltoall_base(
            output, tensor, output_splits, input_splits, dist.AllToAllOptions()
        ).wait()

    def reducescatter(
        self, output: torch.Tensor, tensor: torch.Tensor, op: ReduceOp, rows: list[int]
    ) -> None:
        """Rank r receives the reduction of rows ``rows[r]`` of every rank's ``tensor``
        into ``output``: the process group's reduce_scatter, which moves about half of
        what an allreduce would (the allreduce-then-slice it replaces reduced every row
        on every rank)."""
        if self.identity:
            output.copy_(tensor)
            return
        wide = _WIDENED.get(tensor.dtype)
        src = tensor.to(wide) if wide is not None else tensor.contiguous()
        dst = (
            torch.empty(output.shape, dtype=src.dtype, device=src.device)
            if wide is not None
            else output
        )
        options = dist.ReduceScatterOptions()
        options.reduceOp = _OPS[op]
        self.pg.reduce_scatter([dst], [list(src.split(rows))], options).wait()
        if dst is not output:
            output.copy_(dst)

    def close(self) -> None:
        pass
