"""The runtime's phases as the analyses name and count them: one vocabulary for all.

The breakdown's table, ``hvdprof diff``'s rows, ``--fail-on`` rules, the run summary and
the binned timeline all speak of the same categories in the same words and order. They
live here, below the analyses, so that none of those reaches into the breakdown analysis
for them (and a new category is added in one place).

Phases overlap (many tensors negotiate at once; a fused group's children appear on each
of its tensors' lanes), so time is counted as wall time, not summed durations: at each
instant a rank is in the highest-priority phase that any of its slices is in (backend
collective first, then the fusion-buffer copies, queue, other work, negotiation) or idle
when none. :func:`rank_segments` cuts each rank's busy time that way, once per run.
"""

from __future__ import annotations

import numpy as np

from hvdprof.analysis.intervals import exclusive_segments
from hvdprof.trace.model import (
    PHASE_COLLECTIVE,
    PHASE_MEMCPY_IN,
    PHASE_MEMCPY_OUT,
    PHASE_NEGOTIATE,
    PHASE_OTHER,
    PHASE_QUEUE,
    Run,
)

#: Categories of the breakdown, in priority order, then idle.
CATEGORIES: tuple[str, ...] = (
    "collective",
    "memcpy_in",
    "memcpy_out",
    "queue",
    "other",
    "negotiate",
    "idle",
)
#: Phase codes in the same priority order (a rank at an instant is in the first one active).
PRIORITY: tuple[int, ...] = (
    PHASE_COLLECTIVE,
    PHASE_MEMCPY_IN,
    PHASE_MEMCPY_OUT,
    PHASE_QUEUE,
    PHASE_OTHER,
    PHASE_NEGOTIATE,
)
#: Plain words for each category (tables, verdicts).
LABELS = {
    "collective": "backend collective",
    "memcpy_in": "copy into fusion buffer",
    "memcpy_out": "copy out of fusion buffer",
    "queue": "queued after negotiation",
    "other": "other runtime work",
    "negotiate": "negotiation wait (ranks waiting for each other)",
    "idle": "no collective activity (compute)",
}

#: Column headers for tables (short forms of LABELS, one word or two short ones, so the
#: whole table fits an 80-column terminal without truncated headers; the CLI prints a
#: legend for the two that need one).
SHORT_LABELS = {
    "collective": "backend",
    "memcpy_in": "copy in",
    "memcpy_out": "copy out",
    "queue": "queue",
    "other": "other",
    "negotiate": "waiting",
    "idle": "idle",
}


def rank_segments(run: Run) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Exclusive segments ``(rank, start, length, category index)`` of busy time, sorted
    by rank then time (computed once per state of the run: the breakdown and the binned
    timeline both read them)."""
    return run.memo("rank_segments", lambda: _segments(run))


def _segments(run: Run) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    s = run.slices
    keep = np.isin(s.phase, PRIORITY) & (s.dur_us > 0)
    prio = np.zeros(len(PRIORITY) + 8, dtype=np.int8)
    for i, p in enumerate(PRIORITY):
        prio[p] = i
    start = s.start_us[keep]
    return exclusive_segments(s.rank[keep], start, start + s.dur_us[keep], prio[s.phase[keep]])
