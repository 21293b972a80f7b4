"""The interface every collective backend implements."""

from __future__ import annotations

from typing import Protocol

import torch

from hvdprof.runtime.requests import ReduceOp


class Work(Protocol):
    """An in-flight collective; ``wait`` blocks until its output is ready."""

    def wait(self) -> object: ...


class Finished:
    """A collective that completed inside the call that started it (size 1, sockets,
    shared memory): its ``wait`` has nothing left to wait for."""

    def wait(self) -> bool:
        return True


#: the one instance every backend returns for such calls
DONE = Finished()


class CollectiveBackend(Protocol):
    #: activity prefix on the timeline: GLOO, MPI, NCCL
    name: str

    def supports(self, tensor: torch.Tensor) -> bool:
        """Whether this backend can move ``tensor`` (device and dtype)."""
        ...

    def allreduce_async(self, tensor: torch.Tensor, op: ReduceOp) -> Work:
        """Reduce ``tensor`` in place across ranks. AVERAGE arrives here as SUM."""
        ...

    def allgather(self, outputs: list[torch.Tensor], tensor: torch.Tensor) -> None:
        """Every rank's equally sized ``tensor`` into ``outputs[rank]``."""
        ...

    def broadcast(self, tensor: torch.Tensor, root_rank: int) -> None: ...

    def alltoall(
        self,
        output: torch.Tensor,
        tensor: torch.Tensor,
        output_splits: list[int],
        input_splits: list[int],
    ) -> None: ...

    def close(self) -> None: ...
