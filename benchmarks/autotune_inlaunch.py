"""Within-launch comparisons for ``autotune_bench.py``: the cost while tuning and the tuned
job against the untuned one after the budget, each measured inside the tuned launch.

Why not two launches: on a 2-core machine two launches of the identical job a minute
apart differ by 15-30% in median step time (the A/A figure, ``two_launch_aa``, measures
it per job from the untuned launches), so "tuned launch / untuned launch" measured the
machine, not the tuner: 0.82-1.12 on a job where both sides ran the same configuration.
Inside one launch that noise cancels; what is left is the noise of blocks of steps a few
seconds apart.

Both figures are throughput ratios of mean step times, each step capped at ``CAP`` times
its reference's median step time (the same cap on both sides). Means, not medians,
because tuning is a mixture: a candidate twice as slow for 30% of the steps costs the job
30%, and a median of the mixture would not see it. The cap keeps one preempted step (10x
and more on a shared machine) from deciding the figure; a configuration's own slowness,
even a bad candidate's, stays well inside it.

* ``while_tuning``: the tuning period's steps (after the tuner's warmup, to the budget),
  every one counted, the steps in which parameters switched, the settle steps after them
  and those that ran while the tuner's worker fitted its model included, against the
  default's level around each step. The default's steps are the untuned job's, with the
  tuner not working: ``--pre-steps`` steps before the tuner starts (it is detached from
  the cycle until then), the windows the tuner itself scored as default while tuning
  (its worker idle; its first window left out: it pays for learning the job's
  structure), and the check's untuned blocks after the budget. A step's reference is the
  capped mean of the ``NEAREST`` default steps before it and the ``NEAREST`` after it:
  the default's windows surrounding it, so a launch whose speed drifts is compared with
  the default as it ran then. Where the tuner stopped running the default early (a
  candidate became the incumbent, or it kept the default at once and only watched), the
  surrounding default steps are the ones before the tuner started and the check's:
  ``median_distance_steps`` says how far they were, ``bracketed`` which share of the
  tuning steps had default steps on both sides.
* ``after_budget`` (the check): after the budget and the margin, blocks of ``steps``
  steps alternate, in ABBA order, between the tuned job (the tuner attached, observer and
  proposer, running what it runs: its decision, or whatever it explores) and the
  untuned job (the tuner detached from the cycle, the default in force), switched
  through the same in-process path the truth phase uses. Each pair's ratio is the
  untuned block's mean step time over the tuned one's; the figure is the median of the
  pairs, with a distribution-free 95% interval (``median_interval``). The tuner's
  residual cost after the budget (its watch windows scored on its worker thread, its
  observer) is paid by the tuned blocks only; blocks are at least two of the tuner's
  windows and ``MIN_SPAN_S`` long, so its windows complete inside them. When the tuner
  kept the default, both sides run the default and the figure is the watching tuner's
  own cost: 1.0 within the interval when it costs nothing. A tuner still undecided at
  the budget keeps tuning in the tuned blocks; it counts its round's steps by their
  numbers, so the untuned blocks' steps count too, and its round ends sooner than it
  would alone (``tuned_steps_switched_by_tuner`` says how much it still switched).

Many short blocks rather than a few long ones: on the cycle-bound job a block's mean
step time moves by about 10% with the phase its steps happen to take against the cycle
thread (plateaus of 9.5 and 12 ms), and every block draws a new phase. With both sides
the untuned job (the tuner detached on both: an A/A), the median of 10 pairs of 30 steps
read 0.93 and 1.05, of 24 pairs of 10 steps 0.998, 0.951 and 1.000 (five launches): the
block is the unit of noise, so more blocks narrow the figure, and its interval says what
is left, a few percent either side in one run. A cost smaller than that is not resolved.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from typing import Any

#: a step counts at most this many times its reference's median step time
CAP = 4.0
#: default steps on each side that make one step's reference (at least; or a tuner window)
NEAREST = 24
#: the untuned steps before the tuner starts that are not compared (the launch warming up)
PRE_WARMUP = 10
#: seconds of steps, at least, in each side of a reference, each check block and the
#: compared steps before the tuner: the tiny job's blocks of 24 steps (about 30 ms) were
#: at the mercy of one preempted step (pairs 0.71-1.24 in one launch)
MIN_SPAN_S = 0.1
PRE_MIN_S = 0.3


def steps_for(seconds: float, step_s: float) -> int:
    """Steps of ``step_s`` seconds that fill ``seconds``."""
    return math.ceil(seconds / step_s) if step_s > 0 else 0


def capped_mean(times: Sequence[float], cap: float) -> float:
    return sum(min(t, cap) for t in times) / len(times)


def reference_steps(
    trace: Sequence[Sequence[Any]],
    log: Sequence[dict[str, Any]],
    default: Sequence[Any],
    check_blocks: Sequence[dict[str, Any]],
    before: Sequence[float],
) -> list[tuple[int, float]]:
    """(position, seconds) of the default's steps with the tuner not working, positions
    counted from the tuner's start: the untuned steps before it (``before``, the first
    ``PRE_WARMUP`` left out: the launch warming up), the tuner's scored default windows
    while tuning (its first left out), and the check's untuned blocks."""
    windows = [
        (row["first_step"], row["last_step"])
        for row in log[1:]
        if row["phase"] == "tune" and list(row["params"]) == list(default)
    ]
    out = [(j - len(before), t) for j, t in enumerate(before) if j >= PRE_WARMUP]
    out += [
        (i, row[1]) for i, row in enumerate(trace) if any(lo <= row[0] <= hi for lo, hi in windows)
    ]
    for block in check_blocks:
        if block["side"] == "untuned":
            out += [(block["first"] + j, t) for j, t in enumerate(block["times"])]
    return sorted(set(out))


def while_tuning(
    times: Sequence[float],
    start: int,
    end: int,
    reference: Sequence[tuple[int, float]],
    nearest: int,
) -> dict[str, Any] | None:
    """The tuning period ``[start, end)`` against the default's level around each step:
    the ``nearest`` default steps before it and the ``nearest`` after it (from one side
    only where the other has none); None without default steps to compare with."""
    if not reference or end <= start:
        return None
    nearest = max(nearest, steps_for(MIN_SPAN_S, statistics.median(t for _, t in reference)))
    default_sum = tuning_sum = 0.0
    bracketed, distances = 0, []
    for i in range(start, end):
        before = [r for r in reference if r[0] <= i][-nearest:]
        after = [r for r in reference if r[0] > i][:nearest]
        near = before + after
        ref_times = [t for _, t in near]
        cap = CAP * statistics.median(ref_times)
        default_sum += capped_mean(ref_times, cap)
        tuning_sum += min(times[i], cap)
        bracketed += bool(before and after)
        distances.append(statistics.median(abs(j - i) for j, _ in near))
    return {
        "vs_default": round(default_sum / tuning_sum, 4),
        "tuning_steps": end - start,
        "default_steps": len(reference),
        "default_steps_in_tuning": sum(start <= j < end for j, _ in reference),
        "nearest_each_side": nearest,
        "bracketed": round(bracketed / (end - start), 3),
        "median_distance_steps": statistics.median(distances),
    }


def after_budget(blocks: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The check's paired blocks: per pair, the untuned block's capped mean step time
    over the tuned one's (> 1: the tuned job is faster); None without a whole pair."""
    pairs: list[float] = []
    medians: list[float] = []
    tuned_sides = [b for b in blocks if b["side"] == "tuned"]
    by_pair = {(b["pair"], b["side"]): b for b in blocks}
    for tuned in tuned_sides:
        untuned = by_pair.get((tuned["pair"], "untuned"))
        if untuned is None:
            continue
        cap = CAP * statistics.median(untuned["times"])
        pairs.append(capped_mean(untuned["times"], cap) / capped_mean(tuned["times"], cap))
        medians.append(statistics.median(untuned["times"]) / statistics.median(tuned["times"]))
    if not pairs:
        return None
    return {
        "vs_untuned": round(statistics.median(pairs), 4),
        "interval95": [round(x, 4) for x in median_interval(pairs)],
        "pairs": [round(p, 4) for p in pairs],
        "spread": [round(min(pairs), 4), round(max(pairs), 4)],
        "of_block_medians": round(statistics.median(medians), 4),
        "steps_per_block": len(blocks[0]["times"]),
        "tuned_params": [b["params"] for b in tuned_sides],
        "tuned_steps_switched_by_tuner": sum(b.get("switched", 0) for b in tuned_sides),
    }


def interval_half_width(found: dict[str, Any]) -> float:
    """The wider side of ``after_budget``'s 95% interval, as a fraction of its median."""
    return _wider_side(*found["interval95"], found["vs_untuned"])


def relative_half_width(values: Sequence[float]) -> float:
    """The wider side of the 95% interval of ``values``' median, as a fraction of it.

    >>> relative_half_width([1.0] * 12)
    0.0
    """
    return _wider_side(*median_interval(values), statistics.median(values))


def _wider_side(lo: float, hi: float, median: float) -> float:
    return max(hi - median, median - lo) / median if median > 0 else math.inf


def median_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """A distribution-free interval for the median: the order statistics the binomial
    (sign test) puts at ``level`` or more (all of them when there are too few values)."""
    ordered = sorted(values)
    n = len(ordered)
    k = 0  # values cut from each end
    while k + 1 < n - k - 1:
        tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n  # P(fewer than k+1 below)
        if 2 * tail > 1 - level:
            break
        k += 1
    return ordered[k], ordered[n - 1 - k]


def two_launch_aa(
    untuned: Sequence[Sequence[float]], ranges: dict[str, tuple[int, int]]
) -> dict[str, Any]:
    """Consecutive untuned launches of the same job against each other (launch order), by
    median step time over the same steps: what the old two-launch figure's noise is."""
    out: dict[str, Any] = {"launches": len(untuned)}
    for name, (lo, hi) in ranges.items():
        ratios = [
            statistics.median(a[lo:hi]) / statistics.median(b[lo:hi])
            for a, b in itertools.pairwise(untuned)
            if a[lo:hi] and b[lo:hi]
        ]
        out[name] = {
            "ratios": [round(r, 4) for r in ratios],
            "spread": [round(min(ratios), 4), round(max(ratios), 4)] if ratios else None,
            "max_abs_log": round(max(abs(math.log(r)) for r in ratios), 4) if ratios else None,
        }
    return out
