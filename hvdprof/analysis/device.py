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

Beside HTA's shares, per rank: the kernel time per kernel name (the top
:data:`TOP_KERNELS`, with the share of the rank's GPU busy time each took) and the
memcpy bandwidth per copy kind (bytes over duration, HtoD / DtoH / DtoD ...), over the
same events the shares count; and, over the ranks, the one whose idle or compute share
lies furthest from the others (named only when the gap reaches :data:`STANDS_OUT_POINTS`).
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
import numpy as np

from hvdprof.analysis.gpu_kinds import GPU_KIND_NAMES, short_kernel_name
from hvdprof.analysis.registry import Analysis
from hvdprof.analysis.result import Result
from hvdprof.trace.model import Run

#: HTA's kernel kinds, in GpuActivity.kind code order (0 compute, 1 comm, 2 memory, 3 other).
#: Kernel names listed per rank (most time first).
TOP_KERNELS = 10
#: A rank stands out when its idle or compute share is at least this many percentage
#: points from the mean of the others. Below, the difference is not material: the shares
#: come from a sampled step or two, and ranks of one balanced job differ by several points
#: there (HTA's traces of ranks 0 and 1 of a 128-rank job: idle 53.6% / 54.7%, compute
#: 17.7% / 22.6%, 4.9 points); ten points of a rank's kernel span is a tenth of its step,
#: what a user would act on.
STANDS_OUT_POINTS = 10.0
_COPY_KIND = re.compile(r"Memcpy\s+(\w+)")
#: Kernel names per rank in ``analyze``'s GPU table (``--json`` has the report's top list).
CLI_TOP_KERNELS = 5
#: Kernel names are shortened to this many characters there (80-column terminals).
CLI_KERNEL_CHARS = 31
_KIND_WORDS = {"computation": "compute", "communication": "comm"}


def copy_kind(name: str) -> str | None:
    """``HtoD``, ``DtoH``, ``DtoD``... of a ``Memcpy`` event's name (None: not a copy)."""
    found = _COPY_KIND.match(name)
    return found.group(1) if found else None


class KernelTime(Result):
    """One kernel name's time on one rank's GPU."""

    name: str
    short_name: str
    kind: str  # GPU_KIND_NAMES
    count: int
    total_ms: float
    busy_share: float  # of the rank's GPU busy time (union of every event)


class CopyBandwidth(Result):
    """One copy kind's memcpys on one rank: what they moved, how fast."""

    copy_kind: str  # HtoD, DtoH, DtoD, ...
    count: int  # copies with a recorded size and duration
    bytes: int
    total_ms: float
    gbps: float  # bytes / total duration, GB/s (10^9 B/s)


class RankGpu(Result):
    rank: int
    span_ms: float
    idle_share: float
    compute_share: float
    non_compute_share: float
    comm_comp_overlap_share: float
    kernels: int  # GPU events counted
    comm_ms: float  # union of communication kernels
    #: the same shares on the trace's own times, where HTA rounded them (absent otherwise)
    unrounded: dict[str, float] | msgspec.UnsetType = msgspec.UNSET
    busy_ms: float = 0.0  # union of every GPU event
    #: the TOP_KERNELS names with the most time, most first
    top_kernels: list[KernelTime] = msgspec.field(default_factory=list)
    kernel_names: int = 0  # distinct names in all
    memcpy: list[CopyBandwidth] = msgspec.field(default_factory=list)


class GpuReport(Result):
    """Per rank with GPU activity; empty for runs without a GPU (CPU jobs, hvdprof's own)."""

    ranks: list[RankGpu] = msgspec.field(default_factory=list)
    verdict: str | None = None
    #: the rank whose idle or compute share is furthest from the others' (None: no rank
    #: stands out by STANDS_OUT_POINTS, or fewer than two ranks), and in words
    stands_out: int | None = None
    stands_out_metric: str | None = None  # "idle_share" | "compute_share"
    stands_out_text: str | None = None
    kinds: list[str] = msgspec.field(default_factory=lambda: list(GPU_KIND_NAMES))
    definition: str = "HTA get_temporal_breakdown / get_comm_comp_overlap, as fractions"
    #: ROUNDING_NOTE when a rank carries ``unrounded`` shares
    note: str | None = None


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


def _top_kernels(g: Any, m: np.ndarray, busy_us: float) -> tuple[list[KernelTime], int]:
    """The names with the most GPU time among the events ``m`` selects (recorded times)."""
    names = g.name[m].astype(np.int64)
    if not len(names) or not len(g.names):
        return [], 0
    total = np.bincount(names, weights=g.dur_us[m], minlength=len(g.names))
    count = np.bincount(names, minlength=len(g.names))
    kind = np.zeros(len(g.names), np.int64)
    kind[names] = g.kind[m]
    used = np.flatnonzero(count)
    top = used[np.argsort(-total[used], kind="stable")][:TOP_KERNELS]
    return [
        KernelTime(
            name=g.names[i],
            short_name=short_kernel_name(g.names[i]),
            kind=GPU_KIND_NAMES[int(kind[i])],
            count=int(count[i]),
            total_ms=float(total[i]) / 1000.0,
            busy_share=float(total[i]) / busy_us if busy_us > 0 else 0.0,
        )
        for i in top.tolist()
    ], len(used)


def _copy_bandwidth(g: Any, m: np.ndarray) -> list[CopyBandwidth]:
    """Bytes over time per copy kind, from the memcpys with a recorded size and duration."""
    kinds = [copy_kind(n) for n in g.names]
    if not len(g.nbytes) or not any(kinds):
        return []
    code = np.asarray([-1 if k is None else i for i, k in enumerate(kinds)], np.int64)
    names = g.name.astype(np.int64)
    take = m & (code[names] >= 0) & (g.nbytes >= 0) & (g.dur_us > 0)
    by_kind: dict[str, list[float]] = {}
    for c, b, d in zip(
        code[names[take]].tolist(), g.nbytes[take].tolist(), g.dur_us[take].tolist(), strict=True
    ):
        acc = by_kind.setdefault(kinds[c], [0, 0, 0.0])  # type: ignore[index]
        acc[0] += 1
        acc[1] += b
        acc[2] += d
    return [
        CopyBandwidth(k, int(n), int(b), d / 1000.0, b / (d * 1000.0) if d > 0 else 0.0)
        for k, (n, b, d) in sorted(by_kind.items())
    ]


def _stands_out(ranks: list[RankGpu]) -> tuple[int | None, str | None, str | None]:
    """The rank whose idle or compute share lies furthest from the mean of the others.

    With two ranks both are equally far: the one doing worse is named (more idle, less
    compute), since that is the one to look at."""
    if len(ranks) < 2:
        return None, None, None
    best: tuple[float, int, str] | None = None
    for metric, worse in (("idle_share", 1.0), ("compute_share", -1.0)):
        values = np.asarray([getattr(r, metric) for r in ranks])
        others = (values.sum() - values) / (len(values) - 1)
        gap = (values - others) * 100.0
        # furthest first, then the worse side, then the lower rank
        i = max(range(len(ranks)), key=lambda j: (round(abs(gap[j]), 9), worse * gap[j], -j))
        if best is None or abs(gap[i]) > best[0]:
            best = (abs(float(gap[i])), i, metric)
    assert best is not None
    points, i, metric = best
    r = ranks[i]
    mine = getattr(r, metric)
    others = float(np.mean([getattr(x, metric) for x in ranks if x is not r]))
    what = "idle" if metric == "idle_share" else "computing"
    who = "the other rank" if len(ranks) == 2 else f"the other {len(ranks) - 1} ranks on average"
    if points < STANDS_OUT_POINTS:
        return (
            None,
            None,
            (
                f"No rank stands out: idle and compute shares lie within {STANDS_OUT_POINTS:g} "
                f"points of the other ranks' mean on every rank (the widest gap: rank "
                f"{r.rank}'s GPU is {what} {mine:.1%} of its span against {others:.1%} for "
                f"{who}, "
                f"{points:.1f} points: ranks of a balanced job can differ that much in a "
                "sampled step)."
            ),
        )
    more = "more" if mine > others else "less"
    return (
        r.rank,
        metric,
        (
            f"Rank {r.rank} stands out: its GPU is {what} {mine:.1%} of its span, {more} than "
            f"{who} ({others:.1%}), {points:.1f} points apart (material: "
            f"{STANDS_OUT_POINTS:g} points or more)."
        ),
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
        merged = _merged(g.start_us[m], g.start_us[m] + g.dur_us[m])
        busy_us = float((merged[1] - merged[0]).sum())
        found.busy_ms = busy_us / 1000.0
        found.top_kernels, found.kernel_names = _top_kernels(g, m, busy_us)
        found.memcpy = _copy_bandwidth(g, m)
        out.ranks.append(found)
    out.stands_out, out.stands_out_metric, out.stands_out_text = _stands_out(out.ranks)
    if out.ranks:
        idle = max(out.ranks, key=lambda r: r.idle_share)
        mean_idle = float(np.mean([r.idle_share for r in out.ranks]))
        mean_ov = float(np.mean([r.comm_comp_overlap_share for r in out.ranks]))
        out.verdict = (
            f"GPUs idle {mean_idle:.0%} of their kernel span on average (most on rank "
            f"{idle.rank}: {idle.idle_share:.0%}); {mean_ov:.0%} of communication kernel time "
            "overlaps computation kernels (HTA's definitions)."
        )
    out.note = ROUNDING_NOTE if any(r.unrounded for r in out.ranks) else None
    return out


def gpu_tables(console: Any, number: int, g: GpuReport, run: dict[str, Any]) -> None:
    """HTA's GPU shares per rank, the rank that stands out, top kernels, memcpy rates."""
    from rich.table import Table

    from hvdprof.analysis.table_cells import fitted, ms, printable, size

    if not g.ranks:
        return
    table = Table(
        title=f"{number}. GPU per rank (HTA's definitions: shares of the GPU kernel span)"
    )
    for col in ("rank", "span ms", "idle", "compute", "non-compute", "comm overlap", "events"):
        table.add_column(col, justify="right")
    for x in g.ranks:
        mark = " *" if x.rank == g.stands_out else ""
        table.add_row(
            f"{x.rank}{mark}", ms(x.span_ms), f"{x.idle_share:.2%}", f"{x.compute_share:.2%}",
            f"{x.non_compute_share:.2%}", f"{x.comm_comp_overlap_share:.2%}", f"{x.kernels:,}",
        )  # fmt: skip
    console.print(fitted(table))
    if g.stands_out_text:
        console.print(
            f"  {'* ' if g.stands_out is not None else ''}{g.stands_out_text}", highlight=False
        )
    table = Table(title=f"GPU kernel time per name (top {CLI_TOP_KERNELS} per rank)")
    for col in ("rank", "kernel", "kind", "count", "ms", "of busy"):
        table.add_column(col, justify="left" if col in ("kernel", "kind") else "right")
    for x in g.ranks:
        for k in x.top_kernels[:CLI_TOP_KERNELS]:
            table.add_row(
                str(x.rank), printable(short_kernel_name(k.name, CLI_KERNEL_CHARS)),
                _KIND_WORDS.get(k.kind, k.kind), f"{k.count:,}", ms(k.total_ms),
                f"{k.busy_share:.1%}",
            )  # fmt: skip
    console.print(fitted(table))
    copies = [(x.rank, c) for x in g.ranks for c in x.memcpy]
    if copies:
        table = Table(title="Memcpy bandwidth per copy kind (bytes / duration, GB/s = 10^9 B/s)")
        for col in ("rank", "copy", "copies", "bytes", "ms", "GB/s"):
            table.add_column(col, justify="right")
        for rank, c in copies:
            table.add_row(
                str(rank), c.copy_kind, f"{c.count:,}", size(c.bytes), f"{c.total_ms:.3f}",
                f"{c.gbps:.3g}",
            )  # fmt: skip
        console.print(fitted(table))


ANALYSIS = Analysis(
    "gpu", gpu_report, GpuReport,
    "GPU per rank (torch.profiler traces): HTA's idle, compute, non-compute and overlap "
    "shares, the rank that stands out, kernel time per name, memcpy bandwidth",
    verdict_order=80, table=gpu_tables,
)  # fmt: skip
