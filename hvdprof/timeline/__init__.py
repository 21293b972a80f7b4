"""Per-rank Chrome-trace timelines: recording, reading, merging, clock alignment, NVTX.

* :class:`TimelineSink` is the cycle observer the runtime creates on every rank;
* :class:`TimelineWriter` is the crash-safe, non-blocking file writer underneath it;
* :func:`estimate_offset` and :class:`ClockCorrection` put all ranks on rank 0's clock;
* :func:`load_trace` / :func:`load_run` read traces (complete, truncated or gzipped);
* :func:`merge_directory` merges a run (and torch.profiler traces) into one file;
* :class:`PhaseRanges` mirrors runtime phases as NVTX ranges.

Importing this package does not import torch.
"""

from hvdprof.timeline.clock import (
    ClockCorrection,
    ClockOffset,
    apply_skew,
    estimate_offset,
    skewed_clock,
)
from hvdprof.timeline.merge import MergeResult, merge_directory
from hvdprof.timeline.nvtx_ranges import PhaseRanges
from hvdprof.timeline.reader import RankTrace, Run, Skip, Trace, load_run, load_trace
from hvdprof.timeline.sink import TimelineSink
from hvdprof.timeline.writer import TimelineWriter

__all__ = [
    "ClockCorrection",
    "ClockOffset",
    "MergeResult",
    "PhaseRanges",
    "RankTrace",
    "Run",
    "Skip",
    "TimelineSink",
    "TimelineWriter",
    "Trace",
    "apply_skew",
    "estimate_offset",
    "load_run",
    "load_trace",
    "merge_directory",
    "skewed_clock",
]
