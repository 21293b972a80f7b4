"""Q: how busy is each rank's GPU? HTA's temporal breakdown and comm/comp overlap.

Defined exactly as Holistic Trace Analysis (HTA) defines them, so users can move from
HTA and check us against it, from the GPU activity a Kineto trace records (every event
with a ``stream``: kernels, memcpy, memset), each classified as HTA does: communication
(name starts with ``nccl``), memory (``Memcpy``/``Memset`` in it), else computation.

- span: from the start of the rank's first GPU event to the end of its last;
- ``idle_share``: the part of the span with no GPU event running (any stream);
- ``compute_share``: the union of computation kernels over the span;
- ``non_compute_share``: the rest (communication and memory not under computation);
- ``comm_comp_overlap_share``: the part of the union of communication kernels during
  which a computation kernel also runs, over that union (HTA's
  ``get_comm_comp_overlap``; its denominator is communication time, not the span).

All shares are fractions (0-1); HTA prints the same as percentages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hvdprof.analysis.intervals import intersection_length, merge
from hvdprof.analysis.model import Run


@dataclass
class RankGpu:
    rank: int
    span_ms: float
    idle_share: float
    compute_share: float
    non_compute_share: float
    comm_comp_overlap_share: float
    kernels: int  # GPU events counted
    comm_ms: float  # union of communication kernels

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "span_ms": self.span_ms,
            "idle_share": self.idle_share,
            "compute_share": self.compute_share,
            "non_compute_share": self.non_compute_share,
            "comm_comp_overlap_share": self.comm_comp_overlap_share,
            "kernels": self.kernels,
            "comm_ms": self.comm_ms,
        }


@dataclass
class GpuReport:
    """Per rank with GPU activity; empty for runs without a GPU (CPU jobs, hvdprof's own)."""

    ranks: list[RankGpu] = field(default_factory=list)
    verdict: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "ranks": [r.to_dict() for r in self.ranks],
            "definition": "HTA get_temporal_breakdown / get_comm_comp_overlap, as fractions",
            "verdict": self.verdict,
        }


def _union(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    if not len(start):
        return start, end, 0.0
    s, e = merge(start, end)
    return s, e, float((e - s).sum())


def rank_gpu(rank: int, start: np.ndarray, dur: np.ndarray, kind: np.ndarray) -> RankGpu | None:
    """HTA's numbers for one rank's GPU events (``kind``: 0 compute, 1 comm, 2 memory)."""
    if not len(start):
        return None
    end = start + dur
    _, _, busy = _union(start, end)
    span = float(end.max() - start.min())
    comp = kind == 0
    comm = kind == 1
    _, _, compute = _union(start[comp], end[comp])
    _, _, comm_time = _union(start[comm], end[comm])
    overlap = (
        intersection_length(start[comm], end[comm], start[comp], end[comp])
        if comm.any() and comp.any()
        else 0.0
    )
    idle = span - busy
    share = (lambda x: x / span) if span > 0 else (lambda x: 0.0)
    return RankGpu(
        rank=rank,
        span_ms=span / 1000.0,
        idle_share=share(idle),
        compute_share=share(compute),
        non_compute_share=share(busy - compute),
        comm_comp_overlap_share=overlap / comm_time if comm_time > 0 else 0.0,
        kernels=len(start),
        comm_ms=comm_time / 1000.0,
    )


def gpu_report(run: Run) -> GpuReport:
    """HTA's temporal breakdown and comm/comp overlap for every rank with GPU activity."""
    out = GpuReport()
    for rank in sorted(run.gpu):
        g = run.gpu[rank]
        m = g.in_hta
        found = rank_gpu(rank, g.start_us[m], g.dur_us[m], g.kind[m])
        if found is not None:
            out.ranks.append(found)
    if out.ranks:
        idle = max(out.ranks, key=lambda r: r.idle_share)
        mean_idle = float(np.mean([r.idle_share for r in out.ranks]))
        mean_ov = float(np.mean([r.comm_comp_overlap_share for r in out.ranks]))
        out.verdict = (
            f"GPUs idle {mean_idle:.0%} of their kernel span on average (most on rank "
            f"{idle.rank}: {idle.idle_share:.0%}); {mean_ov:.0%} of communication kernel time "
            "overlaps computation kernels (HTA's definitions)."
        )
    return out
