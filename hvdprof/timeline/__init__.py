"""Per-rank Chrome-trace timelines: recording, reading, merging, clock alignment, NVTX.

* :class:`TimelineSink` is the cycle observer the runtime creates on every rank;
* :class:`TimelineWriter` is the crash-safe, non-blocking file writer underneath it;
* :func:`estimate_offset` and :class:`ClockCorrection` put all ranks on rank 0's clock;
* :func:`load_trace` / :func:`load_traces` read traces (complete, truncated or gzipped);
* :func:`merge_directory` merges a run (and torch.profiler traces) into one file;
* :class:`PhaseRanges` mirrors runtime phases as NVTX ranges.

Importing this package does not import torch.
"""

from __future__ import annotations

# First: a folder named hvdprof that hides the installed package is noticed and undone
# before anything reads the package itself (hvdprof/shadowing.py).
from hvdprof.shadowing import repair_if_shadowed

repair_if_shadowed()

import importlib
from typing import TYPE_CHECKING, Any

# Names are imported on first use (PEP 562): the renderer process imports modules of this
# package and must not pay for the runtime and numpy, which the sink needs.
_WHERE = {
    "ClockCorrection": "clock",
    "ClockOffset": "clock",
    "apply_skew": "clock",
    "estimate_offset": "clock",
    "skewed_clock": "clock",
    "MergeResult": "merge",
    "merge_directory": "merge",
    "PhaseRanges": "nvtx_ranges",
    "RankTrace": "hvdprof.trace.chrome_json",
    "TraceDirectory": "hvdprof.trace.chrome_json",
    "Skip": "hvdprof.trace.chrome_json",
    "Trace": "hvdprof.trace.chrome_json",
    "load_traces": "hvdprof.trace.chrome_json",
    "load_trace": "hvdprof.trace.chrome_json",
    "TimelineSink": "sink",
    "TimelineWriter": "writer",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    where = module if "." in module else f"{__name__}.{module}"  # (the trace layer's readers)
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])


if TYPE_CHECKING:
    from hvdprof.timeline.clock import (
        ClockCorrection,
        ClockOffset,
        apply_skew,
        estimate_offset,
        skewed_clock,
    )
    from hvdprof.timeline.merge import MergeResult, merge_directory
    from hvdprof.timeline.nvtx_ranges import PhaseRanges
    from hvdprof.timeline.sink import TimelineSink
    from hvdprof.timeline.writer import TimelineWriter
    from hvdprof.trace.chrome_json import (
        RankTrace,
        Skip,
        Trace,
        TraceDirectory,
        load_trace,
        load_traces,
    )

__all__ = [
    "ClockCorrection",
    "ClockOffset",
    "MergeResult",
    "PhaseRanges",
    "RankTrace",
    "Skip",
    "TimelineSink",
    "TimelineWriter",
    "Trace",
    "TraceDirectory",
    "apply_skew",
    "estimate_offset",
    "load_trace",
    "load_traces",
    "merge_directory",
    "skewed_clock",
]
