"""Q: how busy is each rank's GPU? HTA's temporal breakdown and comm/comp overlap.

Defined exactly as Holistic Trace Analysis (HTA) defines them, so users can move from
HTA and check us against it, from the GPU activity a Kineto trace records (every event
with a ``stream``: kernels, memcpy, memset), each classified as HTA does: communication
(``nccl...Kernel``), memory (starting ``Memcpy``/``Memset``/``dma``), other (``Sync`` or
``Memcpy`` elsewhere in the name: busy, but neither compute nor communication), else
computation.

- span: from the start of the rank's first GPU event to the end of its last;
- ``idle_share``: the part of the span with no GPU event running (any stream);
- ``compute_share``: the union of computation kernels over the span;
- ``non_compute_share``: the rest of the busy time (communication, memory, other);
- ``comm_comp_overlap_share``: the part of the union of communication kernels during
  which a computation kernel also runs, over that union (HTA's
  ``get_comm_comp_overlap``; its denominator is communication time, not the span).

All shares are fractions (0-1); HTA prints the same as percentages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

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
    #: the same shares on the trace's own times, where HTA rounded them (None otherwise)
    unrounded: dict[str, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rank": self.rank,
            "span_ms": self.span_ms,
            "idle_share": self.idle_share,
            "compute_share": self.compute_share,
            "non_compute_share": self.non_compute_share,
            "comm_comp_overlap_share": self.comm_comp_overlap_share,
            "kernels": self.kernels,
            "comm_ms": self.comm_ms,
        }
        if self.unrounded is not None:
            out["unrounded"] = self.unrounded
        return out


@dataclass
class GpuReport:
    """Per rank with GPU activity; empty for runs without a GPU (CPU jobs, hvdprof's own)."""

    ranks: list[RankGpu] = field(default_factory=list)
    verdict: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "ranks": [r.to_dict() for r in self.ranks],
            "definition": "HTA get_temporal_breakdown / get_comm_comp_overlap, as fractions",
            "note": ROUNDING_NOTE if any(r.unrounded for r in self.ranks) else None,
            "verdict": self.verdict,
        }


#: Why a rank may carry ``unrounded`` shares beside HTA's.
ROUNDING_NOTE = (
    "HTA rounds a trace's times to whole microseconds when they have a fractional part "
    "(start up, end down), which shortens or even reverses kernels of a few microseconds; "
    "the keys keep HTA's numbers, 'unrounded' gives the same shares on the recorded times."
)


def _merged(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Intervals merged as HTA merges kernels: in order of start, an interval opens a new
    group when it starts after every earlier one ended; a group spans its first start to
    its latest end. (An interval that ends before it starts, which rounding can make,
    stays as it is: HTA counts its negative length too.)"""
    if not len(start):
        return start, end
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), bool)
    new[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(new)
    return s[first], np.maximum.reduceat(e, first)


def _overlap(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    """Time both merged sets are running (HTA's running count reaching both)."""
    if not len(a[0]) or not len(b[0]):
        return 0.0
    times = np.concatenate([a[0], a[1], b[0], b[1]])
    step = np.concatenate(
        [np.ones(len(a[0])), -np.ones(len(a[1])), 2 * np.ones(len(b[0])), -2 * np.ones(len(b[1]))]
    )
    order = np.argsort(times, kind="stable")
    times, running = times[order], np.cumsum(step[order])
    both = running[:-1] == 3
    return float((times[1:] - times[:-1])[both].sum())


def rank_gpu(rank: int, start: np.ndarray, end: np.ndarray, kind: np.ndarray) -> RankGpu | None:
    """HTA's numbers for one rank's GPU events (``kind``: 0 compute, 1 comm, 2 memory,
    3 other)."""
    if not len(start):
        return None
    all_s, all_e = _merged(start, end)
    span = float(all_e[-1] - all_s[0])
    busy = float((all_e - all_s).sum())
    comp = _merged(start[kind == 0], end[kind == 0])
    comm = _merged(start[kind == 1], end[kind == 1])
    compute = float((comp[1] - comp[0]).sum())
    comm_time = float((comm[1] - comm[0]).sum())
    overlap = _overlap(comm, comp)
    idle = span - busy
    share = (lambda x: x / span) if span > 0 else (lambda x: 0.0)
    return RankGpu(
        rank=rank,
        span_ms=span / 1000.0,
        idle_share=share(idle),
        compute_share=share(compute),
        non_compute_share=share(span - compute - idle),
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
        found = rank_gpu(rank, g.hta_start[m], g.hta_end[m], g.kind[m])
        if found is None:
            continue
        if getattr(g, "ns_rounding", False):
            exact = rank_gpu(rank, g.start_us[m], g.start_us[m] + g.dur_us[m], g.kind[m])
            if exact is not None:
                found.unrounded = {
                    k: getattr(exact, k)
                    for k in (
                        "idle_share",
                        "compute_share",
                        "non_compute_share",
                        "comm_comp_overlap_share",
                    )
                }
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
