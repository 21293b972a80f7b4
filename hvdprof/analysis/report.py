"""``analyze``: every question over one run, with the verdicts in plain words first."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hvdprof.analysis.autotune import AutotuneReport, autotune_report
from hvdprof.analysis.bandwidth import BandwidthReport, bandwidth_report
from hvdprof.analysis.breakdown import Breakdown, time_breakdown
from hvdprof.analysis.device import GpuReport, gpu_report
from hvdprof.analysis.divergence import DivergenceReport, divergence_report
from hvdprof.analysis.fusion import FusionReport, fusion_report
from hvdprof.analysis.model import Problem, Run
from hvdprof.analysis.overlap import OverlapReport, overlap_report
from hvdprof.analysis.process_sets import SetStragglers, set_stragglers
from hvdprof.analysis.stalls import StallReport, stall_report
from hvdprof.analysis.stragglers import Stragglers, find_stragglers
from hvdprof.timeline.manifest import TRACE_RE

#: version of the ``to_dict`` layout (``hvdprof analyze --json``)
SCHEMA_VERSION = 1


@dataclass
class Report:
    run: dict[str, Any]
    breakdown: Breakdown
    stragglers: Stragglers
    fusion: FusionReport
    bandwidth: BandwidthReport
    overlap: OverlapReport | None
    autotune: AutotuneReport
    divergence: DivergenceReport = field(default_factory=DivergenceReport)
    stalls: StallReport = field(default_factory=StallReport)
    gpu: GpuReport = field(default_factory=GpuReport)
    #: each process set's own straggler answer (none: every op ran on every rank)
    process_sets: list[SetStragglers] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    verdicts: list[str] = field(default_factory=list)

    @property
    def skipped(self) -> bool:
        """True when something could not be read (the CLI's exit code 1)."""
        return bool(self.problems)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_VERSION,
            "run": self.run,
            "verdicts": list(self.verdicts),
            "breakdown": self.breakdown.to_dict(),
            "stragglers": self.stragglers.to_dict(),
            "fusion": self.fusion.to_dict(),
            "bandwidth": self.bandwidth.to_dict(),
            "overlap": self.overlap.to_dict() if self.overlap is not None else None,
            "autotune": self.autotune.to_dict(),
            "divergence": self.divergence.to_dict(),
            "stalls": self.stalls.to_dict()["stalls"],
            "gpu": self.gpu.to_dict(),
            "process_sets": [s.to_dict() for s in self.process_sets],
            "problems": [p.to_dict() for p in self.problems],
        }


def _incarnations_inside(path: str) -> list[str]:
    """Subfolders ``incarnation.<k>`` holding timelines: the later ``init()``s of the
    processes that wrote ``path`` (each incarnation records into its own)."""
    try:
        names = os.listdir(path)
    except OSError:
        return []
    found = []
    for name in names:
        m = re.fullmatch(r"incarnation\.(\d+)", name)
        sub = os.path.join(path, name)
        if m and any(TRACE_RE.match(f) for f in _listdir(sub)):
            found.append((int(m.group(1)), name))
    return [name for _, name in sorted(found)]


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def analyze(run: Run, *, kineto_paths: Sequence[str] = ()) -> Report:
    """All the analyses of ``run`` (and the overlap one when Kineto traces are given)."""
    overlap = overlap_report(run, list(kineto_paths)) if kineto_paths else None
    report = Report(
        run=run.summary(),
        breakdown=time_breakdown(run),
        stragglers=find_stragglers(run),
        fusion=fusion_report(run),
        bandwidth=bandwidth_report(run),
        overlap=overlap,
        autotune=autotune_report(run),
        divergence=divergence_report(run),
        stalls=stall_report(run),
        gpu=gpu_report(run),
        process_sets=set_stragglers(run),
        problems=list(run.problems) + (overlap.problems if overlap else []),
    )
    if report.process_sets and not report.stragglers.ops_with_marks:
        report.stragglers.verdict = (
            "Every collective with readiness marks ran in a process set: each set's "
            "straggler is judged among its members below."
        )
    # what someone whose job hung, or whose ranks diverged, wants to know first
    verdicts: list[str] = list(report.stalls.verdicts)
    if report.divergence.verdict:
        verdicts.append(report.divergence.verdict)
    dropped = run.dropped_events
    if dropped:
        total = sum(dropped.values())
        written = sum(int(m.get("events_written", 0) or 0) for m in run.manifests.values())
        who = ", ".join(f"rank {r}: {n:,}" for r, n in sorted(dropped.items()))
        verdicts.append(
            f"The timeline is incomplete: {total:,} events were dropped while recording "
            f"({100.0 * total / max(1, total + written):.1f}% of them; {who}), so times "
            "and counts below undercount. Record again with the default "
            "HVDPROF_TIMELINE_WHEN_FULL=wait, or a larger HVDPROF_TIMELINE_QUEUE_SIZE."
        )
    if report.problems:
        verdicts.append(
            f"Some input could not be read ({len(report.problems)} problem(s)); the report "
            f"covers what was read: {report.problems[0]}"
            + (f" (and {len(report.problems) - 1} more)" if len(report.problems) > 1 else "")
        )
    verdicts += run.notes
    if not len(run.slices):
        verdicts.append("No collective operations were found in this timeline.")
    later = _incarnations_inside(run.path) if os.path.isdir(run.path) else []
    if later:
        shown = ", ".join(later[:4]) + (f" ... {later[-1]}" if len(later) > 4 else "")
        verdicts.append(
            f"This is the first of {len(later) + 1} runtimes these processes started "
            f"(init() after shutdown()): the other {len(later)} recorded into subfolders "
            f"({shown}); analyze each by its path."
        )
    for part in (
        report.stragglers,
        report.breakdown,
        report.fusion,
        report.bandwidth,
        report.overlap,
        report.autotune,
        report.gpu,
    ):
        if part is not None and part.verdict:
            verdicts.append(part.verdict)
        if part is report.breakdown and report.breakdown.user.verdict:
            verdicts.append(report.breakdown.user.verdict)
        if part is report.stragglers:
            for s in report.process_sets:
                who = ", ".join(str(r) for r in s.members)
                verdicts.append(
                    f"Process set {s.process_set} (ranks {who}): {s.stragglers.verdict}"
                )
    report.verdicts = verdicts
    return report
