"""What a zoomable timeline needs: the slices in a time window, bounded in size.

``timeline_window`` returns one row per rank (the phases: negotiation, queue, copies,
backend call, other; the enclosing ``<OP>`` slices and cycle marks are left out since
the phases tile them), or, for ``expand_rank``, that rank's slices in lanes: one row per
tensor (``lanes="tensor"``: which tensor waited, which was reduced) or one row per phase
(``lanes="phase"``: how negotiation, queueing, copies and the backend call of all tensors
line up). When more than ``max_items`` slices overlap the window, it returns buckets
instead: each row is cut into equal time bins (``max_items // rows`` of them) and each
non-empty bin carries its dominant phase (most busy time), how many slices fell in it
and their busy time, so a million-event run answers with a bounded payload in
milliseconds. Columns are returned as lists (one list per field), which is what a
plotting client wants and keeps the JSON small.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hvdprof.analysis.model import OPS, PHASE_CYCLE, PHASE_OP, PHASES, Run

#: How ``timeline_window`` splits an expanded rank into rows.
LANE_KINDS: tuple[str, ...] = ("tensor", "phase")


@dataclass
class TimelineWindow:
    t0_us: float
    t1_us: float
    expand_rank: int | None
    aggregated: bool
    total: int  # slices overlapping the window (before aggregation)
    #: {"row", "label", "rank", "tensor", "phase"} (tensor/phase None when not that lane kind)
    rows: list[dict[str, Any]] = field(default_factory=list)
    #: when not aggregated: row, start_us, dur_us, phase, name, tensor, op, bytes,
    #: group, group_tensors, backend, dtype (one list each)
    slices: dict[str, list[Any]] = field(default_factory=dict)
    #: when aggregated: row, start_us, dur_us (bin), phase (dominant), count, busy_us
    buckets: dict[str, list[Any]] = field(default_factory=dict)
    #: "rank" (one row per rank), or the expanded rank's "tensor" or "phase" lanes
    lanes: str = "rank"

    def to_dict(self) -> dict[str, Any]:
        return {
            "t0_us": self.t0_us,
            "t1_us": self.t1_us,
            "expand_rank": self.expand_rank,
            "lanes": self.lanes,
            "aggregated": self.aggregated,
            "total": self.total,
            "phases": list(PHASES),
            "rows": self.rows,
            "slices": self.slices,
            "buckets": self.buckets,
        }


def _label(table: list[str], codes: np.ndarray) -> list[str]:
    return [table[c] if c >= 0 else "" for c in codes.tolist()]


def timeline_window(
    run: Run,
    t0_us: float,
    t1_us: float,
    *,
    ranks: Sequence[int] | None = None,
    expand_rank: int | None = None,
    lanes: str = "tensor",
    max_items: int = 4000,
) -> TimelineWindow:
    """Slices overlapping ``[t0_us, t1_us]``: one row per rank, or ``expand_rank``'s slices
    in one row per tensor or per phase (``lanes``)."""
    if lanes not in LANE_KINDS:
        raise ValueError(f"timeline_window: lanes must be one of {LANE_KINDS}, got {lanes!r}")
    if t1_us < t0_us:
        t0_us, t1_us = t1_us, t0_us
    s = run.slices
    start = s.start_us
    mask = (start <= t1_us) & (start + s.dur_us >= t0_us)
    if expand_rank is not None:
        mask &= s.rank == expand_rank
    else:
        mask &= (s.phase != PHASE_OP) & (s.phase != PHASE_CYCLE)
        if ranks is not None:
            mask &= np.isin(s.rank, np.asarray(list(ranks), dtype=np.int32))
    idx = np.flatnonzero(mask)
    out = TimelineWindow(float(t0_us), float(t1_us), expand_rank, False, len(idx))
    out.lanes = "rank" if expand_rank is None else lanes
    if expand_rank is None:
        row_keys = sorted(run.ranks if ranks is None else set(ranks) & set(run.ranks))
        row_of = np.full(max(row_keys, default=0) + 1, -1, dtype=np.int64)
        for i, r in enumerate(row_keys):
            row_of[r] = i
        out.rows = [
            {
                "row": i,
                "label": f"rank {r}" + (f" ({run.hosts[r]})" if r in run.hosts else ""),
                "rank": r,
                "tensor": None,
                "phase": None,
            }
            for i, r in enumerate(row_keys)
        ]
        rows = row_of[s.rank[idx]]
    elif lanes == "phase":
        phases = np.unique(s.phase[idx])  # in PHASES order: negotiate, op, queue, copies, ...
        out.rows = [
            {
                "row": i,
                "label": PHASES[p],
                "rank": expand_rank,
                "tensor": None,
                "phase": PHASES[p],
            }
            for i, p in enumerate(phases.tolist())
        ]
        rows = np.searchsorted(phases, s.phase[idx])
    else:
        tensors = np.unique(s.tensor[idx])
        out.rows = [
            {
                "row": i,
                "label": run.tensors[t] if t >= 0 else "(runtime)",
                "rank": expand_rank,
                "tensor": int(t),
                "phase": None,
            }
            for i, t in enumerate(tensors.tolist())
        ]
        rows = np.searchsorted(tensors, s.tensor[idx])
    n_rows = max(len(out.rows), 1)
    if len(idx) <= max_items:
        out.slices = {
            "row": rows.tolist(),
            "start_us": s.start_us[idx].tolist(),
            "dur_us": s.dur_us[idx].tolist(),
            "phase": [PHASES[p] for p in s.phase[idx].tolist()],
            "name": _label(run.names, s.name[idx]),
            "tensor": _label(run.tensors, s.tensor[idx]),
            "op": [OPS[c] if c >= 0 else "" for c in s.op[idx].tolist()],
            "bytes": s.bytes[idx].tolist(),
            "group": s.group[idx].tolist(),
            "group_tensors": s.group_tensors[idx].tolist(),
            "backend": _label(run.backends, s.backend[idx]),
            "dtype": _label(run.dtypes, s.dtype[idx]),
        }
        return out
    out.aggregated = True
    n_bins = max(1, max_items // n_rows)
    width = (t1_us - t0_us) / n_bins if t1_us > t0_us else 1.0
    a = np.maximum(s.start_us[idx], t0_us)
    b = np.minimum(s.start_us[idx] + s.dur_us[idx], t1_us)
    bins = np.clip(((a - t0_us) / width).astype(np.int64), 0, n_bins - 1)
    n_ph = len(PHASES)
    cell = rows * n_bins + bins
    busy = np.bincount(
        cell * n_ph + s.phase[idx].astype(np.int64),
        weights=np.maximum(b - a, 0.0),
        minlength=n_rows * n_bins * n_ph,
    ).reshape(n_rows * n_bins, n_ph)
    counts = np.bincount(cell, minlength=n_rows * n_bins)
    used = np.flatnonzero(counts)
    dominant = busy[used].argmax(axis=1)
    out.buckets = {
        "row": (used // n_bins).tolist(),
        "start_us": (t0_us + (used % n_bins) * width).tolist(),
        "dur_us": [width] * len(used),
        "phase": [PHASES[p] for p in dominant.tolist()],
        "count": counts[used].tolist(),
        "busy_us": busy[used].sum(axis=1).round(3).tolist(),
    }
    return out
