"""``hvdprof history``: where a series of nightly runs changed speed, and why.

A nightly job's step time wanders by a few percent from night to night and jumps once in
a while (a noisy neighbour); a regression is a *lasting* shift. Change points are found
with E-divisive means (Matteson and James, "A nonparametric approach for multiple change
point analysis of multivariate data", JASA 2014; the method MongoDB's and Apache
Otava's performance-history tools use): split the series where the energy distance
between the two sides, scaled by their sizes, is largest, then split each part again,
and keep a split only while a permutation test says it is significant (the observations
shuffled within their segment, the largest statistic recomputed; p = (1 + as large) /
(1 + permutations)). A single outlier cannot be split off (a segment holds at least
``min_size`` runs) and shuffling it anywhere gives as large a statistic, so it is not
significant. The series is the log of each run's step time, so a 10% shift weighs the
same on a fast job as on a slow one.

MongoDB's ``signal-processing-algorithms`` implements this, but it pins numpy below 2
and brings gevent: the method is written here (prefix sums of the distance matrix make
each candidate split O(1)). Each shift's cause is the ``diff`` of the pooled runs of the
segment before it and the segment after it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
import numpy as np

from hvdprof.analysis.diff import diff_summaries
from hvdprof.analysis.pooling import pool_summaries
from hvdprof.analysis.result import Result
from hvdprof.analysis.summary import RunSummary

#: The fewest runs on either side of a change point.
MIN_SEGMENT = 3
#: Permutations per significance test (p resolves to 1/200).
PERMUTATIONS = 199
#: A split is kept when its permutation p-value is at most this.
SIGNIFICANCE = 0.05
HISTORY_SEED = 17


def _prefix(d: np.ndarray) -> np.ndarray:
    """2-D prefix sums: the sum of ``d[a:b, c:e]`` in four lookups."""
    p = np.zeros((d.shape[0] + 1, d.shape[1] + 1))
    p[1:, 1:] = d.cumsum(0).cumsum(1)
    return p


def _block(p: np.ndarray, a: int, b: int, c: int, e: int) -> float:
    return float(p[b, e] - p[a, e] - p[b, c] + p[a, c])


def _best_split(p: np.ndarray, start: int, end: int, min_size: int) -> tuple[int, float]:
    """The split ``tau`` of ``[start, end)`` with the largest scaled energy statistic."""
    best, best_q = -1, -math.inf
    for tau in range(start + min_size, end - min_size + 1):
        n, m = tau - start, end - tau
        between = _block(p, start, tau, tau, end) / (n * m)
        within_x = _block(p, start, tau, start, tau) / (n * (n - 1)) if n > 1 else 0.0
        within_y = _block(p, tau, end, tau, end) / (m * (m - 1)) if m > 1 else 0.0
        q = (n * m / (n + m)) * (2.0 * between - within_x - within_y)
        if q > best_q:
            best, best_q = tau, q
    return best, best_q


def _best_over(x: np.ndarray, cuts: Sequence[int], min_size: int) -> tuple[int, float]:
    p = _prefix(np.abs(x[:, None] - x[None, :]))
    best, best_q = -1, -math.inf
    for start, end in itertools.pairwise(cuts):
        if end - start >= 2 * min_size:
            tau, q = _best_split(p, start, end, min_size)
            if q > best_q:
                best, best_q = tau, q
    return best, best_q


@dataclass
class ChangePoint:
    index: int  # the first run after the shift (0-based)
    statistic: float
    p_value: float


def e_divisive(
    x: Sequence[float],
    min_size: int = MIN_SEGMENT,
    permutations: int = PERMUTATIONS,
    significance: float = SIGNIFICANCE,
    seed: int = HISTORY_SEED,
) -> list[ChangePoint]:
    """The significant change points of ``x``, in order: each is the index of the first
    value after a shift."""
    values = np.asarray(x, dtype=float)
    rng = np.random.default_rng(seed)
    cuts = [0, len(values)]
    found: list[ChangePoint] = []
    while True:
        tau, q = _best_over(values, cuts, min_size)
        if tau < 0:
            break
        as_large = 0
        for _ in range(permutations):
            shuffled = values.copy()
            for start, end in itertools.pairwise(cuts):
                shuffled[start:end] = rng.permutation(shuffled[start:end])
            if _best_over(shuffled, cuts, min_size)[1] >= q:
                as_large += 1
        p_value = (1 + as_large) / (1 + permutations)
        if p_value > significance:
            break
        found.append(ChangePoint(tau, q, p_value))
        cuts = sorted([*cuts, tau])
    return sorted(found, key=lambda c: c.index)


class Shift(Result):
    """One lasting change: the first run after it, the step time on each side, the cause."""

    index: int
    name: str  # that run's file
    p_value: float
    before_ms: float  # median step time of the segment before
    after_ms: float
    change: float  # after / before - 1
    cause: str | None  # the diff's cause row, e.g. "rank 1: compute"
    cause_ms: float | None
    verdict: str  # the diff of the pooled segments
    #: :meth:`sentence`, as the JSON carries it
    said: str = msgspec.field(default="", name="sentence")

    def __post_init__(self) -> None:
        self.said = self.sentence()

    def sentence(self) -> str:
        cause = f" Cause: {self.cause} {self.cause_ms:+.2f} ms per step." if self.cause else ""
        return (
            f"Run {self.index + 1} ({self.name}) starts a shift: step {self.before_ms:.3f} -> "
            f"{self.after_ms:.3f} ms ({self.change:+.1%}; p = {self.p_value:.3f}).{cause}"
        )


class HistoryRun(Result):
    name: str  # its file
    step_ms: float


class History(Result):
    runs: list[HistoryRun]
    shifts: list[Shift] = msgspec.field(default_factory=list)
    method: str = "E-divisive means (Matteson and James 2014), permutation test"
    min_segment: int = MIN_SEGMENT
    permutations: int = PERMUTATIONS
    significance: float = SIGNIFICANCE
    #: :meth:`said` (kept current by :func:`find_history`)
    verdict: str = ""

    def __post_init__(self) -> None:
        self.verdict = self.said()

    def said(self) -> str:
        if not self.shifts:
            return f"No lasting shift in the step time of {len(self.runs)} runs."
        return " ".join(s.sentence() for s in self.shifts)


def find_history(summaries: Sequence[RunSummary], names: Sequence[str]) -> History:
    """The lasting shifts in the step time of ``summaries`` (in run order)."""
    steps = [s.step_ms for s in summaries]
    out = History([HistoryRun(n, s) for n, s in zip(names, steps, strict=True)])
    usable = all(s > 0 and math.isfinite(s) for s in steps)
    if len(steps) < 2 * MIN_SEGMENT or not usable:
        return out
    points = e_divisive(np.log(steps))
    bounds = [0, *(c.index for c in points), len(steps)]
    for k, cp in enumerate(points):
        before = list(summaries[bounds[k] : cp.index])
        after = list(summaries[cp.index : bounds[k + 2]])
        d = diff_summaries(
            pool_summaries(before, f"runs {bounds[k] + 1}-{cp.index}"),
            pool_summaries(after, f"runs {cp.index + 1}-{bounds[k + 2]}"),
        )
        b_ms = float(np.median([s.step_ms for s in before]))
        a_ms = float(np.median([s.step_ms for s in after]))
        out.shifts.append(
            Shift(
                index=cp.index,
                name=names[cp.index],
                p_value=cp.p_value,
                before_ms=b_ms,
                after_ms=a_ms,
                change=a_ms / b_ms - 1.0,
                cause=d.cause.key if d.cause else None,
                cause_ms=d.cause.delta_ms if d.cause else None,
                verdict=d.verdict or "",
            )
        )
    out.verdict = out.said()
    return out
