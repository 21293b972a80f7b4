"""Trace analysis: answers to "why is my step slow?" from hvdprof and Horovod timelines.

Reading lives in one place (:mod:`hvdprof.analysis.loader`, into the columnar
:class:`Run` of :mod:`hvdprof.analysis.model`); each question is one module with one
plain function over a :class:`Run`. The CLI (``hvdprof analyze`` / ``hvdprof diff``), the
dashboard and the tests all call these functions. Every result is a dataclass with
``to_dict()`` (JSON-safe) and, where it makes sense, a plain-words ``verdict``.
"""

from __future__ import annotations

# First: a folder named hvdprof that hides the installed package is noticed and undone
# before anything reads the package itself (hvdprof/shadowing.py).
from hvdprof.shadowing import repair_if_shadowed

repair_if_shadowed()

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hvdprof.analysis.autotune import AutotuneReport, autotune_report
    from hvdprof.analysis.bandwidth import BandwidthReport, bandwidth_report
    from hvdprof.analysis.breakdown import Breakdown, time_breakdown
    from hvdprof.analysis.diff import RunDiff, diff_runs
    from hvdprof.analysis.fusion import FusionReport, fusion_report
    from hvdprof.analysis.gate import GateResult, check_gate, parse_rule
    from hvdprof.analysis.loader import LoadError, load_run
    from hvdprof.analysis.model import PHASES, Problem, Run
    from hvdprof.analysis.overlap import OverlapReport, overlap_report
    from hvdprof.analysis.process_sets import ProcessSetReport, process_set_report
    from hvdprof.analysis.report import Report, analyze
    from hvdprof.analysis.stalls import StallReport, stall_report
    from hvdprof.analysis.stragglers import Stragglers, find_stragglers
    from hvdprof.analysis.summary import RunSummary, read_summary, summarize, write_summary
    from hvdprof.analysis.window import TimelineWindow, timeline_window

#: name -> module defining it. Resolved on first use, so that ``hvdprof run`` (whose
#: parser registers ``analyze``) does not pay for numpy and the analyses at start-up.
_EXPORTS: dict[str, str] = {
    "AutotuneReport": "hvdprof.analysis.autotune",
    "BandwidthReport": "hvdprof.analysis.bandwidth",
    "Breakdown": "hvdprof.analysis.breakdown",
    "FusionReport": "hvdprof.analysis.fusion",
    "GateResult": "hvdprof.analysis.gate",
    "RunSummary": "hvdprof.analysis.summary",
    "check_gate": "hvdprof.analysis.gate",
    "parse_rule": "hvdprof.analysis.gate",
    "read_summary": "hvdprof.analysis.summary",
    "summarize": "hvdprof.analysis.summary",
    "write_summary": "hvdprof.analysis.summary",
    "LoadError": "hvdprof.analysis.loader",
    "OverlapReport": "hvdprof.analysis.overlap",
    "PHASES": "hvdprof.analysis.model",
    "ProcessSetReport": "hvdprof.analysis.process_sets",
    "process_set_report": "hvdprof.analysis.process_sets",
    "Problem": "hvdprof.analysis.model",
    "Report": "hvdprof.analysis.report",
    "Run": "hvdprof.analysis.model",
    "StallReport": "hvdprof.analysis.stalls",
    "RunDiff": "hvdprof.analysis.diff",
    "Stragglers": "hvdprof.analysis.stragglers",
    "TimelineWindow": "hvdprof.analysis.window",
    "analyze": "hvdprof.analysis.report",
    "autotune_report": "hvdprof.analysis.autotune",
    "bandwidth_report": "hvdprof.analysis.bandwidth",
    "diff_runs": "hvdprof.analysis.diff",
    "find_stragglers": "hvdprof.analysis.stragglers",
    "fusion_report": "hvdprof.analysis.fusion",
    "load_run": "hvdprof.analysis.loader",
    "overlap_report": "hvdprof.analysis.overlap",
    "stall_report": "hvdprof.analysis.stalls",
    "time_breakdown": "hvdprof.analysis.breakdown",
    "timeline_window": "hvdprof.analysis.window",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hvdprof.analysis' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


__all__ = [
    "PHASES",
    "AutotuneReport",
    "BandwidthReport",
    "Breakdown",
    "FusionReport",
    "GateResult",
    "LoadError",
    "OverlapReport",
    "Problem",
    "ProcessSetReport",
    "Report",
    "Run",
    "RunDiff",
    "RunSummary",
    "StallReport",
    "Stragglers",
    "TimelineWindow",
    "analyze",
    "autotune_report",
    "bandwidth_report",
    "check_gate",
    "diff_runs",
    "find_stragglers",
    "fusion_report",
    "load_run",
    "overlap_report",
    "parse_rule",
    "process_set_report",
    "read_summary",
    "stall_report",
    "summarize",
    "time_breakdown",
    "timeline_window",
    "write_summary",
]
