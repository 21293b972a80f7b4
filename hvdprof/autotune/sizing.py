"""How many steps a window needs for a round to decide: windows sized to the job's noise.

A round decides by the sequential test of "no better" against "8% better" on paired
comparisons with the default. How many comparisons that takes depends on how noisy one
comparison is, and that depends on the job: on a quiet job with long steps three steps a
window are plenty; on a tiny job whose windows' scores ranged over 4x within 150 steps,
70 paired steps still left an interval of "-55% to +126%", so the round could only end
undecided after having explored at the job's expense.

The usual sample-size rule tells how many comparisons ``n`` of standard deviation
``sigma`` resolve an effect ``delta`` at one-sided error rate ``alpha`` and power ``1 -
beta``: ``n = ((z_alpha + z_beta) * sigma / delta) ** 2``, i.e. the interval around 0 is
narrow enough that an 8% gain falls outside it four times in five. One window's noise
shrinks with its length (the steps' noise averages out), roughly as ``1 / sqrt(steps)``,
so a window twice as long costs twice the steps but needs half the comparisons: longer
windows pay when the fixed cost of a window (the partial step in which parameters change
and the settle step, both discarded) is small against them, and they are the only way to
decide at all when the comparisons the budget holds are too few.

``plan_windows`` finds the shortest window, doubling from the current one, at which the
confirmation share of the steps left holds enough comparisons; the controller grows its
windows to it (never shrinks them: one noisy estimate must not flap the size). When no
window size within the budget suffices even for a gain of ``GIVE_UP_GAIN`` (far more than
the 5-30% that settings differ by), the job is too noisy to tune at this budget: the round
ends at once, keeps the default and says so, rather than spend the budget exploring.
Pure functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: the sequential test's design (as ``tuner``): an 8% gain, 2.5% one-sided error per
#: finalist, 80% power
DECIDE_GAIN = math.log(1.08)
Z_ALPHA = 1.96
Z_BETA = 0.84
#: fewest confirmation comparisons any decision takes (``tuner.MIN_CONFIRM``)
MIN_COMPARISONS = 3
#: share of a round's windows kept for confirmation (``tuner.confirm_windows``)
CONFIRM_SHARE = 0.4
#: a round too noisy to confirm even a gain this large (25%) within the budget gives up
GIVE_UP_GAIN = math.log(1.25)
#: measured incumbent differences needed before windows are sized (fewer: the prior rules)
MIN_NOISE_DIFFERENCES = 3
#: ... and before a round gives up as too noisy (one wild window must not end a round)
GIVE_UP_DIFFERENCES = 5
#: windows a round must still hold at the largest size considered: fewer leave screening
#: too few comparisons to find anything
MIN_WINDOWS = 20


def comparisons_to_decide(comparison_std: float, gain: float = DECIDE_GAIN) -> int:
    """Paired comparisons that resolve a log gain ``gain`` at ``comparison_std`` noise.

    >>> comparisons_to_decide(0.05), comparisons_to_decide(0.1), comparisons_to_decide(0.2)
    (4, 14, 53)
    """
    if comparison_std <= 0:
        return MIN_COMPARISONS
    return max(MIN_COMPARISONS, math.ceil(((Z_ALPHA + Z_BETA) * comparison_std / gain) ** 2))


def scaled_std(window_std: float, steps: int, new_steps: int) -> float:
    """One window's noise at ``new_steps`` steps, from its noise at ``steps``.

    >>> round(scaled_std(0.1, 3, 12), 3)
    0.05
    """
    return window_std * math.sqrt(steps / max(new_steps, 1))


@dataclass(frozen=True, slots=True)
class WindowPlan:
    """A window size and what the steps left hold at it."""

    steps: int  # measured steps per window
    windows: int  # windows the steps left hold at that size
    needed: int  # confirmation comparisons that resolve an 8% gain at that size
    affordable: int  # confirmation comparisons the windows left hold
    needed_large: int  # ... that resolve a gain of GIVE_UP_GAIN

    @property
    def decidable(self) -> bool:
        """True when the budget left can resolve an 8% gain at this size."""
        return self.affordable >= self.needed

    @property
    def hopeless(self) -> bool:
        """True when not even a gain of ``GIVE_UP_GAIN`` could be confirmed."""
        return self.affordable < self.needed_large


def plan_at(
    window_std: float, steps: int, new_steps: int, overhead: int, steps_left: int
) -> WindowPlan:
    """What the steps left hold with windows of ``new_steps`` measured steps, each costing
    ``overhead`` more (the discarded partial and settle steps)."""
    comparison_std = math.sqrt(2.0) * scaled_std(window_std, steps, new_steps)
    windows = max(0, steps_left) // max(1, new_steps + overhead)
    return WindowPlan(
        steps=new_steps,
        windows=windows,
        needed=comparisons_to_decide(comparison_std),
        affordable=int(windows * CONFIRM_SHARE) // 2,
        needed_large=comparisons_to_decide(comparison_std, GIVE_UP_GAIN),
    )


def plan_windows(
    window_std: float, steps: int, overhead: int, steps_left: int, max_steps: int
) -> WindowPlan:
    """The shortest window, doubling from ``steps`` up to ``max_steps`` (and no longer than
    leaves ``MIN_WINDOWS`` windows), at which the steps left can resolve an 8% gain; the
    longest considered when none can.

    >>> plan_windows(0.05, 3, 2, 280, 24).steps  # quiet: three steps are enough
    3
    >>> p = plan_windows(0.12, 3, 2, 280, 24)  # noisy: longer windows
    >>> p.steps, p.decidable
    (12, False)
    >>> plan_windows(0.4, 3, 2, 280, 24).hopeless  # far too noisy for this budget
    True
    """
    plan = plan_at(window_std, steps, steps, overhead, steps_left)
    size = steps
    while not plan.decidable:
        size *= 2
        if size > max_steps:
            break
        candidate = plan_at(window_std, steps, size, overhead, steps_left)
        if candidate.windows < MIN_WINDOWS:
            break
        plan = candidate
    return plan
