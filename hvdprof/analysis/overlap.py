"""Q5: does communication overlap computation? From a torch.profiler (Kineto) trace.

Communication is the union of a rank's backend calls (``<BACKEND>_<OP>`` slices);
backward compute is the union of the Kineto trace's complete events whose name mentions
``backward`` (autograd's ``...Backward0`` functions) plus GPU kernels (``cat: kernel``).
The Kineto trace is read by the trace layer's one Kineto reader
(:func:`hvdprof.trace.kineto_format.backward_compute`) and put on the run's clock the way
``hvdprof timeline merge`` does (its ``baseTimeNanoseconds`` against the rank's manifest,
:func:`hvdprof.trace.manifest.kineto_shift_us`). The answer per rank is the
share of communication time during which backward compute was running.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np

from hvdprof.analysis.intervals import intersection_length, merge
from hvdprof.analysis.registry import Analysis
from hvdprof.analysis.result import Result
from hvdprof.trace.kineto_format import backward_compute
from hvdprof.trace.manifest import RANK_IN_NAME, kineto_shift_us
from hvdprof.trace.model import PHASE_COLLECTIVE, Problem, Run

_EXPLICIT = re.compile(r"^(\d+)=(.+)$")


class RankOverlap(Result):
    rank: int
    kineto_path: str
    comm_ms: float
    compute_ms: float
    overlap_ms: float
    #: of the communication time, the share overlapped (from the three above)
    fraction: float = 0.0

    def __post_init__(self) -> None:
        self.fraction = self.overlap_ms / self.comm_ms if self.comm_ms > 0 else 0.0


class OverlapReport(Result):
    ranks: list[RankOverlap] = msgspec.field(default_factory=list)
    problems: list[Problem] = msgspec.field(default_factory=list)
    verdict: str | None = None


def overlap_report(run: Run, kineto_paths: Sequence[str]) -> OverlapReport:
    """Per rank, the share of communication time overlapped by backward compute."""
    out = OverlapReport()
    s = run.slices
    for spec in kineto_paths:
        spec = os.fspath(spec)
        explicit = _EXPLICIT.match(spec)
        path = explicit.group(2) if explicit and not os.path.exists(spec) else spec
        compute = backward_compute(path, out.problems)
        if compute is None:
            continue
        rank = _rank_of(path, compute.rank, run, explicit if path != spec else None)
        if rank is None:
            out.problems.append(
                Problem(
                    path,
                    "",
                    "cannot tell its rank (no distributedInfo, no 'rank<r>' in the "
                    "file name); pass it as RANK=PATH",
                )
            )
            continue
        manifest = run.manifests.get(rank)
        if manifest is None or manifest.start_unix_ns is None or manifest.start_local_ns is None:
            out.problems.append(
                Problem(path, "", f"rank {rank} has no timeline manifest to align it with; skipped")
            )
            continue
        shift = kineto_shift_us(compute.base_ns, manifest)
        c_start = compute.start_us + shift
        c_end = compute.end_us + shift
        mask = (s.rank == rank) & (s.phase == PHASE_COLLECTIVE)
        a_start = s.start_us[mask]
        a_end = a_start + s.dur_us[mask]
        m_start, m_end = merge(a_start, a_end)
        k_start, k_end = merge(c_start, c_end)
        out.ranks.append(
            RankOverlap(
                rank=rank,
                kineto_path=path,
                comm_ms=float((m_end - m_start).sum()) / 1000.0,
                compute_ms=float((k_end - k_start).sum()) / 1000.0,
                overlap_ms=intersection_length(a_start, a_end, c_start, c_end) / 1000.0,
            )
        )
    out.ranks.sort(key=lambda r: r.rank)
    if out.ranks:
        fractions = [r.fraction for r in out.ranks]
        worst = min(out.ranks, key=lambda r: r.fraction)
        out.verdict = (
            f"{np.mean(fractions):.0%} of communication time overlaps backward compute on "
            f"average; least on rank {worst.rank} ({worst.fraction:.0%})."
        )
        if np.mean(fractions) < 0.3:
            out.verdict += (
                " Most communication runs after backward: gradients are submitted late"
                " or the cycle time delays them."
            )
    elif kineto_paths:
        out.verdict = "No torch.profiler trace could be aligned with the run."
    return out


def _rank_of(
    path: str, traced_rank: int | None, run: Run, explicit: re.Match[str] | None
) -> int | None:
    if explicit is not None:
        return int(explicit.group(1))
    if traced_rank is not None:
        return traced_rank
    match = RANK_IN_NAME.search(os.path.basename(path))
    if match:
        return int(match.group(1))
    if len(run.ranks) == 1:
        return run.ranks[0]
    return None


def overlap_table(console: Any, number: int, o: OverlapReport, run: dict[str, Any]) -> None:
    """Communication time overlapped by backward compute, per rank."""
    from rich.table import Table

    from hvdprof.analysis.table_cells import fitted, ms

    if not o.ranks:
        return
    table = Table(title=f"{number}. Communication overlapped by backward compute")
    for col in (
        "rank",
        "communication (ms)",
        "backward compute (ms)",
        "overlapped (ms)",
        "share overlapped",
    ):
        table.add_column(col, justify="right")
    for x in o.ranks:
        table.add_row(
            str(x.rank),
            ms(x.comm_ms),
            ms(x.compute_ms),
            ms(x.overlap_ms),
            f"{x.fraction:.0%}",
        )
    console.print(fitted(table))


ANALYSIS = Analysis(
    "overlap", overlap_report, OverlapReport,
    "Communication overlapped by backward compute (given torch.profiler traces)",
    verdict_order=60, table=overlap_table, kineto=True, route=False,
)  # fmt: skip
