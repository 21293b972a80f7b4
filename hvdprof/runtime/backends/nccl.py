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

from hvdprof.runtime.backends.gloo import GlooBackend


class ProcessGroupCollectives(GlooBackend):
    """The device path's backend: Gloo's calls, which NCCL's group has too (int16 widened
    the same way, byte views for data movement); ``name`` is the timeline's prefix
    (``NCCL``, ``GLOO``), and every device's tensors are accepted."""

    def __init__(self, pg: Any, rank: int, size: int, name: str) -> None:
        super().__init__(pg, rank, size)
        self.name = name
        # the group is called at one rank too: a 1-GPU job's timeline then holds the
        # device's real NCCL phases, which benchmarks/gpu_check.py times
        self.identity = False

    def supports(self, tensor: torch.Tensor) -> bool:
        return True
