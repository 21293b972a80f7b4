"""Unit tests of the autotuner: search space, seeds, scoring, paired comparisons, tuner,
its end line, log, drift, controller.

No processes and no runtime: the tuner is driven with synthetic objectives, the
controller with synthetic CycleRecords whose timing follows the parameters it proposed.

The tuner's trials (``run_trial``) use four synthetic jobs shaped like the benchmark's:
bound by cycle time (0.5 ms is 13% faster than the default 1 ms), bound by the fusion
threshold (at or below its 3 MiB gradients, 17% faster than the default 4 MiB), one
whose default is best, and a flat one. A round is ``BUDGET`` = 56 windows, the runtime's
default: at 3 measured steps plus the partial and the settle step per window, about 300
steps. Every window's score is multiplied by a slow drift of the machine's speed (a sine
over 50 windows) and by independent noise, uniform within a band. Two settings:

* ``IN_RUN``: drift +-15% and noise +-12%, so one configuration's scores range over about
  +-25% in a run: the spread the issue measured in-run on these machines, larger than the
  difference between settings;
* ``HARSH``: drift +-25% and noise +-25%. One window's noise (14% rms) exceeds the gap
  between settings, and 56 windows cannot confirm a 13% gain in most runs: the tuner must
  then keep the default rather than guess.

Each statement about the tuner is checked over 40 seeded trials (deterministic: the same
seeds give the same runs), with the rate it holds at stated in the test.
"""

from __future__ import annotations

import doctest
import io
import itertools
import math
import os
import random
import re
import statistics
from collections.abc import Callable

import numpy as np
import pytest

from hvdprof.autotune import (
    LOG_COLUMNS,
    AutotuneController,
    AutotuneTrialLog,
    DriftDetector,
    JobStructure,
    PairedTuner,
    SampleWindow,
    SearchSpace,
    StepTotals,
    end_line,
    env_assignments,
    paired,
    read_autotune_log,
    score_steps,
    scoring,
    seed_candidates,
    space_from_config,
    tuner,
)
from hvdprof.autotune.controller import REOPEN_REMEASURE
from hvdprof.autotune.log import (
    PHASE_DECISION,
    PHASE_TUNE,
    PHASE_WATCH,
    ROLE_CANDIDATE,
    ROLE_INCUMBENT,
    ROLE_WATCH,
    make_row,
)
from hvdprof.autotune.paired import Comparison, estimate_relative, flanked_log_ratio
from hvdprof.autotune.scoring import StepMarks, score_spans, split_evenly
from hvdprof.autotune.space import (
    CYCLE_AXIS,
    FUSION_AXIS,
    FUSION_THRESHOLD_MAX_BYTES,
    FUSION_THRESHOLD_MIN_BYTES,
    round_cycle_time,
)
from hvdprof.common.records import CycleRecord, OpRecord, TunableParams
from hvdprof.config import Config

MiB = 1024 * 1024
DEFAULT = TunableParams(4 * MiB, 1.0, True)
OPTIMUM = TunableParams(MiB, 2.0, True)
#: windows per synthetic tuning run: the default round, which fits in 300 steps
BUDGET = Config().autotune_max_samples
SEEDS = range(12)


def log_throughput(p: TunableParams) -> float:
    """ln of the synthetic job's throughput relative to its peak (0 at OPTIMUM)."""
    return (
        -0.02 * (math.log2(p.fusion_threshold_bytes) - 20.0) ** 2
        - 0.1 * math.log(p.cycle_time_ms / 2.0) ** 2
        - (0.0 if p.cache_enabled else 0.15)
    )


def true_throughput(p: TunableParams) -> float:
    """Bytes/s of the synthetic job: 1 GB/s at the peak."""
    return 1e9 * math.exp(log_throughput(p))


def fraction_of_peak(p: TunableParams) -> float:
    return math.exp(log_throughput(p))


#: (drift amplitude in log units, noise half-width): see the module doc
IN_RUN = (0.15, 0.12)
HARSH = (0.25, 0.25)


def noisy(
    value: float,
    window: int,
    rng: random.Random,
    phase: float,
    conditions: tuple[float, float] = HARSH,
) -> float:
    """One window's score: ``value`` times the machine's drift and uniform noise."""
    drift_amplitude, noise = conditions
    drift = math.exp(drift_amplitude * math.sin(2 * math.pi * window / 50 + phase))
    return value * drift * rng.uniform(1 - noise, 1 + noise)


def tune(
    seed: int,
    objective: Callable[[TunableParams], float] = true_throughput,
    budget: int = BUDGET,
    conditions: tuple[float, float] = HARSH,
    **kwargs: object,
) -> tuple[PairedTuner, list[tuple[TunableParams, str]]]:
    """Drive the tuner as the controller does: measure what it asks, tell the score."""
    rng = random.Random(1000 + seed)
    t = PairedTuner(SearchSpace(), budget, DEFAULT, noise=0.3, seed=seed, **kwargs)  # type: ignore[arg-type]
    asked: list[tuple[TunableParams, str]] = []
    window = 0
    while not t.converged:
        params, role = t.ask(), t.next_role
        asked.append((params, role))
        t.tell(params, noisy(objective(params), window, rng, seed, conditions))
        window += 1
    return t, asked


# --- search space ------------------------------------------------------------------


def test_space_is_log_scaled_and_contains_the_default() -> None:
    space = SearchSpace()
    assert space.axes == (FUSION_AXIS, CYCLE_AXIS, "cache_enabled")
    assert space.contains(DEFAULT) and space.contains(OPTIMUM)
    assert FUSION_THRESHOLD_MIN_BYTES <= 4096 and 256 * MiB <= FUSION_THRESHOLD_MAX_BYTES
    dims = space.dimensions()
    assert dims[0].prior == "log-uniform" and dims[1].prior == "log-uniform"
    # the GP sees equal distances for equal ratios: 4 KiB->64 KiB equals 4 MiB->64 MiB
    from skopt.utils import normalize_dimensions

    norm = normalize_dimensions(dims)
    a, b, c, d = (
        norm.transform([[x, 1.0, "on"]])[0][0] for x in (4096.0, 65536.0, 4.0 * MiB, 64.0 * MiB)
    )
    assert b - a == pytest.approx(d - c)
    # round trip, rounded to whole KiB and 3 significant digits
    p = space.from_point([5_000_123.0, 2.4567, "off"])
    assert p == TunableParams(round(5_000_123 / 1024) * 1024, 2.46, False)
    assert space.from_point(space.to_point(p)) == p
    assert round_cycle_time(0.123456) == 0.2  # clamped to the range
    assert not space.contains(TunableParams(0, 1.0, True))


def test_explicitly_set_variables_are_fixed_and_not_searched() -> None:
    config = Config(cycle_time_ms=3.5, explicitly_set=frozenset({"HVDPROF_CYCLE_TIME"}))
    initial = TunableParams(config.fusion_threshold_bytes, 3.5, True)
    space = space_from_config(config, initial)
    assert CYCLE_AXIS not in space.axes and len(space.dimensions()) == 2
    assert space.from_unit([0.5, 1.0]).cycle_time_ms == 3.5
    everything = Config(
        explicitly_set=frozenset(
            {"HVDPROF_CYCLE_TIME", "HVDPROF_FUSION_THRESHOLD", "HVDPROF_CACHE_CAPACITY"}
        )
    )
    assert space_from_config(everything, DEFAULT).is_empty


def test_shared_memory_holds_the_threshold_and_searches_cycle_time_and_cache() -> None:
    config = Config()
    space = space_from_config(config, DEFAULT, shared_memory=True)
    assert space.axes == (CYCLE_AXIS, "cache_enabled")
    assert space.fixed_values[FUSION_AXIS] == DEFAULT.fusion_threshold_bytes
    assert space_from_config(config, DEFAULT).axes[0] == FUSION_AXIS  # through Gloo: searched


def test_unit_cube_is_log_scaled_and_round_trips() -> None:
    space = SearchSpace()
    lo = space.to_unit(TunableParams(FUSION_THRESHOLD_MIN_BYTES, 0.2, False))
    hi = space.to_unit(TunableParams(FUSION_THRESHOLD_MAX_BYTES, 50.0, True))
    assert lo == pytest.approx([0.0, 0.0, 0.0]) and hi == pytest.approx([1.0, 1.0, 1.0])
    a, b = space.to_unit(TunableParams(4096, 1, True))[0], space.to_unit(DEFAULT)[0]
    assert b - a == pytest.approx(10 / 16)  # 4 KiB -> 4 MiB is 10 of the 16 octaves
    assert space.from_unit(space.to_unit(DEFAULT)) == DEFAULT
    assert space.from_unit([2.0, -1.0, 0.2]) == TunableParams(
        FUSION_THRESHOLD_MAX_BYTES, 0.2, False
    )


def test_env_assignments_express_cache_off_as_capacity_zero() -> None:
    on = env_assignments(TunableParams(8 * MiB, 2.5, True), cache_capacity=1024)
    assert on == {
        "HVDPROF_FUSION_THRESHOLD": "8388608",
        "HVDPROF_CYCLE_TIME": "2.5",
        "HVDPROF_CACHE_CAPACITY": "1024",
    }
    off = env_assignments(TunableParams(8 * MiB, 2.5, False), cache_capacity=1024)
    assert off["HVDPROF_CACHE_CAPACITY"] == "0"
    # a job that started with the cache off still recommends a real capacity for "on"
    assert env_assignments(TunableParams(MiB, 1, True), 0)["HVDPROF_CACHE_CAPACITY"] == "4096"


# --- scoring -------------------------------------------------------------------------


def _steps(durations_ms: list[float], nbytes: int = 1_000_000) -> list[StepTotals]:
    out, t = [], 0
    for i, ms in enumerate(durations_ms):
        out.append(StepTotals(100 + i, t, t + int(ms * 1e6), nbytes))
        t += int(ms * 1e6)
    return out


def test_score_is_the_median_of_subwindows_and_shrugs_off_one_slow_step() -> None:
    assert split_evenly(10, 4) == [3, 3, 2, 2] and split_evenly(3, 5) == [1, 1, 1]
    steady = score_steps(_steps([10.0] * 10))
    assert steady.bytes_per_s == pytest.approx(1e8)
    assert (steady.first_step, steady.last_step) == (100, 109)
    assert len(steady.subwindow_bytes_per_s) == 5
    hiccup = score_steps(_steps([10.0] * 7 + [200.0] + [10.0] * 2))
    assert hiccup.bytes_per_s == pytest.approx(1e8)  # a mean would say ~3.4e7
    with pytest.raises(ValueError):
        score_steps([])


def test_sample_window_discards_settling_steps_and_completes_on_the_next_step() -> None:
    window = SampleWindow(discard_steps=2, measure_steps=3)
    cycles = [(5, 0, 10, 1), (5, 10, 20, 1), (6, 20, 30, 7), (7, 30, 40, 2), (7, 40, 50, 3)]
    cycles += [(8, 50, 60, 4), (9, 60, 70, 6)]
    done = [window.add(*c) for c in cycles]
    assert done == [False] * 7 and not window.complete
    assert window.add(10, 70, 80, 100)  # step 9 is over only once step 10 starts
    assert [s.step for s in window.steps] == [7, 8, 9]
    assert window.steps[0] == StepTotals(7, 30, 50, 5)
    assert window.add(11, 80, 90, 1)  # later cycles are ignored


def test_step_marks_sum_sub_windows_from_a_few_boundaries() -> None:
    """A watching tuner marks a boundary every few steps: the spans and their score are
    those of the same steps summed, and the steps between marks are never looked at."""
    marks = StepMarks(every=3, parts=2, settle=1)
    # boundaries (step, t_start, bytes before): one settle step, then sub-windows of 3
    assert not marks.add(10, 0, 0) and marks.next == 11
    assert not marks.add(11, 100, 50) and marks.next == 14
    assert not marks.add(14, 400, 350) and marks.next == 17
    assert marks.add(17, 1000, 950)  # the boundary that closes the second sub-window
    assert marks.spans() == [StepTotals(11, 100, 400, 300), StepTotals(14, 400, 1000, 600)]
    score = score_spans(marks.spans(), last_step=16)
    assert (score.first_step, score.last_step) == (11, 16)
    assert score.bytes_per_s == pytest.approx(statistics.median([1e9, 1e9]))
    with pytest.raises(ValueError):
        StepMarks(every=0, parts=2)


# --- paired comparisons ------------------------------------------------------------


def test_modules_doctests_hold() -> None:
    for module in (paired, tuner, scoring):
        result = doctest.testmod(module)
        assert result.failed == 0 and result.attempted > 0, module.__name__


def test_flanked_ratio_cancels_linear_drift() -> None:
    # the machine speeds up 10% per window; the candidate is 5% faster than the incumbent
    speeds = [1.0, 1.1, 1.2]
    ratio = flanked_log_ratio(100 * speeds[0], 105 * speeds[1], 100 * speeds[2])
    # geometric mean of the flanks is within 0.4% of the middle speed
    assert ratio == pytest.approx(math.log(1.05), abs=0.005)
    # two absolute samples at different moments would have said +15.5%
    assert math.log(105 * speeds[1] / (100 * speeds[0])) > 0.14


def test_relative_estimates_chain_through_incumbents_to_the_default() -> None:
    a, b, c, lone, other = "a", "b", "c", "lone", "other"
    comparisons = [
        Comparison(a, "default", 0.10),
        Comparison(a, "default", 0.14),
        Comparison(b, a, 0.05),  # b beat the incumbent a, which beat the default
        Comparison(b, a, 0.03),
        Comparison("default", b, -0.2),  # confirmation: the default between b's windows
        Comparison(lone, other, 0.3),  # not connected to the default: no estimate
    ]
    estimates = estimate_relative(comparisons, "default", comparison_std=0.1)
    assert estimates["default"].log_ratio == 0.0
    assert set(estimates) == {"default", a, b, c} - {c}
    assert 0.1 < estimates[a].log_ratio < 0.15
    assert 0.15 < estimates[b].log_ratio < 0.2
    assert estimates[b].against_default == 1 and estimates[a].against_default == 2
    assert estimates[a].std_error > 0 and estimates[b].ratio == pytest.approx(
        math.exp(estimates[b].log_ratio)
    )


# --- tuner ---------------------------------------------------------------------------

#: structure of the synthetic job: 12 weight gradients of 3 MiB and 192 small ones, 30 ms
#: steps, a fifth of each step spent waiting between cycles
STRUCTURE = JobStructure(0.03, 12 * 3 * MiB, tuple([3 * MiB] * 12 + [4096] * 192), 0.2)
#: seeded trials per statement below (each is one tuning run of BUDGET windows)
TRIALS = range(40)


def cycle_bound(p: TunableParams) -> float:
    """Log throughput of a job bound by cycle time: 0.5 ms is 13% faster than 1 ms."""
    return (
        -0.15 * math.log(p.cycle_time_ms / 0.4) ** 2
        - 0.005 * (math.log2(p.fusion_threshold_bytes) - 22) ** 2
        - (0.0 if p.cache_enabled else 0.1)
    )


def threshold_bound(p: TunableParams) -> float:
    """Log throughput of a job bound by the threshold: at or below its 3 MiB gradients
    they are reduced in place, 17% faster than copying each into a 4 MiB buffer."""
    t = p.fusion_threshold_bytes
    value = 0.0 if t <= 3 * MiB else -0.16
    if t < 256 * 1024:
        value -= 0.1 * math.log2(256 * 1024 / t)
    return value - 0.05 * math.log(p.cycle_time_ms) ** 2 - (0.0 if p.cache_enabled else 0.1)


def default_best(p: TunableParams) -> float:
    """Log throughput of a job whose default is its best configuration."""
    return (
        -0.1 * math.log(p.cycle_time_ms) ** 2
        - 0.02 * (math.log2(p.fusion_threshold_bytes) - 22) ** 2
        - (0.0 if p.cache_enabled else 0.1)
    )


def flat(p: TunableParams) -> float:
    return 0.0


def run_trial(
    objective: Callable[[TunableParams], float],
    seed: int,
    conditions: tuple[float, float] = IN_RUN,
    **kwargs: object,
) -> tuple[float, float, PairedTuner]:
    """One tuning run: (the choice's true throughput / the default's, the mean true
    throughput while tuning / the best candidate's, the tuner)."""
    t, asked = tune(
        seed,
        lambda p: 1e9 * math.exp(objective(p)),
        conditions=conditions,
        structure=STRUCTURE,
        **kwargs,
    )
    best = t.best
    assert best is not None
    peak = max(objective(p) for p in [DEFAULT, *t._order])
    gain = math.exp(objective(best.params) - objective(DEFAULT))
    while_tuning = statistics.mean(math.exp(objective(p) - peak) for p, _ in asked)
    if t.kept_default:
        assert best.params == DEFAULT and "kept the default" in t.verdict()
    else:
        assert best.ratio_lower_bound > 1.0 and "x the default" in t.verdict()
    return gain, while_tuning, t


def test_tuner_interleaves_incumbent_and_candidate_and_drops_bad_ones_early() -> None:
    awful = TunableParams(4096, 50.0, False)  # far worse than the default

    def objective(p: TunableParams) -> float:
        return 0.3e9 if p == awful else true_throughput(p)

    t, asked = tune(0, objective, budget=30, first_candidates=[awful])
    roles = [role for _, role in asked]
    assert asked[0] == (DEFAULT, ROLE_INCUMBENT)  # the job's own configuration first
    assert asked[1] == (awful, ROLE_CANDIDATE) and asked[2][0] == DEFAULT
    assert awful not in [p for p, _ in asked[3:]]  # one window was enough to drop it
    assert t.dropped_early >= 1
    # every candidate window sits between two windows of the incumbent of its time
    for i, role in enumerate(roles):
        if role == ROLE_CANDIDATE:
            assert roles[i - 1] == ROLE_INCUMBENT
            if i + 1 < len(roles):
                assert roles[i + 1] == ROLE_INCUMBENT


def test_seeds_come_from_the_jobs_structure_and_span_the_log_scales() -> None:
    space = SearchSpace()
    seeds = seed_candidates(space, DEFAULT, STRUCTURE)
    cycles = sorted({p.cycle_time_ms for p in seeds if p.cycle_time_ms != 1.0})
    thresholds = sorted(
        {p.fusion_threshold_bytes for p in seeds} - {DEFAULT.fusion_threshold_bytes}
    )
    assert cycles == [0.2, 0.5, 2.0, 5.0]  # a fifth to five times the default
    # the 3 MiB gradients' size (reduced in place), a 64 MiB buffer that fuses the whole
    # step (36.8 MB), and a sixteenth of the default
    assert thresholds == [256 * 1024, 3 * MiB, 64 * MiB], thresholds
    assert TunableParams(DEFAULT.fusion_threshold_bytes, 1.0, False) in seeds  # cache off
    assert all(
        sum(
            getattr(p, a) != getattr(DEFAULT, a) for a in (FUSION_AXIS, CYCLE_AXIS, "cache_enabled")
        )
        == 1
        for p in seeds
    )  # one knob at a time; the tuner combines the best threshold and cycle time itself
    # a tiny job (2 ms steps): no cycle time above twice the step is tried
    tiny = JobStructure(0.002, 64 * 1024, tuple([16 * 1024] * 4), 0.3, cycles_per_step=3)
    assert max(p.cycle_time_ms for p in seed_candidates(space, DEFAULT, tiny)) == 2.0
    # ...and with about one cycle per step (the wait's), none longer than the default
    once = JobStructure(0.002, 64 * 1024, tuple([16 * 1024] * 4), 0.3, cycles_per_step=1)
    assert max(p.cycle_time_ms for p in seed_candidates(space, DEFAULT, once)) <= 1.0
    # an 11 ms step with three cycles a step (default 5 ms): 10 ms is tried, 25 is not
    busy = JobStructure(0.011, 1 << 21, (1 << 20, 1 << 20), 0.05, cycles_per_step=3)
    longer = {
        p.cycle_time_ms for p in seed_candidates(space, TunableParams(4 * MiB, 5.0, True), busy)
    }
    assert 10.0 in longer and 25.0 not in longer, longer
    # no structure known: the log-scale extremes only
    assert sorted({p.fusion_threshold_bytes for p in seed_candidates(space, DEFAULT, None)}) == [
        256 * 1024, 4 * MiB, 64 * MiB,
    ]  # fmt: skip


def false_winners_allowed(trials: int) -> int:
    """How many of ``trials`` rounds on a job with nothing better may still end on another
    setting: the sequential test's stated error rate (``tuner.ALPHA`` per round). Seeded
    trials draw one sample of that rate; asserting fewer than it allows tests a seed, not
    the tuner (reordering the candidates moved one false winner from one seed to another)."""
    return math.ceil(tuner.ALPHA * trials)


def test_tuner_leaves_the_default_when_a_setting_is_over_10_percent_better() -> None:
    """Noise like this machine's (one configuration's windows spread over +-25%, more than
    the 13-17% between settings): the tuner moves to a setting over 10% better in at least
    3 of 4 seeded trials on the cycle-bound job and 38 of 40 on the threshold-bound one,
    and every move it makes is a gain (a move to a nearer, smaller gain is still one)."""
    for objective, at_least in ((cycle_bound, 30), (threshold_bound, 38)):
        gains = [run_trial(objective, seed)[0] for seed in TRIALS]
        moved = [g for g in gains if g != 1.0]
        print(objective.__name__, sorted(round(g, 3) for g in gains))
        assert sum(g >= 1.1 for g in moved) >= at_least, (objective.__name__, gains)
        assert all(g > 1.0 for g in moved), (objective.__name__, gains)


def test_tuner_keeps_the_default_when_nothing_is_better() -> None:
    """Stated error rate: the sequential test calls a no-better configuration a winner
    with probability at most ALPHA = 5% per round. Over the 80 trials (40 on a flat job,
    40 on one whose default is best) at most 5% end elsewhere, and a "winner" the test let
    through costs at most 1% (it cannot be much worse: it was measured against the default
    to the test's 8% resolution)."""
    false_winners = []
    trials = 0
    for objective in (flat, default_best):
        for seed in TRIALS:
            trials += 1
            gain, _, t = run_trial(objective, seed)
            if t.kept_default:
                decision = t.decision()
                assert decision.kept_default and decision.params == DEFAULT and gain == 1.0
            else:
                false_winners.append((objective.__name__, seed, round(gain, 3)))
    print("false winners:", false_winners)
    assert len(false_winners) <= false_winners_allowed(trials), false_winners
    assert all(gain >= 0.99 for _, _, gain in false_winners), false_winners


def test_tuner_never_ends_worse_than_the_default() -> None:
    """160 seeded trials (4 jobs x 40 seeds) under in-run noise and 160 under harsh noise
    (one window's noise beyond any gap between settings): none ends below 0.98 of the
    default (the issue's bound). Ending below the default at all takes a false winner on a
    job with nothing better, so it happens in at most ALPHA of the trials of each noise."""
    below = []
    for conditions in (IN_RUN, HARSH):
        trials = 0
        for objective in (cycle_bound, threshold_bound, default_best, flat):
            for seed in TRIALS:
                trials += 1
                gain, _, _ = run_trial(objective, seed, conditions)
                assert gain >= 0.98, (objective.__name__, conditions, seed, gain)
                if gain < 1.0:
                    below.append((objective.__name__, conditions, seed, round(gain, 4)))
        mine = [b for b in below if b[1] == conditions]
        assert len(mine) <= false_winners_allowed(trials), mine
    print("below the default:", below)


def test_exploring_costs_little_and_big_gains_end_the_round_early() -> None:
    """While tuning, the job runs at >= 0.85 of its best candidate's throughput in every
    trial (bad candidates cost one window, a winner is promoted early); a clear gain is
    confirmed before the budget is spent."""
    for objective in (cycle_bound, threshold_bound, default_best):
        costs = [run_trial(objective, seed)[1] for seed in TRIALS]
        print(objective.__name__, round(min(costs), 3), round(statistics.median(costs), 3))
        assert min(costs) >= 0.82, (objective.__name__, costs)
    windows = [run_trial(threshold_bound, seed)[2].samples_told for seed in TRIALS]
    assert statistics.median(windows) < BUDGET, windows


def test_after_a_promotion_the_candidates_race_around_the_new_incumbent() -> None:
    """On the threshold-bound job a promoted threshold moves the candidates still racing
    to it: no candidate window after the promotion runs the default's 4 MiB threshold
    (each such window ran the job 16% slower), except the default's own confirmation
    windows. Back on the default, the candidates are the default's variations again."""
    rebased = 0
    for seed in TRIALS:
        t, asked = tune(
            seed, lambda p: 1e9 * math.exp(threshold_bound(p)), conditions=IN_RUN,
            structure=STRUCTURE,
        )  # fmt: skip
        incumbent = DEFAULT
        for params, role in asked:
            if role == ROLE_INCUMBENT:
                incumbent = params
            elif incumbent != DEFAULT and params != DEFAULT:
                moved = incumbent.fusion_threshold_bytes != DEFAULT.fusion_threshold_bytes
                assert not moved or params.fusion_threshold_bytes != 4 * MiB, (seed, params)
                rebased += params.cycle_time_ms != DEFAULT.cycle_time_ms and moved
    assert rebased > 0  # the trials did race cycle times around a promoted threshold
    # the pool follows the incumbent there and back
    t = PairedTuner(SearchSpace(), BUDGET, DEFAULT, structure=STRUCTURE)
    seeds = list(t._pool)
    t.incumbent = TunableParams(3 * MiB, 1.0, True)
    t._rebase()
    assert TunableParams(3 * MiB, 0.5, True) in t._pool
    assert TunableParams(3 * MiB, 1.0, False) in t._pool  # the cache off, at 3 MiB
    assert all(p.fusion_threshold_bytes != 4 * MiB for p in t._pool)
    t.incumbent = DEFAULT
    t._rebase()
    assert t._pool == [p for p in seeds if p != TunableParams(3 * MiB, 1.0, True)]


def test_decision_line_says_what_it_did_once_and_truly() -> None:
    _, _, t = run_trial(threshold_bound, 1)
    d = t.decision()
    assert not d.kept_default and d.confirmed and d.windows >= 2 * tuner.MIN_CONFIRM + 1
    line = end_line(d, Config(), steps_per_window=4)
    assert "\n" not in line
    assert line.startswith("hvdprof autotune: HVDPROF_FUSION_THRESHOLD=3145728 — step time -")
    assert "against the default (95% interval -" in line
    assert f"confirmed over {4 * d.windows} paired steps" in line
    assert "HVDPROF_CYCLE_TIME" not in line  # only what changed is to be set
    # kept: the default's values are never printed as a finding
    _, _, kept = run_trial(flat, 1)
    line = end_line(kept.decision(), Config(), steps_per_window=4)
    assert line.startswith("hvdprof autotune: kept the default — nothing to set: ")
    assert "=4194304" not in line and "HVDPROF_CYCLE_TIME=1 " not in line
    assert "with 95% confidence" in line
    # a setting is "promising" only when it measured faster (here one measured +2%)
    faster = tuner.percent(kept.decision().step_time_change()).startswith("-")
    assert ("the most promising" in line) == faster
    assert ("no setting tried measured faster than the default: the closest" in line) != faster


def test_pinned_knobs_are_named_with_their_estimated_cost() -> None:
    config = Config(cycle_time_ms=25.0, explicitly_set=frozenset({"HVDPROF_CYCLE_TIME"}))
    initial = TunableParams(config.fusion_threshold_bytes, 25.0, True)
    space = space_from_config(config, initial)
    structure = JobStructure(0.02, MiB, (MiB,), wait_fraction=0.5)
    t = PairedTuner(space, 20, initial, structure=structure)
    rng = random.Random(0)
    for window in range(20):
        params = t.ask()
        t.tell(params, noisy(1e9, window, rng, 0.0, IN_RUN))
    line = end_line(t.decision(), config, 3, structure)
    assert "pinned by you (not tuned): HVDPROF_CYCLE_TIME=25 (" in line
    # waits are half the step; at the default 5 ms they would shrink to a fifth: 40%
    assert "the step might be up to 40% shorter" in line
    assert line.count("\n") == 0


def test_warm_start_measures_the_previous_recommendation_first() -> None:
    previous = TunableParams(MiB, 2.05, True)
    t, asked = tune(5, first_candidates=[previous])
    assert asked[1] == (SearchSpace().canonical(previous), ROLE_CANDIDATE)
    best = t.best
    assert best is not None and fraction_of_peak(best.params) >= fraction_of_peak(DEFAULT)


def test_tuner_refuses_scores_of_configurations_outside_its_space() -> None:
    config = Config(cycle_time_ms=3.5, explicitly_set=frozenset({"HVDPROF_CYCLE_TIME"}))
    initial = TunableParams(config.fusion_threshold_bytes, 3.5, True)
    space = space_from_config(config, initial)
    t = PairedTuner(space, 20, initial, seed=1)
    rng = random.Random(0)
    proposals = []
    for window in range(20):
        params = t.ask()
        proposals.append(params)
        t.tell(params, noisy(true_throughput(params), window, rng, 0.0))
    assert {p.cycle_time_ms for p in proposals} == {3.5}
    assert len({p.fusion_threshold_bytes for p in proposals}) > 2  # the rest is searched
    with pytest.raises(ValueError, match="outside the search space"):
        t.tell(TunableParams(MiB, 1.0, True), 1e9)


# --- log -----------------------------------------------------------------------------


def test_log_header_rows_roles_ratios_and_read_back(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "sub", "autotune.csv")
    log = AutotuneTrialLog(path)
    with open(path) as f:  # the header is there as soon as the log opens
        header = f.read()
    assert header == ",".join(LOG_COLUMNS) + "\n"
    for unit in ("_bytes", "_ms", "_bytes_per_s", "unix_time", "ratio_to_default"):
        assert unit in header
    # the columns before ``role`` are the earlier log's, in the same order
    assert LOG_COLUMNS[:9] == (
        "fusion_threshold_bytes", "cycle_time_ms", "cache_enabled", "score_bytes_per_s",
        "first_step", "last_step", "unix_time", "is_best", "phase",
    )  # fmt: skip
    t = PairedTuner(SearchSpace(), 8, DEFAULT, seed=0)
    rng = random.Random(1)
    expected = []
    for i in range(8):
        params, role = t.ask(), t.next_role
        score = noisy(true_throughput(params), i, rng, 0.0)
        t.tell(params, score)
        best = t.best
        assert best is not None
        is_best = best.params == params
        est = t.estimate(params)
        ratio = None if est is None else est.ratio
        expected.append((params, is_best, role, ratio))
        log.write(
            make_row(params, score, 10 * i, 10 * i + 9, is_best, role=role, ratio_to_default=ratio)
        )
        with open(path) as f:  # each row is in the file as soon as it is scored
            assert len(f.read().splitlines()) == i + 2
    log.close()
    rows = read_autotune_log(path)
    got = [(r.params, r.is_best, r.role, r.ratio_to_default) for r in rows]
    assert [g[:3] for g in got] == [e[:3] for e in expected]
    for g, e in zip(got, expected, strict=True):
        assert (g[3] is None) == (e[3] is None) and (
            g[3] is None or g[3] == pytest.approx(e[3], rel=1e-5)
        )
    assert rows[0].is_best and rows[0].role == ROLE_INCUMBENT  # the default, kept so far
    assert rows[1].role == ROLE_CANDIDATE and rows[0].ratio_to_default == 1.0
    assert rows[3].first_step == 30 and rows[3].last_step == 39
    assert all(r.phase == PHASE_TUNE and r.unix_time > 1e9 for r in rows)
    with open(path) as f:
        first = f.read().splitlines()[1].split(",")
    assert first[:3] == ["4194304", "1", "1"] and first[9] == "incumbent"


def test_log_of_an_earlier_version_reads_without_the_new_columns(
    tmp_path: os.PathLike[str],
) -> None:
    path = os.path.join(tmp_path, "old.csv")
    with open(path, "w") as f:
        f.write(",".join(LOG_COLUMNS[:9]) + "\n")
        f.write("1048576,2,1,9e+08,10,14,1700000000.000,1,tune\n")
    (row,) = read_autotune_log(path)
    assert row.params == TunableParams(MiB, 2.0, True) and row.is_best
    assert row.role == "" and row.ratio_to_default is None


def test_log_truncated_mid_row_reads_up_to_the_last_full_row(
    tmp_path: os.PathLike[str],
) -> None:
    path = os.path.join(tmp_path, "autotune.csv")
    with AutotuneTrialLog(path) as log:
        for i in range(3):
            log.write(
                make_row(TunableParams(MiB * (i + 1), 1.5, i % 2 == 0), 1e8 * (i + 1), i, i, True)
            )
    with open(path, "rb") as f:
        data = f.read()
    cut = data.rstrip(b"\n").rfind(b"\n") + 12  # inside the last row
    with open(path, "wb") as f:
        f.write(data[:cut])
    rows = read_autotune_log(path)
    assert [r.params.fusion_threshold_bytes for r in rows] == [MiB, 2 * MiB]
    assert rows[1].score_bytes_per_s == 2e8 and rows[1].params.cache_enabled is False
    # a header alone (killed before the first sample) is an empty, valid log
    with AutotuneTrialLog(path):
        pass
    assert read_autotune_log(path) == []
    with open(path, "w") as f:
        f.write("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not an autotune log"):
        read_autotune_log(path)


# --- drift ---------------------------------------------------------------------------


def test_drift_needs_a_consecutive_streak_on_one_side() -> None:
    drift = DriftDetector(fraction=0.2, samples=3, baseline_samples=3)
    assert not any(drift.update(s) for s in (100.0, 90.0, 110.0))
    assert drift.baseline == 100.0
    # noise on both sides never adds up
    assert not any(drift.update(s) for s in (70.0, 130.0, 70.0, 130.0, 95.0))
    # a calm sample resets the streak
    assert not any(drift.update(s) for s in (70.0, 70.0, 100.0, 70.0, 70.0))
    assert drift.update(60.0)
    assert drift.drifted == [70.0, 70.0, 60.0]
    drift.reset()
    assert drift.baseline is None and drift.streak == 0


# --- controller ----------------------------------------------------------------------


class FakeRuntime:
    """Feeds CycleRecords whose timing follows the parameters in force, like the cycle
    thread would: ``cycles_per_step`` cycles per step, ``bytes_per_step`` reduced per step,
    proposals applied ``apply_delay`` cycles after ``poll_proposal`` returns them."""

    def __init__(
        self,
        controller: AutotuneController,
        params: TunableParams,
        seed: int = 0,
        cycles_per_step: int = 3,
        bytes_per_step: int = 100 * MiB,
        apply_delay: int = 2,
        step_noise: float = 0.1,
        ops_of: Callable[[int], list[OpRecord]] | None = None,
    ) -> None:
        self.ctl = controller
        #: the ops each step's first cycle completed (None: records carry no ops)
        self.ops_of = ops_of
        self.params = params
        self.rng = np.random.default_rng(seed)
        self.cycles_per_step = cycles_per_step
        self.bytes_per_step = bytes_per_step
        self.apply_delay = apply_delay
        self.step_noise = step_noise
        self.slowdown = 1.0
        self.t = 0
        self.cycle = 0
        self.step = 0
        self.bytes_total = 0  # reduced so far (the cycle's counters["bytes_reduced"])
        self.pending: list[tuple[int, TunableParams]] = []
        self.proposals: list[TunableParams] = []
        self.applied_at_step: list[tuple[int, TunableParams]] = []

    def run_until(self, done: Callable[[], bool], max_steps: int) -> int:
        """Run whole steps until ``done()``; returns the steps it took."""
        for n in range(1, max_steps + 1):
            self.run_steps(1)
            if done():
                return n
        raise AssertionError(f"not done after {max_steps} steps")

    def run_steps(self, steps: int) -> None:
        for _ in range(steps):
            thr = true_throughput(self.params) / self.slowdown
            step_ns = (
                self.bytes_per_step / thr * 1e9 * math.exp(self.rng.normal(0, self.step_noise))
            )
            per_cycle_ns = int(step_ns / self.cycles_per_step)
            for i in range(self.cycles_per_step):
                changed = False
                if self.pending and self.pending[0][0] <= self.cycle:
                    _, new = self.pending.pop(0)
                    changed = new != self.params
                    self.params = new
                    self.applied_at_step.append((self.step, new))
                record = CycleRecord(
                    cycle=self.cycle,
                    step=self.step,
                    t_start=self.t,
                    t_negotiated=self.t,
                    t_end=self.t + per_cycle_ns,
                    params=self.params,
                    bytes_reduced=self.bytes_per_step // self.cycles_per_step,
                    params_changed=changed,
                )
                if self.ops_of is not None and i == 0:
                    record.ops = self.ops_of(self.step)
                # as the cycle feeds its observers (``Cycle._advance``)
                if self.ctl.per_cycle:
                    self.ctl.on_cycle(record)
                elif i == 0:
                    self.ctl.on_step(self.step, self.t, self.bytes_total, self.params)
                self.bytes_total += record.bytes_reduced
                # synchronous worker, so the test is deterministic
                assert self.ctl.wait_idle(timeout=30)
                proposal = self.ctl.poll_proposal()
                if proposal is not None:
                    self.proposals.append(proposal)
                    self.pending.append((self.cycle + self.apply_delay, proposal))
                self.t += per_cycle_ns
                self.cycle += 1
            self.step += 1


def _controller_config(tmp_path: os.PathLike[str], **changes: object) -> Config:
    base = Config(
        autotune=True,
        autotune_log=os.path.join(tmp_path, "tune.csv"),
        autotune_warmup_samples=1,
        autotune_steps_per_sample=4,
        autotune_max_samples=10,
        autotune_gp_noise=0.3,
        autotune_continuous=True,
        autotune_drift_fraction=0.25,
        autotune_drift_samples=3,
    )
    return base.replace(**changes)


def test_controller_tunes_converges_prints_and_reopens_on_drift(
    tmp_path: os.PathLike[str],
) -> None:
    config = _controller_config(tmp_path)
    out = io.StringIO()
    ctl = AutotuneController(config, DEFAULT, rank=0, out=out)
    assert ctl.detailed is True  # per-op records while it learns the job's structure
    rt = FakeRuntime(ctl, DEFAULT)
    # warmup (1 window), then 10 windows of about 7 steps (partial + settle + 4 + 1)
    rt.run_until(lambda: ctl.phase == PHASE_WATCH, max_steps=100)
    assert ctl.converged and ctl.detailed is False
    assert ctl.per_cycle is False  # watching: fed step boundaries, no record per cycle
    structure = ctl.structure
    assert structure is not None  # bytes: 100 MiB per step, less the // 3 per cycle
    assert abs(structure.bytes_per_step - 100 * MiB) < 3
    assert 0.05 < structure.step_s < 0.2  # 100 MiB at about 1 GB/s
    assert len(rt.proposals) == 10  # 9 asks after the default, then the best
    best = ctl.best
    assert best is not None and rt.proposals[-1] == best.params
    assert fraction_of_peak(best.params) >= fraction_of_peak(DEFAULT)
    printed = out.getvalue().splitlines()
    assert len(printed) == 1, printed  # one line at the end of the round
    assert printed == ctl.lines and "default" in printed[0]
    if best.params == DEFAULT:
        assert printed[0].startswith("hvdprof autotune: kept the default — nothing to set: ")
    else:
        assert re.match(r"hvdprof autotune: HVDPROF_\w+=[\d.]+ .*— step time -", printed[0])
    # in-flight records (old params between poll and apply) were ignored, never scored
    assert ctl.ignored_cycles > 0
    rows = read_autotune_log(config.autotune_log)
    assert [r.phase for r in rows] == [PHASE_TUNE] * 10 + [PHASE_DECISION]
    decision, rows = rows[-1], rows[:-1]
    assert decision.params == best.params and decision.is_best
    assert decision.role == ("kept_default" if best.params == DEFAULT else "recommended")
    assert [r.params for r in rows] == [DEFAULT, *rt.proposals[:9]]
    assert rows[0].first_step == 1 + 1 + 4  # the partial step, a settle step, the warmup
    for prev, row in itertools.pairwise(rows):
        assert row.last_step == row.first_step + 3
        if row.params != prev.params:
            applied = max(
                s for s, p in rt.applied_at_step if p == row.params and s < row.first_step
            )
            assert row.first_step == applied + 2  # the partial step and a settle step
    # windows alternate: the default first, every candidate between incumbent windows
    roles = [r.role for r in rows]
    assert roles[:2] == [ROLE_INCUMBENT, ROLE_CANDIDATE]
    for i, role in enumerate(roles[:-1]):
        if role == ROLE_CANDIDATE:
            assert roles[i - 1] == ROLE_INCUMBENT and roles[i + 1] == ROLE_INCUMBENT
    assert rows[0].ratio_to_default == 1.0
    # the score is the synthetic throughput of those params (within the noise)
    for row in rows:
        assert row.score_bytes_per_s == pytest.approx(true_throughput(row.params), rel=0.3)
    # is_best: the default is the recommendation until something beats it
    assert rows[0].is_best and rows[0].params == DEFAULT

    # watching: the best keeps being scored, no new proposals while it is steady
    rt.run_steps(2 + 4 * 5)
    watch = [r for r in read_autotune_log(config.autotune_log) if r.phase == PHASE_WATCH]
    assert len(watch) >= 4 and all(r.params == best.params and r.is_best for r in watch)
    assert all(r.role == ROLE_WATCH for r in watch)
    assert len(rt.proposals) == 10 and ctl.reopened == 0

    # the job halves its throughput: after 3 drifted samples tuning re-opens
    rt.slowdown = 2.0
    took = rt.run_until(lambda: ctl.reopened == 1, max_steps=4 * 5)
    assert took <= 4 * 4 + 1
    assert ctl.phase == PHASE_TUNE and ctl.per_cycle is True
    # the new round's reference is the configuration in force: it is measured first
    assert len(rt.proposals) == 11 and rt.proposals[-1] == best.params
    rt.run_until(lambda: len(rt.proposals) == 12, max_steps=20)
    assert rt.proposals[-1] != best.params  # a runner-up of the first round
    # a short round (half the windows), no exploration: it converges again
    rt.run_until(lambda: ctl.phase == PHASE_WATCH, max_steps=100)
    assert len(out.getvalue().splitlines()) == 2
    reopened = read_autotune_log(config.autotune_log)
    reopened = reopened[[r.phase for r in reopened].index(PHASE_WATCH) :]
    tried = {r.params for r in reopened if r.phase == PHASE_TUNE}
    assert len(tried) <= 1 + REOPEN_REMEASURE, tried

    ctl.close()  # the round said its line: nothing more at exit
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    n_rows = len(read_autotune_log(config.autotune_log))
    rt.run_steps(10)  # after close nothing is measured or written
    assert len(read_autotune_log(config.autotune_log)) == n_rows
    assert ctl.poll_proposal() is None
    ctl.close()  # idempotent


def _ops(step: int, misses: int, count: int = 8) -> list[OpRecord]:
    """``count`` allreduces of a step, the first ``misses`` negotiated without the cache."""
    return [
        OpRecord(f"grad.{i}", "ALLREDUCE", "float32", (1024,), 4096, 0, 0, {}, i >= misses, 0)
        for i in range(count)
    ]


def test_the_cache_is_tried_off_only_where_a_steady_window_missed_it(
    tmp_path: os.PathLike[str],
) -> None:
    """A steady job's ops all go through the response cache (after its first steps, which
    miss it by nature): turning it off can only add negotiation, so that candidate is never
    run. A job whose steady steps miss it (a quarter of the ops here) gets the candidate."""
    tried = {}
    for misses in (0, 2):
        config = _controller_config(
            tmp_path, autotune_log=os.path.join(tmp_path, f"log{misses}.csv"),
            autotune_max_samples=56,
        )  # fmt: skip
        ctl = AutotuneController(config, DEFAULT, rank=0, out=io.StringIO())
        rt = FakeRuntime(
            ctl, DEFAULT, ops_of=lambda step, m=misses: _ops(step, 8 if step < 2 else m)
        )
        rt.run_until(lambda c=ctl: c.structure is not None, max_steps=100)
        assert ctl.structure is not None
        assert ctl.structure.cache_hit_fraction == 1.0 - misses / 8, ctl.structure
        rt.run_until(lambda c=ctl: c.phase == PHASE_WATCH, max_steps=3000)
        tried[misses] = {r.params.cache_enabled for r in read_autotune_log(config.autotune_log)}
    assert tried[0] == {True}, tried  # never run with the cache off
    assert tried[2] == {True, False}, tried


def test_drift_band_widens_with_the_measured_noise(tmp_path: os.PathLike[str]) -> None:
    """A noisy job whose throughput does not move never re-opens tuning: the band is at
    least three window noises wide. (A tiny job lost 17% to re-opening again and again.)
    With the configured 10% band alone, the same watch samples would have re-opened it."""
    config = _controller_config(
        tmp_path, autotune_drift_fraction=0.1, autotune_drift_samples=3, autotune_max_samples=10
    )
    ctl = AutotuneController(config, DEFAULT, out=io.StringIO())
    rt = FakeRuntime(ctl, DEFAULT, seed=3, step_noise=0.3)
    rt.run_until(lambda: ctl.phase == PHASE_WATCH, max_steps=200)
    # about 100 watch windows (of WATCH_WINDOW_S: 5 of these ~0.1 s steps), the same
    # throughput throughout
    rt.run_steps(500)
    ctl.close()
    assert ctl.reopened == 0
    watch = [r.score_bytes_per_s for r in read_autotune_log(config.autotune_log)]
    watch = watch[[r.phase for r in read_autotune_log(config.autotune_log)].index(PHASE_WATCH) :]
    assert len(watch) >= 80
    # each watch window holds WATCH_WINDOW_S of steps, not the tuning windows' 4 steps:
    # scoring and logging a window costs the job CPU
    rows = read_autotune_log(config.autotune_log)
    spans = [r.last_step - r.first_step + 1 for r in rows if r.phase == PHASE_WATCH]
    assert statistics.median(spans) >= 5 > config.autotune_steps_per_sample, spans
    narrow = DriftDetector(0.1, 3)
    assert any(narrow.update(score) for score in watch), "the test's noise is too small"


def test_controller_without_continuous_mode_goes_quiet(tmp_path: os.PathLike[str]) -> None:
    config = _controller_config(
        tmp_path, autotune_continuous=False, autotune_max_samples=4, autotune_warmup_samples=0
    )
    out = io.StringIO()
    ctl = AutotuneController(config, DEFAULT, out=out)
    rt = FakeRuntime(ctl, DEFAULT)
    rt.run_until(lambda: ctl.phase == "done", max_steps=60)
    assert len(rt.proposals) == 4
    rows = read_autotune_log(config.autotune_log)
    rt.run_steps(30)
    assert len(read_autotune_log(config.autotune_log)) == len(rows) == 4 + 1  # + decision
    ctl.close()
    assert len(out.getvalue().splitlines()) == 1  # the end of tuning, once; nothing at exit


def test_controller_keeps_explicit_cycle_time_and_warm_starts(tmp_path: os.PathLike[str]) -> None:
    previous = os.path.join(tmp_path, "previous.csv")
    with AutotuneTrialLog(previous) as log:
        log.write(make_row(TunableParams(4 * MiB, 3.5, True), 9e8, 0, 9, True))
        log.write(make_row(TunableParams(MiB, 7.0, True), 5e8, 10, 19, False))  # other cycle
    config = _controller_config(
        tmp_path,
        cycle_time_ms=3.5,
        explicitly_set=frozenset({"HVDPROF_CYCLE_TIME"}),
        autotune_warm_start=previous,
        autotune_log=previous,  # the same file: read first, then rewritten
        autotune_max_samples=5,
        autotune_continuous=False,
    )
    initial = TunableParams(16 * MiB, 3.5, True)
    ctl = AutotuneController(config, initial, out=io.StringIO())
    rt = FakeRuntime(ctl, initial)
    rt.run_until(lambda: ctl.phase == "done", max_steps=60)
    ctl.close()
    assert rt.proposals and {p.cycle_time_ms for p in rt.proposals} == {3.5}
    rows = read_autotune_log(previous)
    assert len(rows) == 5 + 1 and all(r.params.cycle_time_ms == 3.5 for r in rows)
    assert rows[-1].phase == PHASE_DECISION
    # the earlier run's recommendation is the first candidate, right after the default
    assert rows[0].params == initial and rows[1].params == TunableParams(4 * MiB, 3.5, True)


def test_controller_is_rank_zero_only_and_idle_when_nothing_is_tunable(
    tmp_path: os.PathLike[str],
) -> None:
    config = _controller_config(tmp_path)
    with pytest.raises(ValueError):
        AutotuneController(config, DEFAULT, rank=1)
    pinned = config.replace(
        explicitly_set=frozenset(
            {"HVDPROF_CYCLE_TIME", "HVDPROF_FUSION_THRESHOLD", "HVDPROF_CACHE_CAPACITY"}
        )
    )
    out = io.StringIO()
    ctl = AutotuneController(pinned, DEFAULT, out=out)
    rt = FakeRuntime(ctl, DEFAULT)
    rt.run_steps(20)
    ctl.close()
    assert ctl.phase == "idle" and rt.proposals == [] and out.getvalue() == ""


def test_controller_ignores_records_of_other_params(tmp_path: os.PathLike[str]) -> None:
    config = _controller_config(tmp_path, autotune_warmup_samples=0)
    ctl = AutotuneController(config, DEFAULT, out=io.StringIO())
    other = TunableParams(MiB, 5.0, False)
    for cycle in range(60):  # plenty of steps, all under params it is not measuring
        ctl.on_cycle(CycleRecord(cycle, cycle, cycle * 10, cycle * 10, cycle * 10 + 5, other, 10))
    assert ctl.wait_idle(5)
    assert ctl.samples_scored == 0 and ctl.poll_proposal() is None and ctl.ignored_cycles == 60
    ctl.close()
    assert read_autotune_log(config.autotune_log) == []
