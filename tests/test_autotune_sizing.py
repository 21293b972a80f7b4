"""The tuner sized to the job (issue 52): windows as long as the noise needs, exploration
that skips what cannot help and drops what is clearly worse, an early stop when the
default is best, and a round that gives up, keeping the default, when the job is too
noisy to tune at its budget.

No processes: the tuner is driven with synthetic scores (deterministic: the same seeds
give the same runs), the controller with synthetic CycleRecords (``FakeRuntime`` of
``test_autotune_unit``) whose step times follow the parameters it proposed, with as much
noise as each test needs. The real-process side (a job too short to tune says so in one
line) is in ``test_autotune_e2e.py``.
"""

from __future__ import annotations

import doctest
import io
import math
import os
import statistics
from collections.abc import Callable

from test_autotune_unit import (
    BUDGET,
    DEFAULT,
    STRUCTURE,
    TRIALS,
    FakeRuntime,
    _controller_config,
    cycle_bound,
    default_best,
    false_winners_allowed,
    run_trial,
)

from hvdprof.autotune import (
    AutotuneController,
    JobStructure,
    PairedTuner,
    SearchSpace,
    sizing,
    tuner,
)
from hvdprof.autotune import seeds as seeds_module
from hvdprof.autotune.controller import PHASE_WATCH
from hvdprof.autotune.log import PHASE_DECISION, PHASE_TUNE, read_autotune_log
from hvdprof.autotune.seeds import same_as_threshold, seed_candidates
from hvdprof.autotune.summary import end_line
from hvdprof.common.records import TunableParams
from hvdprof.config import Config

MiB = 1024 * 1024


def test_sizing_and_seeds_doctests_hold() -> None:
    for module in (sizing, seeds_module):
        result = doctest.testmod(module)
        assert result.failed == 0 and result.attempted > 0, module.__name__


# --- windows sized to the noise -------------------------------------------------------


def test_windows_grow_with_the_noise_until_an_8_percent_gain_is_decidable() -> None:
    # quiet: the configured windows already resolve 8% within the budget's confirmation
    quiet = sizing.plan_windows(0.03, 3, 2, 280, 24)
    assert quiet.steps == 3 and quiet.decidable and not quiet.hopeless
    # noisier: the shortest window that resolves it, found by doubling
    medium = sizing.plan_windows(0.07, 3, 2, 280, 24)
    assert medium.steps == 6 and medium.decidable
    assert not sizing.plan_at(0.07, 3, 3, 2, 280).decidable
    # the more noise, the longer the windows, never fewer than MIN_WINDOWS of them
    sizes = [sizing.plan_windows(std, 3, 2, 280, 24).steps for std in (0.03, 0.06, 0.1, 0.3)]
    assert sizes == sorted(sizes) and sizes[-1] > sizes[0]
    assert all(sizing.plan_windows(0.3, 3, 2, 280, 24).windows >= sizing.MIN_WINDOWS for _ in "x")
    # comparisons needed: the sample-size rule, (z_a + z_b)^2 sigma^2 / delta^2
    n = sizing.comparisons_to_decide(0.1)
    assert n == math.ceil((2.8 * 0.1 / math.log(1.08)) ** 2)
    assert sizing.comparisons_to_decide(0.1, sizing.GIVE_UP_GAIN) < n


def test_resized_windows_weigh_their_comparisons_by_their_noise() -> None:
    """After the windows grow, the noise measured on short windows is rescaled and the
    comparisons made on them count for less than the new ones."""
    t = PairedTuner(SearchSpace(), 56, DEFAULT, noise=0.3, structure=STRUCTURE)
    scores = iter([1.0e9, 1.1e9, 0.9e9, 1.05e9, 1.02e9, 0.95e9, 1.0e9, 1.08e9, 0.97e9])
    for score in scores:
        t.tell(t.ask(), score)
    noise, differences = t.measured_window_noise()
    assert differences >= 2 and noise > 0
    sigma = t.sigma
    t.resize(30, 0.5)
    assert t.max_samples == 30 and t.noise_unit == 0.5
    assert math.isclose(t.measured_window_noise()[0], noise * 0.5)
    assert t.sigma < sigma
    assert all(c.noise == 1.0 for c in t.comparisons)


def noisy_controller(tmp_path: os.PathLike[str], step_noise: float, seed: int = 0):
    """A controller at a full-size round (56 windows of 3 steps, the runtime's defaults)
    fed with steps whose times carry ``step_noise`` (log-normal sigma) around the
    synthetic job's throughput."""
    config = _controller_config(
        tmp_path,
        autotune_steps_per_sample=3,
        autotune_max_samples=56,
        autotune_warmup_samples=1,
        autotune_continuous=True,
    )
    out = io.StringIO()
    ctl = AutotuneController(config, DEFAULT, rank=0, out=out)
    rt = FakeRuntime(ctl, DEFAULT, seed=seed, step_noise=step_noise, cycles_per_step=2)
    return ctl, rt, out


def test_a_noisy_job_gets_longer_windows(tmp_path: os.PathLike[str]) -> None:
    ctl, rt, out = noisy_controller(tmp_path, step_noise=0.15)
    rt.run_until(lambda: ctl.phase == PHASE_WATCH, max_steps=2000)
    grown = [r for r in ctl.resizes if r[2] == "noise"]
    assert grown, (ctl.resizes, ctl.plan)
    assert ctl.steps_per_sample > 3
    rows = [r for r in read_autotune_log(ctl.config.autotune_log) if r.phase == PHASE_TUNE]
    lengths = [r.last_step - r.first_step + 1 for r in rows]
    assert lengths[0] == 3 and max(lengths) == ctl.steps_per_sample, lengths
    # the round kept to its step budget (a window's worth of slack: the one in hand)
    assert ctl.steps_used <= ctl.budget_steps + ctl.steps_per_sample + ctl.window_overhead
    assert len(out.getvalue().splitlines()) == 1


def test_a_round_ends_when_its_steps_are_spent(tmp_path: os.PathLike[str]) -> None:
    """Proposals that land 20 cycles (10 steps) after they are posted: every window costs
    more steps than planned. The round still ends within its step budget, and says so in
    its one line."""
    ctl, _, out = noisy_controller(tmp_path, step_noise=0.05)
    rt = FakeRuntime(ctl, DEFAULT, seed=1, step_noise=0.05, cycles_per_step=2, apply_delay=20)
    rt.run_until(lambda: ctl.phase == PHASE_WATCH, max_steps=3000)
    decision = ctl.decision()
    assert decision is not None and decision.reason != "too noisy", decision  # quiet job
    assert ctl.steps_used <= ctl.budget_steps, (ctl.steps_used, ctl.budget_steps)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hvdprof autotune: "), lines
    # this seeded run decided nothing in its steps: the default is kept, and said so
    assert decision.reason == "undecided" and decision.kept_default
    assert lines[0].startswith(
        "hvdprof autotune: kept the default — nothing to set: the budget ended before a "
        "finalist passed the sequential test"
    ), lines
    assert rt.proposals[-1] == DEFAULT


def test_a_quiet_job_keeps_its_windows(tmp_path: os.PathLike[str]) -> None:
    ctl, rt, _ = noisy_controller(tmp_path, step_noise=0.01)
    rt.run_until(lambda: ctl.phase == PHASE_WATCH, max_steps=2000)
    assert not [r for r in ctl.resizes if r[2] == "noise"], ctl.resizes
    assert ctl.steps_per_sample == 3


def test_a_job_too_noisy_to_tune_keeps_the_default_and_says_so_in_one_line(
    tmp_path: os.PathLike[str],
) -> None:
    """Steps whose times spread by a factor of e (sigma 1.0 in log): no window the budget
    holds can confirm even a 25% gain. The round ends early, the default is proposed and
    logged as kept, and the one line says why with the numbers."""
    ctl, rt, out = noisy_controller(tmp_path, step_noise=1.0)
    rt.run_until(lambda: ctl.phase == PHASE_WATCH, max_steps=2000)
    decision = ctl.decision()
    assert decision is not None and decision.kept_default and decision.reason == "too noisy"
    assert rt.proposals[-1] == DEFAULT  # changes nothing: the job runs its default
    assert ctl.steps_used < ctl.budget_steps  # gave up early rather than explore on
    lines = out.getvalue().splitlines()
    assert len(lines) == 1, lines
    line = lines[0]
    assert line.startswith(
        "hvdprof autotune: kept the default — nothing to set: too noisy to tune: "
    )
    assert "one window of " in line and "confirming even a 25% gain would take about " in line
    assert "paired steps, more than the budget's 280" in line
    assert "HVDPROF_" not in line  # nothing to paste
    rows = read_autotune_log(ctl.config.autotune_log)
    decisions = [r for r in rows if r.phase == PHASE_DECISION]
    assert len(decisions) == 1 and decisions[0].role == "kept_default"
    assert decisions[0].params == DEFAULT
    # were drift to be detected, a round too noisy to tune is not re-opened (its
    # throughput drifts by noise alone): nothing is explored at the job's expense
    ctl._reopen(ctl._tuner)
    assert ctl.reopened == 0 and ctl.decision().reason == "too noisy"


# --- cheap exploration ---------------------------------------------------------------


def test_candidates_the_structure_says_cannot_help_are_never_run() -> None:
    space = SearchSpace()
    # a cycle thread busy all the time (1% of the step waiting), one reducing cycle a
    # step: no shorter cycle can save 2%, no longer one has anything to fuse
    busy = JobStructure(0.02, 40 * 1024, tuple([4096] * 10), 0.01, cycles_per_step=1.0)
    seeds = seed_candidates(space, DEFAULT, busy)
    assert all(p.cycle_time_ms == DEFAULT.cycle_time_ms for p in seeds), seeds
    # 40 KB a step of 4 KB tensors: every threshold from 40 KB up treats them as 4 MiB
    # does (all fused into one buffer that never fills), so only smaller ones are tried
    assert all(p.fusion_threshold_bytes < 40 * 1024 for p in seeds if p.cycle_time_ms == 1.0
               and p.fusion_threshold_bytes != DEFAULT.fusion_threshold_bytes)  # fmt: skip
    assert not same_as_threshold(256 * 1024, 4 * MiB, [3 * MiB])
    # the cache is still flipped once: nothing in the structure says whether ops missed it
    assert TunableParams(DEFAULT.fusion_threshold_bytes, 1.0, False) in seeds
    # ...but not where every op of a steady window went through it; turning it on is
    # always tried
    steady = JobStructure(0.02, 40 * 1024, tuple([4096] * 10), 0.01, 1.0, cache_hit_fraction=1.0)
    assert all(p.cache_enabled for p in seed_candidates(space, DEFAULT, steady))
    missed = JobStructure(0.02, 40 * 1024, tuple([4096] * 10), 0.01, 1.0, cache_hit_fraction=0.9)
    assert not all(p.cache_enabled for p in seed_candidates(space, DEFAULT, missed))
    off = TunableParams(DEFAULT.fusion_threshold_bytes, 1.0, False)
    assert any(p.cache_enabled for p in seed_candidates(space, off, steady))
    # a job with waits and several reducing cycles a step keeps every cycle time
    waits = JobStructure(0.03, 40 * MiB, tuple([3 * MiB] * 12), 0.3, cycles_per_step=6.0)
    cycles = {p.cycle_time_ms for p in seed_candidates(space, DEFAULT, waits)}
    assert {0.2, 0.5, 2.0, 5.0} <= cycles


def test_a_clearly_worse_candidate_costs_one_window() -> None:
    """Synthetic scores without noise: a candidate at half the default's throughput is
    compared once, dropped at once, and never measured again."""
    space = SearchSpace()
    awful = TunableParams(DEFAULT.fusion_threshold_bytes, 5.0, True)
    t = PairedTuner(space, 56, DEFAULT, noise=0.3, first_candidates=[awful])
    asked = []
    for _ in range(12):
        p = t.ask()
        asked.append(p)
        base = 1e9 * (1.0 + 0.01 * (len(asked) % 3))  # a little jitter, no trend
        t.tell(p, base * (0.5 if p == awful else 1.0))
    assert asked[:3] == [DEFAULT, awful, DEFAULT]
    assert asked.count(awful) == 1 and t.dropped_early >= 1


def _drive(t: PairedTuner, score: Callable[[TunableParams, int], float], windows: int) -> list:
    """Ask and tell up to ``windows`` windows (until the round decides); the asked."""
    asked: list[TunableParams] = []
    while not t.converged and len(asked) < windows:
        p = t.ask()
        asked.append(p)
        t.tell(p, score(p, len(asked)) * (1.0 + 0.02 * (len(asked) % 3)))  # small jitter
    return asked


def test_a_clearly_better_candidate_is_looked_at_again_and_confirmed_at_once() -> None:
    """The 3 MiB threshold is 30% faster (the fusion-bound job's kind of gain): its first
    window puts it clearly ahead, so the next candidate window measures it again instead of
    the rung's next candidate; two comparisons promote it, and the promotion goes straight
    to the sequential test against the default (once the noise is measured), which ends
    the round long before the budget. Thresholds are reached early: cycle times and
    thresholds are listed in turn."""
    better = TunableParams(3 * MiB, DEFAULT.cycle_time_ms, True)
    t = PairedTuner(SearchSpace(), 56, DEFAULT, noise=0.3, structure=STRUCTURE)
    asked = _drive(t, lambda p, _: 1.3e9 if p == better else 1e9, 56)
    first = asked.index(better)
    assert first <= 3, asked  # the second candidate: a threshold right after a cycle time
    assert asked[first + 2] == better, asked  # looked at again at once
    assert t.promotions == 1 and t.confirming and t.decision().reason == "confirmed"
    assert t.best is not None and t.best.params == better
    assert len(asked) <= 24, len(asked)  # decided in under half the budget
    # promoted after its second look: every incumbent window from then on runs it
    assert all(p == better for p in asked[first + 4 :: 2]), asked
    # the test's windows: the winner and the default in turn, to the end of the round
    tail = asked[-2 * tuner.MIN_CONFIRM - 1 :]
    assert tail[::2] == [better] * (tuner.MIN_CONFIRM + 1) and set(tail[1::2]) == {DEFAULT}


def test_a_lucky_promotion_that_the_test_rejects_resumes_the_race() -> None:
    """A candidate that scored 30% better twice by luck, then no better: the sequential
    test rejects it, the default is the incumbent again, screening goes on, and the truly
    better threshold is still found and confirmed (the test's error rate now shared by
    the two it may test)."""
    # the fifth and sixth candidates (cycle times and thresholds in turn): by the time the
    # lucky one is promoted the noise is measured, so its test starts at once
    lucky = TunableParams(DEFAULT.fusion_threshold_bytes, 0.2, True)
    better = TunableParams(256 * 1024, DEFAULT.cycle_time_ms, True)
    seen: dict[TunableParams, int] = {}

    def score(p: TunableParams, _: int) -> float:
        seen[p] = seen.get(p, 0) + 1
        if p == lucky:
            return 1.3e9 if seen[p] <= 2 else 1e9
        return 1.25e9 if p == better else (0.97e9 if p != DEFAULT else 1e9)

    t = PairedTuner(SearchSpace(), 56, DEFAULT, noise=0.3, structure=STRUCTURE)
    asked = _drive(t, score, 56)
    assert lucky in t._rejected and t.promotions == 2, asked
    rejected_at = max(i for i, p in enumerate(asked) if p == lucky)
    assert asked[rejected_at + 1] == DEFAULT  # the default is the incumbent again
    assert better in asked[rejected_at + 1 :]  # ...and the race went on
    assert t.decision().reason == "confirmed" and t.best is not None
    assert t.best.params == better, (t.best, asked)


def test_throughput_while_tuning_is_reported_live(tmp_path: os.PathLike[str]) -> None:
    """Every tuning row of the log carries the round's throughput so far against the
    default (by the paired estimates), and the timeline's sample args the same, and
    against the best measured."""
    ctl, rt, _ = noisy_controller(tmp_path, step_noise=0.05)
    seen: list[dict] = []
    ctl.on_sample = lambda *a, **info: seen.append(info)
    rt.run_until(lambda: ctl.phase == PHASE_WATCH, max_steps=2000)
    rows = [r for r in read_autotune_log(ctl.config.autotune_log) if r.phase == PHASE_TUNE]
    ratios = [r.while_tuning_ratio for r in rows]
    assert all(r is not None and 0.3 < r < 3.0 for r in ratios), ratios
    live = [s for s in seen if "while_tuning_ratio" in s]
    assert len(live) == len(seen) and live
    assert all(s["while_tuning_of_best"] <= s["while_tuning_ratio"] + 1e-12 for s in live)
    assert all(s["window_steps"] >= 3 for s in live)


# --- when the default is best --------------------------------------------------------


def test_when_the_default_is_best_the_round_says_so_early() -> None:
    """On the job whose default is best, under in-run noise (one configuration's windows
    over +-25%): in more than half of 40 seeded trials the round stops exploring after
    its second rung (median under half the budget), and it keeps the default in all but
    the sequential test's stated error rate (ALPHA), a false winner costing at most 1%.
    On the cycle-bound job the early stop almost never fires wrongly (at most 2 of 40)."""
    early, windows, lines, moved = 0, [], [], []
    for seed in TRIALS:
        gain, _, t = run_trial(default_best, seed)
        d = t.decision()
        if not d.kept_default:
            moved.append((seed, round(gain, 4)))
            continue
        assert gain == 1.0
        if d.reason == "default best":
            early += 1
            windows.append(t.samples_told)
            lines.append(end_line(d, Config(), steps_per_window=3))
    assert len(moved) <= false_winners_allowed(len(TRIALS)), moved
    assert all(gain >= 0.99 for _, gain in moved), moved
    assert early >= 20, early
    assert statistics.median(windows) < BUDGET / 2, windows
    for line in lines:
        assert line.startswith(
            "hvdprof autotune: kept the default — nothing to set: the default is the best "
            "measured: of the "
        ), line
        assert "exploring stopped early" in line and line.count("\n") == 0
        assert "HVDPROF_" not in line  # no estimate is named beside "the best measured"
    wrong = sum(run_trial(cycle_bound, s)[2].decision().reason == "default best" for s in TRIALS)
    assert wrong <= 2, wrong


def test_default_best_needs_every_live_candidate_compared_twice() -> None:
    """One comparison is not enough to stop: a candidate measured once may be a gain
    hidden by noise."""
    t = PairedTuner(SearchSpace(), 56, DEFAULT, noise=0.3, structure=STRUCTURE)
    while t._rung < 2 and not t.converged:
        p = t.ask()
        t.tell(p, 1e9 * (0.97 if p != DEFAULT else 1.0))
    assert not t.converged or t.decision().reason == "default best"
    assert all(t._counts.get(p, 0) >= tuner.MIN_PROMOTE for p in t._pool) or not t.converged


# --- what a step is (the windows count steps) ------------------------------------------


def test_unnamed_ops_do_not_split_a_named_step() -> None:
    """``hvd.SyncBatchNorm`` reduces its statistics unnamed, in every layer's forward and
    backward: the recycled name ``allreduce.noname.0`` must not end a step each time once
    the job's gradients (named) are seen; a job of unnamed ops only still counts steps."""
    from hvdprof.runtime.steps import StepCounter

    counter = StepCounter()
    for _ in range(3):  # three training steps of a model with 4 sync BN layers
        for _ in range(4):
            counter.completed_many(["allreduce.noname.0"])  # forward statistics
        for _ in range(4):
            counter.completed_many(["allreduce.noname.0"])  # their backward
        counter.completed_many(["allreduce.conv.weight", "allreduce.fc.weight"])
        counter.completed_many(["allreduce.fc.bias"])
    # the first step's statistics, before any named op, still count their repeats (7);
    # from then on one step per training step
    assert counter.step == 7 + 2, counter.step
    unnamed_only = StepCounter()
    for _ in range(5):
        unnamed_only.completed("broadcast.noname.0")
    assert unnamed_only.step == 4
