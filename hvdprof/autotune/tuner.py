"""The tuner: a plain ask/tell object that races candidates in paired windows, no runtime inside.

Why paired: on a shared machine one configuration's score varies by +-25% from one window
to the next and the machine's speed drifts, while good configurations differ by 5-30%.
Absolute samples taken minutes apart are not comparable. So every measurement is
relative: windows alternate between the incumbent and a candidate (``A B A B A``), each
candidate window is scored against the incumbent windows on either side (``paired``), and
the ratios to the default come from the graph of those comparisons by least squares, each
with a standard error.

Why racing, not a Gaussian process: the previous tuner modelled the whole space and moved
only inside a trust region around the default, and in two of three benchmark runs never
left the default although it ran at 0.72-0.85 of the best. A budget of 300 steps holds
about 56 windows, too few to learn a surface under this noise; it is enough to race the
dozen candidates the job's structure points at (``seeds``) and confirm a winner.

The round, in three stages (``ask`` returns the next window's configuration, ``tell`` its
score):

1. **Screening by successive halving.** Every candidate gets one comparison with the
   incumbent (a rung); then the better half by estimate goes on to the next rung, and so
   on. A candidate clearly worse than the incumbent (``Z_DROP`` standard errors) is
   dropped at once, so a bad configuration costs one window. One clearly ahead after its
   first comparison is compared again at once, ahead of the rung (``_promising``), and one
   clearly better (``Z_PROMOTE`` standard errors, at least ``MIN_PROMOTE`` comparisons)
   becomes the incumbent at once: the job then runs the better configuration for the
   rest of the round, which bounds what exploring costs. A promotion also ends screening
   as soon as the windows are sized to the noise (``GIVE_UP_DIFFERENCES`` incumbent
   differences measured): the promoted candidate goes to the sequential test alone, and
   if the test rejects it (a lucky pair of windows), the default is the incumbent again
   and the race goes on. A promotion re-expresses the candidates still racing around the
   new incumbent (``_rebase``: each keeps its own change and takes the incumbent's other
   knobs), so the windows left run near the job's new speed. After the first rung, the
   best threshold and the best cycle time, when each beat the default, are combined
   into one more candidate. Screening ends
   when one candidate is left or its share of the windows is spent, or early when the
   default is best: the first rung is over, the default is still the incumbent, and
   every candidate left was compared at least twice and measured no faster
   (``_default_is_best``). Exploring on would only cost the job windows.

2. **Confirmation by a sequential test.** The finalist (the configuration with the best
   lower bound above the default) and the default alternate, ``F D F D F``, and only these
   fresh comparisons count (the screening that selected the finalist flatters it). After
   each one, Wald's sequential probability ratio test of "no better" (log ratio 0) against
   "better by ``DELTA``" decides, with error rates ``ALPHA`` (calling a configuration that
   is no better a winner; split between the finalists, at most ``FINALISTS`` a round
   whether tested together or one after a promotion) and ``BETA`` (missing a gain of
   ``DELTA``). A large gain is confirmed in a few windows and the round ends early; a
   finalist the test rejects gives way to the runner-up.

3. **The answer.** A confirmed finalist, or else the default (``kept_default``): a
   configuration that did not pass the test is never recommended, so a job is never left
   slower than the tuner found it on purpose. The ``Decision`` says how much the choice
   changed step time, with a 95% interval from the confirmation comparisons.

The controller sizes the windows to the job's noise (``sizing``): ``resize`` tells the
tuner that windows grew (fewer of them, each less noisy; comparisons keep their own
weight), and ``give_up`` ends a round too noisy to decide anything, keeping the default.

Rounds too short to confirm (under ``MIN_CONFIRM_ROUND`` windows, e.g. tests) recommend
only a configuration whose screening lower bound against the default is above 0 by
``Z_RECOMMEND`` standard errors.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from hvdprof.autotune.log import ROLE_CANDIDATE, ROLE_INCUMBENT
from hvdprof.autotune.paired import (
    Comparison,
    RelativeEstimate,
    comparison_noise,
    drift_free_difference,
    estimate_relative,
    flanked_log_ratio,
    window_noise,
)
from hvdprof.autotune.seeds import JobStructure, combine, seed_candidates
from hvdprof.autotune.sizing import GIVE_UP_DIFFERENCES
from hvdprof.autotune.space import CACHE_AXIS, CYCLE_AXIS, FUSION_AXIS, SearchSpace
from hvdprof.common.records import TunableParams

#: fewest comparisons before a candidate can become the incumbent
MIN_PROMOTE = 2
#: standard errors: drop a candidate below the incumbent by this much; promote above it by
#: this much; in a round too short to confirm, recommend above the default by this much
Z_DROP = 1.0
Z_PROMOTE = 1.0
Z_RECOMMEND = 1.64
#: the sequential test: the gain it is designed to detect (log ratio, 5%), and its error
#: rates (ALPHA: a configuration no better than the default confirmed, over all finalists;
#: BETA: a gain of DELTA missed)
DELTA = math.log(1.08)
ALPHA = 0.05
BETA = 0.2
#: fewest confirmation comparisons before a finalist can be accepted
MIN_CONFIRM = 3
#: finalists raced against the default, one after the other
FINALISTS = 2
#: rounds shorter than this many windows skip confirmation (see the module doc)
MIN_CONFIRM_ROUND = 16
#: z of the reported 95% intervals
Z_INTERVAL = 1.96


def confirm_windows(max_samples: int) -> int:
    """Windows kept back for confirmation: 40% of the round, at least 8; none in a round
    too short to confirm. Screening may end early and leave confirmation more.

    >>> confirm_windows(8), confirm_windows(24), confirm_windows(56)
    (0, 8, 22)
    """
    if max_samples < MIN_CONFIRM_ROUND:
        return 0
    return max(8, int(max_samples * 0.4) // 2 * 2)


def prior_window_std(relative_noise: float) -> float:
    """Noise of one window's log score assumed before any is measured: ``relative_noise``
    is the spread of one window's score (0.3: within about +-30%), taken as two standard
    deviations."""
    return math.log1p(max(relative_noise, 0.01)) / 2


def sprt_bounds(alpha: float, beta: float) -> tuple[float, float]:
    """Wald's thresholds on the log likelihood ratio: (reject below, accept above).

    >>> [round(x, 3) for x in sprt_bounds(0.025, 0.2)]
    [-1.584, 3.466]
    """
    return math.log(beta / (1 - alpha)), math.log((1 - beta) / alpha)


def sprt_llr(values: Sequence[float], delta: float, sigma: float) -> float:
    """Log likelihood ratio of mean ``delta`` against mean 0 for normal ``values`` of
    standard deviation ``sigma``.

    >>> round(sprt_llr([0.1, 0.1], 0.05, 0.1), 3)
    0.75
    """
    return delta / sigma**2 * sum(v - delta / 2 for v in values)


@dataclass(frozen=True, slots=True)
class Observation:
    """What the tuner knows about one configuration measured in this run."""

    params: TunableParams
    mean_score: float  # mean bytes/s of its windows (absolute: for display only)
    count: int  # windows measured
    ratio_to_default: float = 1.0  # paired estimate (1.10 = 10% faster than the default)
    ratio_lower_bound: float = 1.0  # ratio_to_default, pessimistic by Z_RECOMMEND std errors


@dataclass(frozen=True, slots=True)
class Decision:
    """What the round decided, for the one line said at its end.

    ``log_ratio``/``std_error``: the chosen configuration's throughput against the default
    (confirmation comparisons only when confirmed); when the default was kept they describe
    ``best_tried`` (the most promising configuration measured), if any. ``windows``: the
    paired windows behind that estimate (both sides).
    """

    params: TunableParams
    kept_default: bool
    default: TunableParams
    log_ratio: float
    std_error: float
    windows: int
    best_tried: TunableParams | None
    confirmed: bool
    tried: int  # configurations measured besides the default
    #: why: "confirmed", "rejected", "undecided", "nothing better", "screening", "default
    #: best" (screening found nothing faster and stopped exploring early), "too noisy"
    reason: str
    #: the numbers behind a "too noisy" verdict, in words (see ``PairedTuner.give_up``)
    detail: str = ""

    def step_time_change(self, z: float = 0.0) -> float:
        """Relative change of step time (-0.14 = 14% shorter), pessimistic by ``z``
        standard errors (positive ``z``: the smaller gain)."""
        return math.exp(-(self.log_ratio - z * self.std_error)) - 1.0


class PairedTuner:
    """Propose the next window's configuration (``ask``), learn from its score (``tell``).

    ``max_samples`` counts windows told in this run; after that many (or once the round
    has decided) ``converged`` is True and ``best`` is the recommendation. ``default`` is
    the reference every ratio is to (the configuration the job started with; it may lie
    outside the space, e.g. fusion off). ``first_candidates`` are raced first (a warm
    start's recommendation, or the runner-ups of a previous round); ``structure`` is what
    the job's first steps showed (``seeds``); ``explore`` False races only
    ``first_candidates`` (a round re-opened on drift).
    """

    def __init__(
        self,
        space: SearchSpace,
        max_samples: int,
        default: TunableParams,
        noise: float = 0.3,
        seed: int = 0,
        first_candidates: Sequence[TunableParams] = (),
        structure: JobStructure | None = None,
        explore: bool = True,
    ) -> None:
        if space.is_empty:
            raise ValueError("every tunable knob is fixed: nothing to search")
        if max_samples < 1:
            raise ValueError("max_samples must be >= 1")
        self.space = space
        self.max_samples = max_samples
        self.noise = float(noise)
        self.seed = seed
        self.structure = structure
        self.default = space.canonical(default) if space.contains(default) else default
        self.prior_std = prior_window_std(self.noise)
        self.confirm = confirm_windows(max_samples)
        self.incumbent: TunableParams = self.default
        self.samples_told = 0
        self.comparisons: list[Comparison] = []
        self._scores: dict[TunableParams, list[float]] = {}
        self._order: list[TunableParams] = []
        pool: list[TunableParams] = []
        for p in first_candidates:
            if space.contains(p):
                p = space.canonical(p)
                if p != self.default and p not in pool:
                    pool.append(p)
        if explore:
            pool += [p for p in seed_candidates(space, self.default, structure) if p not in pool]
        #: candidates still racing, and the rung (comparisons each must reach) in progress
        self._pool: list[TunableParams] = pool
        self._rung = 1
        self._counts: dict[TunableParams, int] = {}
        self._combined = False
        self._dropped: set[TunableParams] = set()
        #: a racing configuration -> the variation of the default it was made from
        #: (``_rebase``); a configuration absent is its own
        self._seed_of: dict[TunableParams, TunableParams] = {}
        # the window in progress
        self._next_role = ROLE_INCUMBENT
        self._asked: TunableParams | None = None
        self._candidate: TunableParams | None = None
        self._last_incumbent_score: float | None = None
        self._pending_candidate_score: float | None = None
        self._estimates: dict[Hashable, RelativeEstimate] = {self.default: _ZERO}
        #: log differences of incumbent windows one candidate window apart (the noise)
        self._incumbent_steps: list[float] = []
        self._incumbent_chain: list[float] = []
        self.sigma = comparison_noise(self.prior_std)
        # confirmation
        self._confirming = False
        self._confirm_now = False
        #: finalists tested (and rejected) by earlier confirmations of this round
        self._tested = 0
        self._finalists: list[TunableParams] = []
        self._confirmed: dict[TunableParams, list[float]] = {}
        self._rejected: set[TunableParams] = set()
        self._winner_params: TunableParams | None = None
        self._done = False
        self._reason = "screening"
        self.promotions = 0
        self.dropped_early = 0
        #: noise of the current windows relative to the first ones (``resize``)
        self.noise_unit = 1.0
        self._detail = ""
        #: every tuning window's configuration, in order (throughput while tuning)
        self._told: list[TunableParams] = []

    # --- ask / tell -------------------------------------------------------------------

    @property
    def next_role(self) -> str:
        """``incumbent`` or ``candidate``: the role of the window ``ask`` returns."""
        return self._next_role

    def ask(self) -> TunableParams:
        """The configuration of the next window (the same one until something is told)."""
        if self._asked is not None:
            return self._asked
        if not self._confirming and not self._done and self._screening_over():
            self._start_confirmation()
        if self._next_role == ROLE_INCUMBENT or self._done:
            self._asked = self.incumbent
        else:
            if self._candidate is None:
                self._candidate = self._next_candidate()
            if self._candidate is None:  # nothing left to compare
                if self.confirm == 0 and not self._confirming:
                    self._finish("screening")  # a short round: screening is all it does
                self._asked = self.incumbent
                self._next_role = ROLE_INCUMBENT
            else:
                self._asked = self._candidate
        return self._asked

    def tell(self, params: TunableParams, score: float) -> Observation:
        """Record that a window of ``params`` scored ``score`` bytes/s.

        ``params`` is normally what ``ask`` returned. Anything else is recorded but breaks
        the alternation: the next window re-measures the incumbent before a comparison.
        """
        if not math.isfinite(score):
            raise ValueError(f"score must be finite, got {score}")
        if self.space.contains(params):
            key = self.space.canonical(params)
        elif params == self.default:
            key = params
        else:
            raise ValueError(f"{params} is outside the search space {self.space}")
        expected, self._asked = self._asked, None
        if expected is None:
            expected = self.incumbent if self._next_role == ROLE_INCUMBENT else self._candidate
        self.samples_told += 1
        self._told.append(key)
        if key not in self._scores:
            self._scores[key] = []
            self._order.append(key)
        self._scores[key].append(float(score))
        if key != expected:
            self._last_incumbent_score = score if key == self.incumbent else None
            self._pending_candidate_score = None
            self._next_role = ROLE_CANDIDATE if key == self.incumbent else ROLE_INCUMBENT
            return self.observation(key)
        if self._next_role == ROLE_INCUMBENT:
            self._told_incumbent(float(score))
        else:
            self._pending_candidate_score = float(score)
            self._next_role = ROLE_INCUMBENT
        return self.observation(key)

    def _told_incumbent(self, score: float) -> None:
        pending, self._pending_candidate_score = self._pending_candidate_score, None
        before = self._last_incumbent_score
        self._last_incumbent_score = score
        self._next_role = ROLE_CANDIDATE
        log_score = math.log(max(score, 1e-12))
        if before is None:
            self._incumbent_chain = [log_score]
        else:
            chain = self._incumbent_chain
            chain.append(log_score)
            if len(chain) >= 3:
                self._incumbent_steps.append(drift_free_difference(chain[-3], chain[-2], chain[-1]))
                self.sigma = comparison_noise(window_noise(self._incumbent_steps, self.prior_std))
        if pending is None or before is None or self._candidate is None or self._done:
            return
        ratio = flanked_log_ratio(before, pending, score)
        candidate = self._candidate
        self.comparisons.append(Comparison(candidate, self.incumbent, ratio, self.noise_unit))
        self._estimate()
        if self._confirming:
            self._decide_finalist(-ratio)  # the default sat between the finalist's windows
        else:
            self._counts[candidate] = self._counts.get(candidate, 0) + 1
            self._candidate = None
            self._race(candidate)
            if self._default_is_best():
                self._finish("default best")

    def _estimate(self) -> None:
        self._estimates = estimate_relative(
            self.comparisons, self.default, self.sigma, self.noise_unit
        )

    # --- screening ----------------------------------------------------------------------

    def _relative(self, params: TunableParams) -> tuple[float, float]:
        """(log ratio to the incumbent, its standard error) from the estimates."""
        est = self._estimates.get(params)
        inc = self._estimates.get(self.incumbent, _ZERO)
        if est is None:
            return 0.0, math.inf
        return est.log_ratio - inc.log_ratio, math.hypot(est.std_error, inc.std_error)

    def _race(self, candidate: TunableParams) -> None:
        """After a comparison: drop the candidate, promote it, or leave it in the race."""
        diff, se = self._relative(candidate)
        if diff + Z_DROP * se < 0:
            if self._counts.get(candidate, 0) == 1:
                self.dropped_early += 1
            self._drop(candidate)
        elif self._counts.get(candidate, 0) >= MIN_PROMOTE and diff - Z_PROMOTE * se > 0:
            self._drop(candidate)  # it leaves the pool: it is the incumbent now
            self.promotions += 1
            self.incumbent = candidate
            self._rebase()
            self._last_incumbent_score = None  # the next window measures the new incumbent
            self._next_role = ROLE_INCUMBENT
            self._confirm_now = True

    def _rebase(self) -> None:
        """Re-express the candidates still racing around the incumbent: each keeps the
        change it makes to the default and takes the incumbent's other knobs.

        Why: every candidate window runs the job on that candidate, and a variation of a
        default the race has left runs it at the default's speed in every other knob. On
        the fusion-bound job, once a 3 MiB threshold was promoted (the default at 0.71 of
        the best), its four cycle-time windows still ran at the 4 MiB default threshold:
        about 25 of the round's 290 steps at 0.71-0.75 of the best, 2% of its throughput
        while tuning. Around the incumbent the same windows measure the knob where the job now
        is, and a candidate that beats the incumbent there is the combination the round
        would otherwise try only after its first rung. Back on the default (a promotion
        the test rejected), the candidates are the default's variations again."""
        pool: list[TunableParams] = []
        for p in self._pool:
            seed = self._seed_of.get(p, p)
            moved = combine(self.default, seed, self.incumbent)
            moved = self.space.canonical(moved) if self.space.contains(moved) else seed
            if moved == self.incumbent or moved in pool or moved in self._dropped:
                continue
            if moved != seed:
                self._seed_of[moved] = seed
            pool.append(moved)
        self._pool = pool

    def _default_is_best(self) -> bool:
        """True when screening has seen enough to stop exploring: the default is still the
        incumbent, the first rung is over (every candidate was compared once, the worse
        half left) and every candidate still racing was compared at least twice and
        measured no faster than the default. Exploring on would only cost the job the
        candidates' windows: the round ends with the default."""
        if self.incumbent != self.default or self._rung < 2 or self.confirm == 0:
            return False
        live = [p for p in self._pool if p != self.incumbent]
        if any(self._counts.get(p, 0) < MIN_PROMOTE for p in live):
            return False
        return all(self._estimate_of(p) <= 0 for p in live)

    def _drop(self, params: TunableParams) -> None:
        if params in self._pool:
            self._pool.remove(params)
            self._dropped.add(params)

    def _next_candidate(self) -> TunableParams | None:
        if self._confirming:
            return self.default
        pool = [p for p in self._pool if p != self.incumbent]
        if not pool:
            return None
        promising = self._promising(pool)
        if promising is not None:
            return promising
        behind = [p for p in pool if self._counts.get(p, 0) < self._rung]
        if not behind:  # the rung is complete: halve, combine, next rung
            self._end_rung()
            pool = [p for p in self._pool if p != self.incumbent]
            if not pool or self._screening_over():
                return None
            behind = [p for p in pool if self._counts.get(p, 0) < self._rung] or pool
        return behind[0]

    def _promising(self, pool: Sequence[TunableParams]) -> TunableParams | None:
        """A candidate whose comparisons so far put it clearly above the incumbent but are
        too few to promote it: it is looked at again at once, ahead of the rung. Waiting for
        the rung to finish kept the job on the slower incumbent for every other candidate's
        window first (the fusion-bound job's 3 MiB threshold, 40% faster in its first
        window, got its second look 100 steps later)."""
        for p in pool:
            if 0 < self._counts.get(p, 0) < MIN_PROMOTE:
                diff, se = self._relative(p)
                if diff - Z_PROMOTE * se > 0:
                    return p
        return None

    def _end_rung(self) -> None:
        if not self._combined:
            self._combined = True
            mixed = self._combination()
            if mixed is not None and mixed not in self._pool and mixed not in self._dropped:
                self._pool.append(mixed)
        ranked = sorted(self._pool, key=lambda p: -self._estimate_of(p))
        keep = max(1, math.ceil(len(ranked) / 2))
        for p in ranked[keep:]:
            if self._counts.get(p, 0) >= self._rung:  # a newcomer gets its first look
                self._drop(p)
        self._rung += 1

    def _estimate_of(self, params: TunableParams) -> float:
        est = self._estimates.get(params)
        return -math.inf if est is None else est.log_ratio

    def _combination(self) -> TunableParams | None:
        """The best threshold-only and the best cycle-time-only variation, together, when
        each measured above the default."""
        best: dict[str, TunableParams] = {}
        for p in self._scores:
            if p == self.default or self._estimate_of(p) <= 0:
                continue
            changed = [
                a
                for a in (FUSION_AXIS, CYCLE_AXIS, CACHE_AXIS)
                if getattr(p, a) != getattr(self.default, a)
            ]
            if len(changed) != 1:
                continue
            axis = changed[0]
            if axis not in best or self._estimate_of(p) > self._estimate_of(best[axis]):
                best[axis] = p
        if FUSION_AXIS not in best or CYCLE_AXIS not in best:
            return None
        mixed = combine(self.default, best[FUSION_AXIS], best[CYCLE_AXIS])
        if not self.space.contains(mixed):
            return None
        mixed = self.space.canonical(mixed)
        return None if mixed in self._scores else mixed

    def _screening_over(self) -> bool:
        if self.confirm == 0:
            return False  # a short round only screens
        if self._confirm_now and len(self._incumbent_steps) >= GIVE_UP_DIFFERENCES:
            return True  # a promotion, once the windows are sized to the noise
        if self.samples_told >= self.max_samples - self.confirm:
            return True
        live = [p for p in self._pool if p != self.incumbent]
        return not live or (
            len(live) == 1 and self._counts.get(live[0], 0) >= self._rung and self._rung > 2
        )

    # --- confirmation -----------------------------------------------------------------

    def _start_confirmation(self) -> None:
        self._confirming = True
        candidates = [
            (p, e)
            for p, e in self._estimates.items()
            if p != self.default
            and isinstance(p, TunableParams)
            and e.log_ratio > 0
            and p not in self._rejected
        ]
        # by lower bound: one lucky window must not outrank a steady gain
        candidates.sort(key=lambda pe: -pe[1].lower_bound(Z_DROP))
        if self._confirm_now and any(p == self.incumbent for p, _ in candidates):
            # a promotion ended screening: the promoted candidate alone is tested (one
            # lucky window of another is no rival), and a rejection resumes screening
            self._finalists = [self.incumbent]
        else:
            self._confirm_now = False
            self._finalists = [p for p, _ in candidates[: FINALISTS - self._tested]]
        self._candidate = None
        self._pending_candidate_score = None
        self._next_finalist()

    def _next_finalist(self) -> None:
        pool = [p for p in self._finalists if p not in self._rejected and p not in self._confirmed]
        windows_left = self.max_samples - self.samples_told
        if not pool and self._confirm_now and self._can_resume():
            self._resume_screening()
            return
        if not pool or windows_left < 2 * MIN_CONFIRM + 1:
            if not self._finalists:
                self._finish("nothing better")
            else:
                self._finish("rejected" if self._rejected and not pool else "undecided")
            return
        finalist = pool[0]
        self._confirmed[finalist] = []
        if finalist != self.incumbent:
            self.incumbent = finalist
            self._last_incumbent_score = None
            self._next_role = ROLE_INCUMBENT
        self._candidate = self.default

    def _can_resume(self) -> bool:
        """After a promoted candidate was rejected: screening goes on when another test
        is allowed, screening windows are left and a candidate is still racing."""
        return (
            self._tested + len(self._finalists) < FINALISTS
            and self.samples_told < self.max_samples - self.confirm
            and any(p not in self._rejected for p in self._pool)
        )

    def _resume_screening(self) -> None:
        """The promoted candidate failed the sequential test: back to the default as the
        incumbent, and on with the race (a lucky promotion must not end the round)."""
        self._tested += len(self._finalists)
        self._finalists = []
        self._confirming = False
        self._confirm_now = False
        self._reason = "screening"
        self.incumbent = self.default
        self._rebase()
        self._candidate = None
        self._pending_candidate_score = None
        self._last_incumbent_score = None
        self._next_role = ROLE_INCUMBENT

    def _decide_finalist(self, log_ratio: float) -> None:
        """One fresh comparison of the finalist in hand with the default; the test decides."""
        finalist = self.incumbent
        fresh = self._confirmed.setdefault(finalist, [])
        fresh.append(log_ratio)
        # the error rate is shared by every finalist the round may test: a confirmation a
        # promotion began may be followed by another
        if self._confirm_now or self._tested:
            alpha = ALPHA / FINALISTS
        else:
            alpha = ALPHA / max(1, len(self._finalists))
        reject, accept = sprt_bounds(alpha, BETA)
        llr = sprt_llr(fresh, DELTA, self.sigma)
        if llr >= accept and len(fresh) >= MIN_CONFIRM:
            self._winner_params = finalist
            self._finish("confirmed")
        elif llr <= reject:
            self._rejected.add(finalist)
            self._reason = "rejected"
            self._next_finalist()
        elif self.max_samples - self.samples_told < 2:
            self._reason = "undecided"

    def _finish(self, reason: str) -> None:
        """The round is decided: the winner (or the default) is the incumbent from now on."""
        self._reason = reason
        self._done = True
        self._candidate = None
        self.incumbent = self._winner() or self.default
        self._next_role = ROLE_INCUMBENT

    # --- the round's size (the controller sizes windows to the noise: ``sizing``) ------

    @property
    def confirming(self) -> bool:
        """True once screening is over and the sequential test runs."""
        return self._confirming

    def measured_window_noise(self) -> tuple[float, int]:
        """(one window's log-score standard deviation from the incumbent's own windows
        alone, no prior; the differences behind it). ``(nan, 0)`` before any."""
        steps = self._incumbent_steps
        if not steps:
            return math.nan, 0
        return math.sqrt(sum(d * d for d in steps) / 2 / len(steps)), len(steps)

    def resize(self, max_samples: int, noise_scale: float) -> None:
        """Windows from now on are longer, their noise ``noise_scale`` times the current
        windows': the noise measured so far is rescaled to the new windows, comparisons
        already made keep their own weight, and the round holds ``max_samples`` windows in
        all (the same steps, fewer windows)."""
        if noise_scale <= 0:
            raise ValueError("noise_scale must be > 0")
        self.noise_unit *= noise_scale
        self.prior_std *= noise_scale
        if noise_scale != 1.0:
            self._incumbent_steps = [d * noise_scale for d in self._incumbent_steps]
            self._incumbent_chain = []  # differences of windows of one length only
        self.sigma = comparison_noise(window_noise(self._incumbent_steps, self.prior_std))
        self.max_samples = max(self.samples_told + 1, max_samples)
        if self.confirm > 0:
            self.confirm = confirm_windows(max(self.max_samples, MIN_CONFIRM_ROUND))
        self._estimate()

    def out_of_budget(self) -> None:
        """The round's steps are spent (windows cost more steps than planned): it ends
        now, undecided unless a finalist was confirmed, keeping the default then."""
        if not self._done:
            self._finish("undecided")

    def give_up(self, reason: str, detail: str = "") -> None:
        """End the round now with the default (e.g. "too noisy": ``detail`` says why)."""
        self._detail = detail
        self._winner_params = None
        self._finish(reason)

    def while_tuning_ratio(self) -> float:
        """The job's throughput over the round's windows so far against the default's, by
        the paired estimates of the configurations they ran (1.0: exploring cost nothing;
        0.9: the job ran 10% slower than it would have untuned)."""
        if not self._told:
            return 1.0
        total = 0.0
        for params in self._told:
            est = self._estimates.get(params)
            total += 1.0 if est is None else est.ratio
        return total / len(self._told)

    def best_ratio(self) -> float:
        """The largest paired estimate of a throughput ratio to the default (at least 1)."""
        ratios = [e.ratio for p, e in self._estimates.items() if p in self._scores]
        return max([1.0, *ratios])

    # --- what has been learned ------------------------------------------------------

    def estimate(self, params: TunableParams) -> RelativeEstimate | None:
        """The paired estimate of ``params``'s log ratio to the default, if measured."""
        key = self.space.canonical(params) if self.space.contains(params) else params
        return self._estimates.get(key)

    def observation(self, params: TunableParams) -> Observation:
        """Measured mean and count, and the paired ratio to the default, of ``params``."""
        key = self.space.canonical(params) if self.space.contains(params) else params
        scores = self._scores.get(key, [])
        mean = sum(scores) / len(scores) if scores else 0.0
        if key == self._winner_params:  # the confirmation's fresh measurements
            log_ratio, se = self._fresh(key)
            return Observation(
                key,
                mean,
                len(scores),
                math.exp(log_ratio),
                math.exp(log_ratio - Z_RECOMMEND * se),
            )
        est = self._estimates.get(key)
        if est is None:
            return Observation(key, mean, len(scores))
        return Observation(
            key,
            mean,
            len(scores),
            ratio_to_default=est.ratio,
            ratio_lower_bound=math.exp(est.lower_bound(Z_RECOMMEND)),
        )

    def _fresh(self, finalist: TunableParams) -> tuple[float, float]:
        """Mean and standard error of the confirmation comparisons of ``finalist``."""
        fresh = self._confirmed.get(finalist, [])
        if not fresh:
            return 0.0, math.inf
        return sum(fresh) / len(fresh), self.sigma / math.sqrt(len(fresh))

    @property
    def observations(self) -> list[Observation]:
        """Every configuration measured in this run, in first-measured order."""
        return [self.observation(p) for p in self._order]

    @property
    def converged(self) -> bool:
        """True once the round has decided, or ``max_samples`` windows were told."""
        return self._done or self.samples_told >= self.max_samples

    def _winner(self) -> TunableParams | None:
        """The recommended configuration, None to keep the default (see the module doc)."""
        if self._winner_params is not None:
            return self._winner_params
        if self.confirm > 0:
            return None  # only a confirmed finalist is recommended
        best, bound = None, 0.0
        for params, est in self._estimates.items():
            if params == self.default or est.against_default < MIN_PROMOTE:
                continue
            lower = est.lower_bound(Z_RECOMMEND)
            if lower > bound:
                best, bound = params, lower
        return best  # type: ignore[return-value]

    @property
    def kept_default(self) -> bool:
        """True while no configuration has beaten the default with confidence."""
        return self._winner() is None

    @property
    def best(self) -> Observation | None:
        """The recommendation: the winner, else the default. None before anything was told."""
        if not self._scores:
            return None
        winner = self._winner()
        return self.observation(self.default if winner is None else winner)

    def decision(self) -> Decision:
        """What the round decided (or would, were it to end now)."""
        winner = self._winner()
        tried = len([p for p in self._scores if p != self.default])
        if winner is not None:
            if winner in self._confirmed:
                mean, se = self._fresh(winner)
                windows = 2 * len(self._confirmed[winner]) + 1
            else:
                est = self._estimates[winner]
                mean, se = est.log_ratio, est.std_error
                windows = 2 * est.comparisons + 1
            return Decision(
                winner, False, self.default, mean, se, windows, winner,
                winner in self._confirmed, tried, self._reason, self._detail,
            )  # fmt: skip
        best_tried, mean, se, windows = None, 0.0, math.inf, 0
        fresh = [p for p in self._confirmed if self._confirmed[p]]
        if fresh:  # the confirmation's own measurements, unflattered by the selection
            best_tried = max(fresh, key=lambda p: self._fresh(p)[0])
            mean, se = self._fresh(best_tried)
            windows = 2 * len(self._confirmed[best_tried]) + 1
        else:
            ranked = [
                (p, e)
                for p, e in self._estimates.items()
                if p != self.default and isinstance(p, TunableParams)
            ]
            if ranked:
                best_tried, est = max(ranked, key=lambda pe: pe[1].log_ratio)
                mean, se, windows = est.log_ratio, est.std_error, 2 * est.comparisons + 1
        return Decision(
            self.default, True, self.default, mean, se, windows, best_tried, False, tried,
            self._reason, self._detail,
        )  # fmt: skip

    def verdict(self) -> str:
        """One line on the recommendation, for people (without the variables)."""
        if not self._scores:
            return "nothing measured yet"
        d = self.decision()
        if d.kept_default:
            return "kept the default: " + kept_reason(d)
        return (
            f"{math.exp(d.log_ratio):.3f}x the default's throughput, step time "
            f"{percent(d.step_time_change())} ({interval_text(d)})"
        )

    def ranked(self) -> list[Observation]:
        """Configurations measured in this run, best paired estimate first."""
        items = [p for p, _ in sorted(self._estimates.items(), key=lambda pe: -pe[1].log_ratio)]
        order = [p for p in items if p in self._scores]
        rest = [p for p in self._order if p not in order]
        return [self.observation(p) for p in order + rest]  # type: ignore[arg-type]


def percent(change: float) -> str:
    """A relative change as a signed percentage : ``-14%``."""
    value = round(100 * change)
    if value == 0:
        return "±0%"
    return f"{'-' if value < 0 else '+'}{abs(value)}%"


def interval_text(d: Decision) -> str:
    """The 95% interval of the step-time change, low to high, e.g. ``95% interval -18% to
    -10%`` (the demo printed a kept default's as "+13% to -14%", which reads as a typo)."""
    if not math.isfinite(d.std_error):
        return "no interval: not compared"
    low, high = sorted((d.step_time_change(Z_INTERVAL), d.step_time_change(-Z_INTERVAL)))
    return f"95% interval {percent(low)} to {percent(high)}"


def kept_reason(d: Decision) -> str:
    """Why the default was kept, in words that are true of the measurements."""
    if d.reason == "too noisy":
        return "too noisy to tune" + (f": {d.detail}" if d.detail else "")
    if d.reason == "default best":
        return (
            f"the default is the best measured: of the {d.tried} settings tried, those still "
            "in the race measured no faster in two comparisons each, so exploring stopped early"
        )
    if d.tried == 0:
        return "nothing else was measured"
    if d.best_tried is None or not math.isfinite(d.std_error):
        return f"none of the {d.tried} settings tried beat it"
    head = f"none of the {d.tried} settings tried beat it with 95% confidence"
    if d.reason == "rejected":
        head = f"no finalist passed the sequential test (error rate {ALPHA:g}); {head}"
    elif d.reason == "undecided":  # the budget ended, sizing could not make it decide
        head = (
            f"the budget ended before a finalist passed the sequential test (error rate "
            f"{ALPHA:g}); {head}"
        )
    return head


_ZERO = RelativeEstimate(0.0, 0.0, 0, 0)
