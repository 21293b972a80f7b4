"""What a zoomable timeline needs: the slices in a time window, bounded in size.

``timeline_window`` returns one row per rank (the phases: negotiation, queue, copies,
backend call, other; the enclosing ``<OP>`` slices and cycle marks are left out since
the phases tile them), or, for ``expand_rank``, that rank's slices in lanes: one row per
tensor (``lanes="tensor"``: which tensor waited, which was reduced) or one row per phase
(``lanes="phase"``: how negotiation, queueing, copies and the backend call of all tensors
line up), or one row per GPU stream under the rank's CPU side (``lanes="stream"``, runs
with GPU activity: :mod:`hvdprof.analysis.gpu_lanes`). When more than ``max_items``
slices overlap the window, it returns buckets instead: each row is cut into equal time bins (``max_items // rows`` of them). Each
slice's time is spread over every bin it covers, overlapping slices count once (the
breakdown's phase priority), and each non-empty bin carries its time per phase, its busy
time (at most its width), its dominant phase (most time, no slice included) and how many
slices overlap it: the time per phase of a row over its bins is what the breakdown says,
and a million-event run answers with a bounded payload in milliseconds. Columns are returned as lists (one list per field), which is what a
plotting client wants and keeps the JSON small.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np

from hvdprof.analysis.bins import bucket_table
from hvdprof.analysis.gpu_lanes import joined_bins, kernel_bins, kernel_columns, stream_lanes
from hvdprof.analysis.intervals import exclusive_segments
from hvdprof.analysis.phases import PRIORITY, rank_segments
from hvdprof.analysis.result import Result
from hvdprof.trace.model import OPS, PHASE_CYCLE, PHASE_OP, PHASES, Run

#: How ``timeline_window`` splits an expanded rank into rows (``stream``: its CPU side and
#: one row per GPU stream, for ranks with GPU activity; see :mod:`gpu_lanes`).
LANE_KINDS: tuple[str, ...] = ("tensor", "phase", "stream")
#: The phase of a bin in which no slice was active most of the time (compute, waiting on data).
IDLE = "idle"


class TimelineWindow(Result):
    t0_us: float
    t1_us: float
    expand_rank: int | None
    aggregated: bool
    total: int  # slices overlapping the window (before aggregation)
    #: {"row", "label", "rank", "tensor", "phase"} (tensor/phase None when not that lane kind)
    rows: list[dict[str, Any]] = msgspec.field(default_factory=list)
    #: when not aggregated: row, start_us, dur_us, phase, name, tensor, op, bytes,
    #: group, group_tensors, backend, dtype (one list each)
    slices: dict[str, list[Any]] = msgspec.field(default_factory=dict)
    #: when aggregated: row, start_us, dur_us (bin), phase (dominant, or "idle"), count
    #: (slices overlapping the bin), busy_us (<= dur_us), phase_us ({phase: [us per bin]})
    buckets: dict[str, list[Any]] = msgspec.field(default_factory=dict)
    #: "rank" (one row per rank), or the expanded rank's "tensor" or "phase" lanes
    lanes: str = "rank"
    #: the phases' names, in the order of their codes (``phase`` columns hold the codes)
    phases: list[str] = msgspec.field(default_factory=lambda: list(PHASES))


def _row_of(keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Index of each value in the sorted ``keys``, -1 where it is not one of them."""
    if not len(keys):
        return np.full(len(values), -1, dtype=np.int64)
    pos = np.clip(np.searchsorted(keys, values), 0, len(keys) - 1)
    return np.where(keys[pos] == values, pos, -1).astype(np.int64)


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
    if lanes == "stream" and expand_rank is not None:
        return _stream_window(run, expand_rank, float(t0_us), float(t1_us), max_items)
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
        # rank -> row by search in the sorted ranks (never an array as long as the
        # largest rank number: a trace's rank is data from elsewhere)
        rank_keys = np.asarray(row_keys, dtype=np.int64)
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
        rows = _row_of(rank_keys, s.rank[idx])
        idx, rows = idx[rows >= 0], rows[rows >= 0]
        out.total = len(idx)
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
        out.slices = {"row": rows.tolist(), **_slice_columns(run, idx)}
        return out
    out.aggregated = True
    if expand_rank is None:
        lane_keys = rank_keys
    elif lanes == "phase":
        lane_keys = phases
    else:
        lane_keys = tensors
    out.buckets = _bins(
        run, idx, rows, n_rows, float(t0_us), float(t1_us), max_items, expand_rank, lanes,
        lane_keys,
    )  # fmt: skip
    return out


def _slice_columns(run: Run, idx: np.ndarray) -> dict[str, list[Any]]:
    """The slices ``idx`` as columns (all but ``row``)."""
    s = run.slices
    return {
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


#: What a GPU event holds in the slice-only columns of a stream window (and a CPU slice
#: holds None in the GPU events' own: kind, stream, launch...).
_KERNEL_BLANKS: dict[str, Any] = {
    "tensor": "", "op": "", "group": -1, "group_tensors": 0, "backend": "", "dtype": "",
}  # fmt: skip


def _stream_window(
    run: Run, rank: int, t0_us: float, t1_us: float, max_items: int
) -> TimelineWindow:
    """``rank``'s CPU side (its slices, as its rank row draws them, ``op`` included when
    not binned) above its GPU streams (:mod:`hvdprof.analysis.gpu_lanes`)."""
    lanes = stream_lanes(run, rank, t0_us, t1_us)
    s = run.slices
    cpu = np.flatnonzero(
        (s.rank == rank) & (s.phase != PHASE_CYCLE)
        & (s.start_us <= t1_us) & (s.start_us + s.dur_us >= t0_us)
    )  # fmt: skip
    out = TimelineWindow(t0_us, t1_us, rank, False, len(cpu) + len(lanes.idx))
    out.lanes = "stream"
    out.rows = lanes.rows
    if out.total <= max_items:
        mine = {"row": [0] * len(cpu), **_slice_columns(run, cpu)}
        theirs = kernel_columns(run, rank, lanes)
        n_cpu, n_gpu = len(cpu), len(lanes.idx)
        out.slices = {
            key: mine.get(key, [None] * n_cpu) + theirs.get(key, [_KERNEL_BLANKS.get(key)] * n_gpu)
            for key in [*mine, *(k for k in theirs if k not in mine)]
        }
        return out
    out.aggregated = True
    n_bins = max(1, max_items // len(lanes.rows))
    buckets = kernel_bins(lanes, t0_us, t1_us, n_bins)
    binned = cpu[s.phase[cpu] != PHASE_OP]  # the phases tile the ops, as on a rank row
    if len(binned):
        mine = _bins(
            run, binned, np.zeros(len(binned), np.int64), 1, t0_us, t1_us, n_bins, None,
            "rank", np.asarray([rank], np.int64),
        )  # fmt: skip
        buckets = joined_bins(mine, buckets)
    out.buckets = buckets
    return out


#: Phase codes in priority order for the exclusive segments: the breakdown's, then the
#: enclosing op and cycle marks (drawn only where none of the phases they hold is).
_PRIORITY_PHASES = np.asarray((*PRIORITY, PHASE_OP, PHASE_CYCLE), dtype=np.int64)
_ORDER_OF = np.zeros(len(PHASES), dtype=np.int64)
_ORDER_OF[_PRIORITY_PHASES] = np.arange(len(_PRIORITY_PHASES))


class _SegmentIndex:
    """Exclusive segments (sorted by lane, then time) and where each lane's lie, so that
    a window takes only the segments that overlap it: two binary searches per lane."""

    def __init__(self, segments: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]) -> None:
        self.lane, self.start, self.length, self.klass = segments
        n = len(self.lane)
        cut = np.flatnonzero(self.lane[1:] != self.lane[:-1]) + 1 if n else np.zeros(0, int)
        self.bounds = np.concatenate([[0], cut, [n]]).astype(np.int64)
        self.end = self.start + self.length  # sorted within a lane too: segments are disjoint

    def within(
        self, t0_us: float, t1_us: float
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        pieces = []
        for lo, hi in zip(self.bounds[:-1].tolist(), self.bounds[1:].tolist(), strict=True):
            a = lo + int(np.searchsorted(self.end[lo:hi], t0_us, side="right"))
            b = lo + int(np.searchsorted(self.start[lo:hi], t1_us, side="left"))
            if b > a:
                pieces.append(np.arange(a, b))
        take = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
        return self.lane[take], self.start[take], self.length[take], self.klass[take]


def _lane_segments(
    run: Run, rank: int, lanes: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Exclusive segments of one rank's tensor or phase lanes (lane key: the tensor or
    phase code)."""
    s = run.slices
    m = s.rank == rank
    lane = (s.tensor if lanes == "tensor" else s.phase)[m].astype(np.int64)
    start = s.start_us[m]
    return exclusive_segments(lane, start, start + s.dur_us[m], _ORDER_OF[s.phase[m]])


def _bins(
    run: Run, idx: np.ndarray, rows: np.ndarray, n_rows: int, t0_us: float, t1_us: float,
    max_items: int, expand_rank: int | None, lanes: str, lane_keys: np.ndarray,
) -> dict[str, Any]:  # fmt: skip
    """Each row cut into equal time bins; a slice's time is spread over every bin it covers.

    Per row the slices are first cut into exclusive segments by phase priority (the
    breakdown's, then ``op`` and ``cycle``), so overlapping slices (the tensors of a
    fused group, an op around its children) are counted once: a bin's busy time is at
    most its width, and the time per phase of a row adds up to what the breakdown says.
    Each bin carries its time per phase (the page draws those shares to the pixel, so the
    share of a row drawn in a colour is that phase's share of its time) and the phase it
    spent most time in, ``idle`` (no slice) included. The
    segments are computed once per run (the rank rows' are the breakdown's own) and only
    cut to the window here, so zooming costs a selection, not a sweep of the run.
    """
    s = run.slices
    n_bins = max(1, max_items // n_rows)
    width = (t1_us - t0_us) / n_bins if t1_us > t0_us else 1.0
    a = np.clip(s.start_us[idx], t0_us, t1_us)
    b = np.clip(s.start_us[idx] + s.dur_us[idx], t0_us, t1_us)
    # slices overlapping each bin: +1 at a slice's first bin, -1 after its last
    first = np.clip(np.floor((a - t0_us) / width).astype(np.int64), 0, n_bins - 1)
    last = np.clip(np.ceil((b - t0_us) / width).astype(np.int64) - 1, first, n_bins - 1)
    stride = n_bins + 1
    delta = np.bincount(rows * stride + first, minlength=n_rows * stride) - np.bincount(
        rows * stride + last + 1, minlength=n_rows * stride
    )
    counts = np.cumsum(delta.reshape(n_rows, stride), axis=1)[:, :n_bins]
    # the run's exclusive segments, cut to the window and put in their rows
    if expand_rank is None:
        segments = rank_segments(run)
        found = run.memo("rank_segments_index", lambda: _SegmentIndex(segments))
    else:
        found = run.memo(
            ("lane_segments", expand_rank, lanes),
            lambda: _SegmentIndex(_lane_segments(run, expand_rank, lanes)),
        )
    seg_lane, seg_start, seg_len, seg_class = found.within(t0_us, t1_us)
    sa = np.maximum(seg_start, t0_us)
    sb = np.minimum(seg_start + seg_len, t1_us)
    keep = sb > sa
    if expand_rank is None:  # lane_keys: the sorted ranks of the rows
        seg_row = _row_of(lane_keys, seg_lane)
        keep &= seg_row >= 0
    else:  # lane_keys: the sorted tensor or phase codes of the rows
        pos = np.clip(np.searchsorted(lane_keys, seg_lane), 0, max(len(lane_keys) - 1, 0))
        keep &= lane_keys[pos] == seg_lane if len(lane_keys) else False
        seg_row = pos
    seg_row, seg_start, seg_len = seg_row[keep], sa[keep], (sb - sa)[keep]
    seg_class = seg_class[keep].astype(np.int64)
    priority_phase = _PRIORITY_PHASES
    k = len(priority_phase)
    key = seg_row * k + seg_class
    span = (t1_us - t0_us) + 2.0 * width + 1.0
    # segments come sorted by (row, time): a stable sort on the (row, phase) key alone
    # keeps each key's segments in time order (a radix sort for small integer keys)
    small = np.int16 if n_rows * k < np.iinfo(np.int16).max else np.int64
    order = np.argsort(key.astype(small), kind="stable")
    shifted = (seg_start[order] - t0_us) + key[order] * span
    seg_len = seg_len[order]
    edges = np.arange(stride, dtype=np.float64) * width
    q = (np.arange(n_rows * k, dtype=np.float64) * span)[:, None] + edges[None, :]
    if len(shifted):
        before = np.concatenate([[0.0], np.cumsum(seg_len)])
        j = np.maximum(np.searchsorted(shifted, q, side="right") - 1, 0)
        covered = before[j] + np.clip(q - shifted[j], 0.0, seg_len[j])
    else:
        covered = np.zeros_like(q)
    busy = np.diff(covered, axis=1).reshape(n_rows, k, n_bins)  # row, class, bin
    busy = np.clip(busy, 0.0, width)
    names = [PHASES[p] for p in priority_phase.tolist()] + [IDLE]
    return bucket_table(busy, counts, width, t0_us, names)
