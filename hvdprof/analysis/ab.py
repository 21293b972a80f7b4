"""``hvdprof ab``'s statistics: baseline and candidate judged pair by pair.

A shared CI runner changes speed between runs (on this project's 2-core VM the demo
job's median step was 3.8 ms in one hour and 9.5 ms in the next), so a gate that compares
a run with a baseline recorded elsewhere, or even with one recorded a minute before,
judges the machine. Here the two sides run in blocks, one run of each per block, the
order inside a block randomised and balanced (AB BA, or BA AB, in each pair of blocks:
ABBA), and each block gives one number, the log of the candidate's step time over the
baseline's. What slows the machine for a minute slows both runs of a block alike and
cancels in their ratio.

The blocks' log ratios are judged with the Wilcoxon signed-rank test's own interval
for their centre, the Hodges-Lehmann estimate (the median of the Walsh averages): exact
for any number of blocks (the signed-rank distribution is counted, not approximated),
free of any assumption of normality, and one bad block moves it by one rank, not by its
size. A bootstrap of a median needs dozens of blocks to cover its nominal level; the
gate has a dozen.

The gate looks after several blocks and stops once the answer is clear. Each look that
could fail the candidate spends its share of the error rate (Bonferroni over the planned
looks), so looking often does not inflate false failures; a look that passes (the whole
interval below the margin) needs no share, since passing early can only lower them.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hvdprof.analysis.result import Result

#: Blocks before the first look: at the default confidence, split over the looks, fewer
#: blocks cannot bound the slowdown at all (2**-8 is the least a signed-rank test reaches
#: with 8 blocks, under a look's 1%).
MIN_BLOCKS = 8
#: The most blocks one gate runs (its budget usually stops it first).
MAX_BLOCKS = 20
#: Above this many blocks the signed-rank distribution is taken as normal (it is, closely).
EXACT_UP_TO = 300


def signed_rank_cdf(n: int) -> np.ndarray:
    """``P(T+ <= t)`` for t = 0..n(n+1)/2: the exact null distribution of the signed-rank
    statistic of ``n`` pairs (each subset of the ranks 1..n is equally likely)."""
    top = n * (n + 1) // 2
    counts = np.zeros(top + 1, dtype=float)
    counts[0] = 1.0
    for rank in range(1, n + 1):  # the subsets with and without ``rank``
        counts[rank:] = counts[rank:] + counts[: top + 1 - rank].copy()
    return np.cumsum(counts) / 2.0**n


def _order_index(n: int, alpha: float) -> int:
    """k: the largest with ``P(T+ <= k-1) <= alpha`` (0: no bound at this level)."""
    if n <= EXACT_UP_TO:
        cdf = signed_rank_cdf(n)
        return int(np.searchsorted(cdf, alpha, side="right"))  # cdf[k-1] <= alpha
    mean = n * (n + 1) / 4.0
    sd = math.sqrt(n * (n + 1) * (2 * n + 1) / 24.0)
    from statistics import NormalDist

    return max(0, math.floor(mean + NormalDist().inv_cdf(alpha) * sd + 0.5))


def walsh_averages(x: np.ndarray) -> np.ndarray:
    """Every ``(x_i + x_j) / 2`` for i <= j, sorted."""
    i, j = np.triu_indices(len(x))
    return np.sort((x[i] + x[j]) / 2.0)


def hodges_lehmann(x: Sequence[float], alpha: float) -> tuple[float, float, float]:
    """The centre of ``x`` (the median of its Walsh averages) and its signed-rank bounds,
    each one-sided at ``alpha``: ``(low, estimate, high)``; ``-inf``/``inf`` where ``x``
    has too few values to bound it at that level."""
    values = np.asarray(x, dtype=float)
    if len(values) == 0:
        return -math.inf, math.nan, math.inf
    w = walsh_averages(values)
    k = _order_index(len(values), alpha)
    estimate = float(np.median(w))
    if k < 1:
        return -math.inf, estimate, math.inf
    return float(w[k - 1]), estimate, float(w[len(w) - k])


def look_schedule(min_blocks: int = MIN_BLOCKS, max_blocks: int = MAX_BLOCKS) -> list[int]:
    """After how many blocks the gate looks: from ``min_blocks``, about a quarter more
    blocks each time, and at ``max_blocks`` (few looks: each one that may fail costs
    its share of the error rate)."""
    looks = [min_blocks]
    while looks[-1] < max_blocks:
        looks.append(min(max_blocks, max(looks[-1] + 2, math.ceil(looks[-1] * 1.25))))
    return looks


def block_orders(blocks: int, seed: int) -> list[tuple[str, str]]:
    """The order of the two sides in each block: AB BA or BA AB in each pair of blocks
    (chosen at random), so a drift within a pair of blocks and whichever runs second
    (a warm cache) weigh on both sides alike."""
    rng = random.Random(seed)
    out: list[tuple[str, str]] = []
    while len(out) < blocks:
        first = ("baseline", "candidate") if rng.random() < 0.5 else ("candidate", "baseline")
        out.extend([first, (first[1], first[0])])
    return out[:blocks]


class PairedJudgement(Result):
    """The gate's answer after some blocks: the candidate's slowdown (B/A - 1) and its
    interval, and whether it is clear. Too few blocks to bound it at ``alpha`` leave the
    interval open: ``low`` is then -1 (B/A - 1 is never less) and ``high`` None, in
    Python as in the JSON, which has no infinity."""

    blocks: int
    margin: float  # the --fail-on margin, a fraction (0.05)
    alpha: float  # one-sided error rate this look used for each bound
    estimate: float  # B/A - 1 at the Hodges-Lehmann centre of the log ratios
    low: float  # B/A - 1 is at least this (one-sided at alpha); -1: unbounded
    high: float | None  # ... and at most this; None: unbounded
    failed: bool  # low > margin: slower by more than the margin, significantly
    passed: bool  # high <= margin: not slower by more than the margin, significantly

    @property
    def clear(self) -> bool:
        return self.failed or self.passed


def judge_pairs(log_ratios: Sequence[float], margin: float, alpha: float) -> PairedJudgement:
    """Judge the blocks' ``log(candidate / baseline)`` against ``margin`` (a fraction),
    each bound one-sided at ``alpha``."""
    if not len(log_ratios):
        raise ValueError("judge_pairs: no blocks to judge")
    low, mid, high = hodges_lehmann(log_ratios, alpha)
    bar = math.log1p(margin)
    return PairedJudgement(
        blocks=len(log_ratios),
        margin=margin,
        alpha=alpha,
        estimate=math.expm1(mid),
        low=math.expm1(low),  # -1 when unbounded: "at least 100% faster"
        high=math.expm1(high) if math.isfinite(high) else None,
        failed=math.isfinite(low) and low > bar,
        passed=math.isfinite(high) and high <= bar,
    )


def blocks_to_decide(j: PairedJudgement) -> int | None:
    """About how many blocks would have made an undecided judgement clear, had they
    spread as these did: the interval narrows as one over the square root of the blocks,
    and the bound that faces the margin must pass it (None: the estimate sits on the
    margin, or the interval is open). A budget-ended gate says so, so that its user
    knows whether a longer budget or a steadier runner is what is missing."""
    if j.high is None or j.low <= -1.0 or j.clear:
        return None
    centre, bar = math.log1p(j.estimate), math.log1p(j.margin)
    if centre > bar:  # the low bound must rise past the margin
        half, gap = centre - math.log1p(j.low), centre - bar
    else:  # the high bound must fall to it
        half, gap = math.log1p(j.high) - centre, bar - centre
    if gap < 1e-3 or half <= 0.0:  # within 0.1% of the margin: no budget decides it
        return None
    return max(j.blocks + 1, math.ceil(j.blocks * (half / gap) ** 2))


@dataclass
class SequentialGate:
    """When to look and at what level: ``confidence`` holds over all the looks that can
    fail the candidate, however early one of them stops the gate."""

    margin: float
    confidence: float = 0.95
    min_blocks: int = MIN_BLOCKS
    max_blocks: int = MAX_BLOCKS

    @property
    def looks(self) -> list[int]:
        return look_schedule(self.min_blocks, self.max_blocks)

    @property
    def alpha_per_look(self) -> float:
        return (1.0 - self.confidence) / len(self.looks)

    def is_look(self, blocks: int) -> bool:
        return blocks in self.looks

    def judge(self, log_ratios: Sequence[float]) -> PairedJudgement:
        """The judgement after these blocks (a look; or the last one, when the budget
        ends between looks: it takes the share of a look not yet made)."""
        return judge_pairs(log_ratios, self.margin, self.alpha_per_look)
