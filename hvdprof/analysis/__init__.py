"""Trace analysis: answers to "why is my step slow?" from hvdprof and Horovod timelines.

Reading lives in one place (:mod:`hvdprof.analysis.loader`, into the columnar
:class:`Run` of :mod:`hvdprof.analysis.model`); each question is one module with one
plain function over a :class:`Run`. The CLI (``hvdprof analyze`` / ``hvdprof diff``), the
dashboard and the tests all call these functions. Every result is a dataclass with
``to_dict()`` (JSON-safe) and, where it makes sense, a plain-words ``verdict``.
"""

from hvdprof.analysis.autotune import AutotuneReport, autotune_report
from hvdprof.analysis.bandwidth import BandwidthReport, bandwidth_report
from hvdprof.analysis.breakdown import Breakdown, time_breakdown
from hvdprof.analysis.diff import RunDiff, diff_runs
from hvdprof.analysis.fusion import FusionReport, fusion_report
from hvdprof.analysis.loader import LoadError, load_run
from hvdprof.analysis.model import PHASES, Problem, Run
from hvdprof.analysis.overlap import OverlapReport, overlap_report
from hvdprof.analysis.report import Report, analyze
from hvdprof.analysis.stragglers import Stragglers, find_stragglers
from hvdprof.analysis.window import TimelineWindow, timeline_window

__all__ = [
    "PHASES",
    "AutotuneReport",
    "BandwidthReport",
    "Breakdown",
    "FusionReport",
    "LoadError",
    "OverlapReport",
    "Problem",
    "Report",
    "Run",
    "RunDiff",
    "Stragglers",
    "TimelineWindow",
    "analyze",
    "autotune_report",
    "bandwidth_report",
    "diff_runs",
    "find_stragglers",
    "fusion_report",
    "load_run",
    "overlap_report",
    "time_breakdown",
    "timeline_window",
]
