"""Collectives on device tensors through a ``torch.distributed`` process group.

One class for the device path (``hvdprof/runtime/device_path.py``), whatever the group's
backend: NCCL for CUDA tensors, or Gloo when the device path is exercised on CPU
(``HVDPROF_DEVICE_PATH_ON_CPU``). It uses only the process-group calls both backends
have, so the CPU tests run the very calls a GPU job makes. ``wait()`` on an NCCL work
makes the caller's current stream wait for NCCL's stream; the host does not block.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from hvdprof.runtime.backends.base import DONE
from hvdprof.runtime.requests import ReduceOp

_OPS = {
    ReduceOp.SUM: dist.ReduceOp.SUM,
    ReduceOp.AVERAGE: dist.ReduceOp.SUM,  # the device path divides afterwards
    ReduceOp.MIN: dist.ReduceOp.MIN,
    ReduceOp.MAX: dist.ReduceOp.MAX,
    ReduceOp.PRODUCT: dist.ReduceOp.PRODUCT,
}
#: neither NCCL nor Gloo reduces int16: through int32 (same result modulo 2**16)
_WIDENED = {torch.int16: torch.int32}


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    rows = t.shape[0] if t.dim() else 1
    return t.reshape(rows, -1).view(torch.uint8)


class ProcessGroupCollectives:
    """The device path's backend: ``name`` is the timeline's prefix (``NCCL``, ``GLOO``)."""

    def __init__(self, pg: Any, rank: int, size: int, name: str) -> None:
        self.pg = pg
        self.rank = rank
        self.size = size
        self.name = name
        self._options: dict[ReduceOp, Any] = {}
        for op, native in _OPS.items():
            options = dist.AllreduceOptions()
            options.reduceOp = native
            self._options[op] = options

    def supports(self, tensor: torch.Tensor) -> bool:
        return True

    def allreduce_async(self, tensor: torch.Tensor, op: ReduceOp) -> Any:
        if self.size == 1:
            return DONE
        wide = _WIDENED.get(tensor.dtype)
        if wide is not None:
            work = tensor.to(wide)
            self.pg.allreduce([work], self._options[op]).wait()
            tensor.copy_(work)
            return DONE
        return self.pg.allreduce([tensor], self._options[op])

    def allgather(self, outputs: list[torch.Tensor], tensor: torch.Tensor) -> None:
        if self.size == 1:
            outputs[0].copy_(tensor)
            return
        if tensor.dtype in _WIDENED:
            outputs = [_as_bytes(o) for o in outputs]
            tensor = _as_bytes(tensor)
        self.pg.allgather([outputs], [tensor]).wait()

    def broadcast(self, tensor: torch.Tensor, root_rank: int) -> None:
        if self.size == 1:
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
        if self.size == 1:
            output.copy_(tensor)
            return
        if tensor.dtype in _WIDENED:
            output, tensor = _as_bytes(output), _as_bytes(tensor)
        self.pg.alltoall_base(
            output, tensor, output_splits, input_splits, dist.AllToAllOptions()
        ).wait()

    def close(self) -> None:
        pass
