"""GPU activity: the typed table a trace with a GPU fills per rank, and what it says.

torch.profiler's reader (:mod:`hvdprof.trace.kineto_format`) fills :attr:`Run.gpu` with one
:class:`GpuActivity` per rank; the analyses read it (and ask :func:`kernel_arrivals`)
without knowing which reader filled it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from hvdprof.trace.model import PHASE_COLLECTIVE, PHASE_OP, Run

#: GPU activity kinds, as HTA names its kernel types
GPU_KINDS: tuple[str, ...] = ("computation", "communication", "memory", "other")
GPU_COMPUTE, GPU_COMM, GPU_MEMORY, GPU_OTHER = 0, 1, 2, 3
_NCCL_KERNEL = re.compile(r"nccl.*Kernel")


def gpu_kind(name: str) -> int:
    """HTA's kernel type of a GPU event (as HTA 0.5.0 classifies names): communication
    (starts ``nccl`` and has ``Kernel`` after it), memory (starts ``Memcpy``, ``Memset`` or
    ``dma``), other (``Memcpy`` or ``Sync`` elsewhere in the name), else computation."""
    if _NCCL_KERNEL.match(name):
        return GPU_COMM
    if name.startswith(("Memcpy", "Memset", "dma")):
        return GPU_MEMORY
    if "Memcpy" in name or "Sync" in name:
        return GPU_OTHER
    return GPU_COMPUTE


@dataclass
class GpuActivity:
    """One rank's GPU events (``stream`` set), on the run's clock."""

    start_us: np.ndarray
    dur_us: np.ndarray
    kind: np.ndarray  # GPU_KINDS code
    stream: np.ndarray
    #: what HTA counts by default: launched before the last ProfilerStep began
    in_hta: np.ndarray
    #: start and end as HTA reads them (whole microseconds when it rounds the file),
    #: on the file's own clock (shares do not depend on the shift)
    hta_start: np.ndarray
    hta_end: np.ndarray
    #: index into ``names`` of each event's name (kernel, ``Memcpy HtoD ...``)
    name: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    names: list[str] = field(default_factory=list)
    #: CUDA correlation id (-1: none): links the kernel to the runtime call that launched it
    correlation: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    #: start of that launch (``cudaLaunchKernel``...) on the CPU, run's clock (NaN: none)
    launch_us: np.ndarray = field(default_factory=lambda: np.zeros(0))
    #: bytes a memcpy or memset moved (-1: not recorded, or not a copy)
    nbytes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def shifted(self, by_us: float) -> GpuActivity:
        """The same events with start and launch moved by ``by_us`` (onto the run's clock);
        HTA's times stay on the file's own."""
        return GpuActivity(
            self.start_us + by_us, self.dur_us, self.kind, self.stream, self.in_hta,
            self.hta_start, self.hta_end, self.name, self.names, self.correlation,
            self.launch_us + by_us, self.nbytes,
        )  # fmt: skip


def kernel_rows(run: Run) -> np.ndarray | None:
    """Backend rows that are NCCL kernels, when every rank that launched collectives ran
    some (else None: arrivals are launches)."""
    s = run.slices
    coll = np.flatnonzero(s.phase == PHASE_COLLECTIVE)
    ops = np.flatnonzero(s.phase == PHASE_OP)
    if not len(coll) or not len(ops) or not run.names:
        return None
    comm = np.array([gpu_kind(n) == GPU_COMM for n in run.names] + [False], bool)
    code = s.name[coll].astype(np.int64)
    coll = coll[comm[np.where((code >= 0) & (code < len(run.names)), code, -1)]]
    if not len(coll) or set(np.unique(s.rank[ops]).tolist()) - set(
        np.unique(s.rank[coll]).tolist()
    ):
        return None
    return coll


def kernel_arrivals(run: Run) -> bool:
    """True when the run's arrivals are NCCL kernel starts (see
    :func:`hvdprof.trace.kineto_format._kernel_times`): readiness matched from the ranks'
    own traces, with NCCL kernels on every rank that launched collectives."""
    return run.capabilities.readiness_matched_across_files and kernel_rows(run) is not None
