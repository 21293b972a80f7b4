"""Vectorised interval arithmetic: unions and intersections of many ``[start, end)`` spans.

Slices on a rank overlap (every tensor of a fused group draws the same children on its
own lane), so summing durations double-counts. These helpers measure covered time
instead, in numpy, without a Python loop per interval.
"""

from __future__ import annotations

import numpy as np

#: a start or end beyond this is no time (no trace's clock reaches 1e200 µs): such an
#: interval is left out, so that lengths and sums stay finite
MAX_TIME = 1e200


def merge(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of intervals as sorted disjoint ``(starts, ends)`` (an interval whose
    start or end is no time, past :data:`MAX_TIME`, is left out)."""
    start, end = _finite(start, end)
    if not len(start):
        return np.zeros(0), np.zeros(0)
    order = np.argsort(start, kind="stable")
    s = start[order]
    e = np.maximum(end[order], s)
    running = np.maximum.accumulate(e)
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > running[:-1]
    idx = np.flatnonzero(new)
    starts = s[idx]
    ends = np.maximum.reduceat(running, idx)
    return starts, ends


def _finite(start: np.ndarray, end: np.ndarray, *more: np.ndarray) -> tuple[np.ndarray, ...]:
    """The intervals whose start and end are times (a trace's ``inf`` or ``1e308`` would
    make lengths NaN or overflow, and numpy warn), with their other columns."""
    ok = (np.abs(start) < MAX_TIME) & (np.abs(end) < MAX_TIME)
    if ok.all():
        return (start, end, *more)
    return tuple(column[ok] for column in (start, end, *more))


def covered_before(starts: np.ndarray, ends: np.ndarray, t: np.ndarray) -> np.ndarray:
    """For disjoint sorted intervals, the covered length in ``(-inf, t]`` for each ``t``."""
    if not len(starts):
        return np.zeros(len(t))
    lengths = ends - starts
    cum = np.concatenate([[0.0], np.cumsum(lengths)])
    k = np.searchsorted(starts, t, side="right")  # intervals starting at or before t
    full = cum[np.maximum(k - 1, 0)]
    last = np.clip(t - starts[np.maximum(k - 1, 0)], 0.0, lengths[np.maximum(k - 1, 0)])
    return np.where(k > 0, full + last, 0.0)


def intersection_length(
    a_start: np.ndarray, a_end: np.ndarray, b_start: np.ndarray, b_end: np.ndarray
) -> float:
    """Length of (union of A) ∩ (union of B)."""
    sa, ea = merge(a_start, a_end)
    sb, eb = merge(b_start, b_end)
    if not len(sa) or not len(sb):
        return 0.0
    return float((covered_before(sb, eb, ea) - covered_before(sb, eb, sa)).sum())


def exclusive_segments(
    lane: np.ndarray, start: np.ndarray, end: np.ndarray, rank_of: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Cut overlapping intervals into disjoint segments, per lane, by priority.

    ``rank_of[i]`` is interval ``i``'s priority (0 first). At each instant a lane is in
    the first-priority class any of its intervals covers, so the segments of one lane
    never overlap and their lengths add up to the lane's covered time: the same time is
    never counted twice. Returns ``(lane, start, length, priority)`` of each segment,
    sorted by lane then time (zero-length pieces dropped; intervals past :data:`MAX_TIME`
    left out).
    """
    start, end, lane, rank_of = _finite(start, end, lane, rank_of)
    if not len(start):
        z = np.zeros(0)
        return z.astype(np.int64), z, z, z.astype(np.int64)
    k = int(rank_of.max()) + 1
    n = len(start)
    t = np.concatenate([start, np.maximum(end, start)])
    g = np.concatenate([lane, lane]).astype(np.int64)
    c = np.concatenate([rank_of, rank_of]).astype(np.int64)
    d = np.concatenate([np.ones(n, np.int32), -np.ones(n, np.int32)])
    # one sort on (lane, time): lanes a span apart on a single float key
    base = float(t.min())
    span = float(t.max()) - base + 1.0
    lanes = float(g.max() - g.min() + 1)
    if np.isfinite(span * lanes) and span * lanes < 2.0**52:  # the key stays exact
        order = np.argsort((t - base) + (g - g.min()).astype(np.float64) * span, kind="stable")
    else:  # times too far apart for one float key
        order = np.lexsort((t, g))
    t, g, c, d = t[order], g[order], c[order], d[order]
    # active count of every class after each point (each lane's counts return to 0)
    active = np.zeros((k, len(t)), dtype=np.int32)
    for i in range(k):
        active[i] = np.cumsum(np.where(c == i, d, 0))
    busy = active > 0
    has_any = busy.any(axis=0)
    first = np.argmax(busy, axis=0)  # first class active = highest priority
    length = np.zeros(len(t))
    same = g[1:] == g[:-1]
    length[:-1] = np.where(same, t[1:] - t[:-1], 0.0)
    sel = has_any & (length > 0)
    return g[sel], t[sel], length[sel], first[sel]
