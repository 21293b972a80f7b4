"""Vectorised interval arithmetic: unions and intersections of many ``[start, end)`` spans.

Slices on a rank overlap (every tensor of a fused group draws the same children on its
own lane), so summing durations double-counts. These helpers measure covered time
instead, in numpy, without a Python loop per interval.
"""

from __future__ import annotations

import numpy as np


def union_by_group(
    group: np.ndarray, start: np.ndarray, end: np.ndarray, n_groups: int
) -> np.ndarray:
    """Length of the union of the intervals of each group (``group`` in ``[0, n_groups)``)."""
    out = np.zeros(n_groups, dtype=np.float64)
    if not len(start):
        return out
    order = np.lexsort((start, group))
    g = group[order]
    s = start[order]
    e = np.maximum(end[order], s)
    base = min(float(s.min()), 0.0)
    span = float(e.max()) - base + 1.0
    # cumulative max of the end within each group: offset groups apart so one running
    # max serves all of them (groups are contiguous after the sort)
    shifted = (e - base) + g.astype(np.float64) * span
    running = np.maximum.accumulate(shifted)
    prev = np.empty_like(running)
    prev[0] = -np.inf
    prev[1:] = running[:-1]
    first = np.ones(len(g), dtype=bool)
    first[1:] = g[1:] != g[:-1]
    prev_end = prev - g.astype(np.float64) * span + base
    prev_end[first] = -np.inf
    gain = e - np.maximum(s, prev_end)
    np.maximum(gain, 0.0, out=gain)
    return np.bincount(g, weights=gain, minlength=n_groups)[:n_groups]


def merge(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of intervals as sorted disjoint ``(starts, ends)``."""
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
