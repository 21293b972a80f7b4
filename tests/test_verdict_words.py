"""The verdicts' words say what their numbers say (constructed inputs, no processes).

* A rank not named although its mean excess is above the bar: the sentence names the
  correction for testing several ranks (Holm's), with the confidence it needed and had.
* A rank slow in every step but last in only some: said as such, not as an intermittent
  fault, and why (ranks sharing cores).
* The GPU card names a rank as standing out only for a material difference.
* Autotune's end line never calls a setting that measured slower "promising".
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from hvdprof.analysis.device import STANDS_OUT_POINTS, RankGpu, _stands_out
from hvdprof.analysis.stragglers import (
    ALPHA,
    RankStraggle,
    Stragglers,
    _culprit_verdict,
    _no_culprit_verdict,
)
from hvdprof.autotune.summary import end_line
from hvdprof.autotune.tuner import Decision
from hvdprof.common.records import TunableParams
from hvdprof.config import Config


def eight_ranks(top_p: float, top_cost_ms: float) -> tuple[Stragglers, list[RankStraggle]]:
    """Eight ranks; rank 3's own work 10.8 ms longer than the others' (interval
    9.09-12.45 ms for it alone), against a bar of 8.86 ms."""
    out = Stragglers(source="source", own_work_known=True, step_ms=88.6, spread_ms=3.0)
    ranks = [
        RankStraggle(rank=r, p_value=1.0, own_excess_ms=-1.5, cost_per_step_ms=1.0)
        for r in range(8)
        if r != 3
    ]
    top = RankStraggle(
        rank=3,
        own_excess_ms=10.8,
        own_excess_low_ms=9.09,
        own_excess_high_ms=12.45,
        p_value=top_p,
        cost_per_step_ms=top_cost_ms,
        last_count=60,
    )
    ranks.insert(0, top)
    out.most_often_last = 3
    return out, ranks


def test_not_named_for_the_correction_says_so_in_plain_words() -> None:
    # p 0.012: above the bar with 98.8% confidence, short of the 1 - 0.05/8 = 99.4% that
    # Holm's correction asks of the first of 8 ranks (the interval alone would name it)
    out, ranks = eight_ranks(top_p=0.012, top_cost_ms=9.5)
    verdict = _no_culprit_verdict(out, ranks, 299, 8.86, "")
    assert verdict.startswith("No straggler: the evidence is too thin."), verdict
    assert "95% interval 9.09-12.45 ms for that rank alone" in verdict
    assert "8 ranks were tested at once" in verdict and "Holm's correction" in verdict
    assert f"above the bar with {1 - ALPHA / 8:.1%} confidence" in verdict, verdict
    assert "it was with 98.8% (one-sided p 0.012, needed 0.006" in verdict, verdict
    assert out.thin


def test_a_sure_excess_that_held_no_one_is_not_called_thin_evidence() -> None:
    out, ranks = eight_ranks(top_p=1e-9, top_cost_ms=2.1)
    verdict = _no_culprit_verdict(out, ranks, 299, 8.86, "")
    assert "too thin" not in verdict and not out.thin
    assert "rank 3's own work took 10.8 ms per step more" in verdict
    assert "held the others only 2.10 ms per step on average, under the 8.86 ms" in verdict


def culprit(not_held_ms: float, held_share: float, last_share: float) -> str:
    """A rank named for 299 steps, 26.7 ms over the others' own work (median) in the steps
    it held, ``not_held_ms`` in the others."""
    out = Stragglers(
        source="source", own_work_known=True, steps_judged=299, step_ms=88.0, cost_ms=9.9,
        cost_low_ms=9.0, cost_high_ms=10.8, held_share=held_share, held_floor_ms=9.0,
        lateness_ms=9.9,
    )  # fmt: skip
    x = RankStraggle(
        rank=5, held_share=held_share, held_ms=17.3, last_share=last_share,
        excess_held_ms=26.7, excess_not_held_ms=not_held_ms,
    )  # fmt: skip
    cost = np.where(np.arange(299) < held_share * 299, 17.3, 1.0)
    return _culprit_verdict(out, [x], cost, {}, False, "")


def test_slow_in_every_step_is_told_apart_from_last_in_some() -> None:
    # measured on 8 ranks sharing 2 cores, beside two spin loops: a rank 20 ms late in
    # every step held the job in 21% of them, and was 8.0 ms slower in the others
    verdict = culprit(not_held_ms=8.0, held_share=0.21, last_share=0.33)
    assert verdict.startswith("rank 5 is the straggler: it held the job in 21% of 299 steps")
    assert "Slow in every step is not holding the job in every step" in verdict
    assert "in the steps it did not hold the job too (by 8.0 ms, median; 26.7 ms" in verdict
    assert "finished last in 33% of the steps" in verdict
    assert "stands out of the machine's noise (9.0 ms or more here)" in verdict
    assert "frees a core for the others, so they catch up and it is last only" in verdict


def test_an_intermittent_fault_reads_as_one() -> None:
    # its quiet steps are quiet (0.15 ms against 41 ms: tests/data/intermittent-2-loaded)
    verdict = culprit(not_held_ms=0.15, held_share=0.22, last_share=0.77)
    assert "Slow in every step" not in verdict and "in 22% of 299 steps" in verdict
    # held in nearly every step: nothing to tell apart
    verdict = culprit(not_held_ms=8.0, held_share=0.9, last_share=0.9)
    assert "Slow in every step" not in verdict


def gpu(rank: int, idle: float, compute: float) -> RankGpu:
    return RankGpu(rank, 100.0, idle, compute, 1.0 - idle - compute, 0.0, 10, 1.0)


def test_a_gpu_rank_stands_out_only_by_a_material_gap() -> None:
    # HTA's two ranks: compute 17.7% against 22.6%, 4.9 points: not material
    rank, metric, text = _stands_out([gpu(0, 0.5356, 0.1771), gpu(1, 0.5472, 0.2257)])
    assert rank is None and metric is None
    assert text.startswith("No rank stands out") and "4.9 points" in text
    assert f"within {STANDS_OUT_POINTS:g} points" in text
    # three ranks, one idle 12 points more than the others' mean: named
    rank, metric, text = _stands_out([gpu(0, 0.30, 0.5), gpu(1, 0.31, 0.5), gpu(2, 0.425, 0.4)])
    assert (rank, metric) == (2, "idle_share")
    assert text.startswith("Rank 2 stands out: its GPU is idle 42.5% of its span")
    assert "12.0 points apart (material: 10 points or more)" in text


def kept(step_change: float) -> Decision:
    default = TunableParams(4 * 1024 * 1024, 5.0, True)
    best = TunableParams(3 * 1024 * 1024, 5.0, True)
    return Decision(
        params=default, kept_default=True, default=default,
        log_ratio=-math.log1p(step_change), std_error=0.04, windows=12, best_tried=best,
        confirmed=False, tried=9, reason="nothing better",
    )  # fmt: skip


@pytest.mark.parametrize("change", [0.08, 0.0, 0.002])
def test_a_slower_setting_is_never_promising(change: float) -> None:
    line = end_line(kept(change), Config(), steps_per_window=3)
    assert "promising" not in line, line
    assert "no setting tried measured faster than the default: the closest, " in line
    assert "HVDPROF_FUSION_THRESHOLD=3145728, measured step time " in line


def test_a_faster_setting_not_surely_better_is_the_most_promising() -> None:
    line = end_line(kept(-0.03), Config(), steps_per_window=3)
    assert "; the most promising, HVDPROF_FUSION_THRESHOLD=3145728, measured step time -3%" in line
