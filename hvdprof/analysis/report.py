"""``analyze``: every question over one run, with the verdicts in plain words first."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hvdprof.analysis.autotune import AutotuneReport, autotune_report
from hvdprof.analysis.bandwidth import BandwidthReport, bandwidth_report
from hvdprof.analysis.breakdown import Breakdown, time_breakdown
from hvdprof.analysis.fusion import FusionReport, fusion_report
from hvdprof.analysis.model import Problem, Run
from hvdprof.analysis.overlap import OverlapReport, overlap_report
from hvdprof.analysis.stalls import StallReport, stall_report
from hvdprof.analysis.stragglers import Stragglers, find_stragglers

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
    stalls: StallReport = field(default_factory=StallReport)
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
            "stalls": self.stalls.to_dict()["stalls"],
            "problems": [p.to_dict() for p in self.problems],
        }


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
        stalls=stall_report(run),
        problems=list(run.problems) + (overlap.problems if overlap else []),
    )
    # a stall is what someone whose job hung wants to know first
    verdicts: list[str] = list(report.stalls.verdicts)
    if report.problems:
        verdicts.append(
            f"Some input could not be read ({len(report.problems)} problem(s)); the report "
            f"covers what was read: {report.problems[0]}"
            + (f" (and {len(report.problems) - 1} more)" if len(report.problems) > 1 else "")
        )
    if not len(run.slices):
        verdicts.append("No collective operations were found in this timeline.")
    for part in (
        report.stragglers,
        report.breakdown,
        report.fusion,
        report.bandwidth,
        report.overlap,
        report.autotune,
    ):
        if part is not None and part.verdict:
            verdicts.append(part.verdict)
    report.verdicts = verdicts
    return report
