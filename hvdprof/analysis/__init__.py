"""Trace analysis: answers to "why is my step slow?" from hvdprof and Horovod timelines.

Reading lives in one place (:mod:`hvdprof.trace.loader`, into the columnar
:class:`Run` of :mod:`hvdprof.trace.model`); each question is one module with one
plain function over a :class:`Run`. The CLI (``hvdprof analyze`` / ``hvdprof diff``), the
dashboard and the tests all call these functions. Every result is a typed
``msgspec.Struct`` (:class:`hvdprof.analysis.result.Result`: ``to_dict()`` is one generic,
JSON-safe encoder; the published schema is :mod:`hvdprof.analysis.schema`) and, where it
makes sense, carries a plain-words ``verdict``.
"""

from __future__ import annotations

# First: a folder named hvdprof that hides the installed package is noticed and undone
# before anything reads the package itself (hvdprof/shadowing.py).
from hvdprof.shadowing import repair_if_shadowed

repair_if_shadowed()

import importlib
from typing import TYPE_CHECKING, Any

from hvdprof.analysis import registry

# For type checkers and editors (unused here: at run time every name resolves on first use).
if TYPE_CHECKING:
    from hvdprof.analysis.autotune import AutotuneReport, autotune_report  # noqa: F401
    from hvdprof.analysis.bandwidth import BandwidthReport, bandwidth_report  # noqa: F401
    from hvdprof.analysis.breakdown import Breakdown, time_breakdown  # noqa: F401
    from hvdprof.analysis.device import GpuReport, gpu_report  # noqa: F401
    from hvdprof.analysis.diff import RunDiff, diff_runs  # noqa: F401
    from hvdprof.analysis.divergence import DivergenceReport, divergence_report  # noqa: F401
    from hvdprof.analysis.fusion import FusionReport, fusion_report  # noqa: F401
    from hvdprof.analysis.gate import GateResult, check_gate, parse_rule  # noqa: F401
    from hvdprof.analysis.overlap import OverlapReport, overlap_report  # noqa: F401
    from hvdprof.analysis.process_sets import ProcessSetReport, process_set_report  # noqa: F401
    from hvdprof.analysis.report import Report, analyze  # noqa: F401
    from hvdprof.analysis.stalls import StallReport, stall_report  # noqa: F401
    from hvdprof.analysis.stragglers import Stragglers, find_stragglers  # noqa: F401
    from hvdprof.analysis.summary import (  # noqa: F401
        RunSummary,
        read_summary,
        summarize,
        write_summary,
    )
    from hvdprof.analysis.surrogate import SurrogateSurface, autotune_surface  # noqa: F401
    from hvdprof.analysis.window import TimelineWindow, timeline_window  # noqa: F401
    from hvdprof.trace.loader import LoadError, load_run  # noqa: F401
    from hvdprof.trace.model import PHASES, Problem, Run  # noqa: F401

#: name -> module defining it, besides the analyses and their result types (those come from
#: the registry, which finds them on first use). Resolved on first use, so that ``hvdprof
#: run`` (whose parser registers ``analyze``) does not pay for numpy and the analyses at
#: start-up.
_OWN_EXPORTS: dict[str, str] = {
    "GateResult": "hvdprof.analysis.gate",
    "LoadError": "hvdprof.trace.loader",
    "PHASES": "hvdprof.trace.model",
    "Problem": "hvdprof.trace.model",
    "Report": "hvdprof.analysis.report",
    "Run": "hvdprof.trace.model",
    "RunDiff": "hvdprof.analysis.diff",
    "RunSummary": "hvdprof.analysis.summary",
    "TimelineWindow": "hvdprof.analysis.window",
    "analyze": "hvdprof.analysis.report",
    "check_gate": "hvdprof.analysis.gate",
    "diff_runs": "hvdprof.analysis.diff",
    "load_run": "hvdprof.trace.loader",
    "parse_rule": "hvdprof.analysis.gate",
    "read_summary": "hvdprof.analysis.summary",
    "summarize": "hvdprof.analysis.summary",
    "timeline_window": "hvdprof.analysis.window",
    "write_summary": "hvdprof.analysis.summary",
}


def __getattr__(name: str) -> Any:
    if name == "__all__":  # every export: the registry's analyses are found for this
        return sorted({*_OWN_EXPORTS, *registry.exports()})
    module = _OWN_EXPORTS.get(name)
    if module is None and not name.startswith("__"):  # a probe (inspect's) loads nothing
        module = registry.exports().get(name)
    if module is None:
        raise AttributeError(f"module 'hvdprof.analysis' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_OWN_EXPORTS) | set(registry.exports()))
