"""The tuner: a plain ask/tell object that compares configurations in pairs, no runtime inside.

Why paired: on a shared machine one configuration's score varies by +-25% from one window
to the next and the machine's speed drifts, while good configurations differ by at most
15%. Absolute samples taken minutes apart are not comparable, so a tuner that ranks them
chases noise, and the job's starting configuration, measured once, is as likely to look
bad as good. Here every measurement is relative: windows alternate between the incumbent
and a candidate (``A B A B A``), each candidate window is scored against the incumbent
windows on either side (``paired``), and the ratios to the default come from the graph of
those comparisons by least squares, each with a standard error.

The loop (``ask`` returns the configuration of the next window, ``tell`` its score):

1. **Incumbent and candidate.** The incumbent starts as the default (the configuration the
   job started with). A candidate is measured in up to ``MAX_COMPARISONS`` windows, each
   between two incumbent windows. After each one the tuner decides (racing):

   * clearly worse (mean ratio below 0 by ``Z_DROP`` standard errors, which after one
     window means "more than about one noise level worse"): drop it at once, so a bad
     configuration costs one window, not a whole sample;
   * clearly better (at least ``MIN_PROMOTE`` windows, mean above 0 by ``Z_PROMOTE``
     standard errors): it becomes the incumbent;
   * otherwise measure it again, up to ``MAX_COMPARISONS``.

2. **Proposals** come from a Gaussian process over the unit cube (log-scaled axes) fitted
   to the relative estimates, each with its own noise (its squared standard error), and
   a prior mean of 0: "no better than the default" until measured otherwise. Candidates
   maximise expected improvement over the incumbent, but only inside a **trust region**
   around it (a box of side ``trust``, TuRBO's rule: grow after a promotion, halve after
   ``FAILURES_TO_SHRINK`` candidates in a row that were not). Exploration therefore stays
   near a configuration known to be good, which bounds what it costs the job. The first
   candidates are a small Latin hypercube in the first trust region (or, on a warm start,
   the earlier run's recommendation).

3. **Confirmation.** The last ``confirm_windows`` windows race the finalists directly
   against the default: the finalist becomes the flanking configuration and the default
   the one in between. Finalists are the configurations above the default with the best
   *lower* bounds (a configuration reached through a chain of promotions, or measured
   once, carries the luck that selected it). The first finalist keeps the phase unless
   fresh comparisons show it no better than the default; then the runner-up gets the
   rest. With no finalist left the round ends early.

4. **Recommendation** (``best``): during exploration, the configuration compared with the
   default directly at least ``MIN_PROMOTE`` times whose ratio to it has the highest lower
   bound (``Z_RECOMMEND`` standard errors), if above 1. Once confirmation has begun, only
   the finalists count, each bound from its fresh comparisons alone: selecting among many
   candidates on the same measurements that then judge the winner would make false
   winners likely. If no bound is above 1 the recommendation is the default and
   ``kept_default`` says so: a configuration that has not beaten the default in paired
   measurements is never recommended. (With 1.64 standard errors, about 1 flat-objective
   run in 20 recommends something no better than the default; see the unit tests.)

Warm start: the earlier run's recommendation is the first candidate; only measurements in
this run count, since the machine or the job may have changed.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
import warnings
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

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
from hvdprof.autotune.space import SearchSpace
from hvdprof.common.records import TunableParams

#: most comparisons (candidate windows) one candidate gets against one incumbent
MAX_COMPARISONS = 4
#: fewest comparisons before a candidate can become the incumbent
MIN_PROMOTE = 2
#: standard errors: drop a candidate below 0 by this much; promote above 0 by this much;
#: recommend only with a lower bound above 0 by this much
Z_DROP = 1.0
Z_PROMOTE = 1.0
Z_RECOMMEND = 1.64
#: trust region: side of the box (unit-cube units) at start, its bounds, and the failures
#: in a row that halve it
TRUST_START = 0.4
TRUST_MIN = 0.05
TRUST_MAX = 0.8
FAILURES_TO_SHRINK = 3
#: candidates of the first Latin hypercube (inside the first trust region)
DEFAULT_INITIAL_POINTS = 3
#: random points scored by the acquisition per proposal
_ACQ_SAMPLES = 1000
#: proposals lie on a grid of this many steps per numeric axis of the unit cube (a
#: quarter octave of threshold, 9% of cycle time): nearer points differ by less than the
#: noise can tell, and repeated proposals then pool their measurements
GRID_STEPS = 64
#: probability that a proposal keeps the incumbent's value of an on/off axis
_KEEP_CATEGORY = 0.85
#: finalists raced against the default in the confirmation phase: the best estimate, and
#: the runner-up should the best turn out no better than the default (each look at one
#: more finalist is one more chance of a false positive, so there are no more)
FINALISTS = 2

warnings.filterwarnings("ignore", category=UserWarning, module="sklearn")


def confirm_windows(max_samples: int) -> int:
    """Windows at the end of a round spent racing finalists against the default: a third
    of the round, at least 6 (3 comparisons), none in a round too short to explore.

    >>> confirm_windows(8), confirm_windows(24), confirm_windows(64)
    (0, 8, 20)
    """
    if max_samples < 16:
        return 0
    return max(6, max_samples // 3 // 2 * 2)


def prior_window_std(relative_noise: float) -> float:
    """Noise of one window's log score assumed before any is measured: ``relative_noise``
    is the spread of one window's score (0.3: within about +-30%), taken as two standard
    deviations."""
    return math.log1p(max(relative_noise, 0.01)) / 2


def expected_improvement(mu: np.ndarray, std: np.ndarray, incumbent: float) -> np.ndarray:
    """EI of maximising ``mu`` over ``incumbent``."""
    from scipy.stats import norm

    improvement = mu - incumbent
    safe = np.maximum(std, 1e-9)
    z = improvement / safe
    return np.where(
        std > 1e-9,
        improvement * norm.cdf(z) + safe * norm.pdf(z),
        np.maximum(improvement, 0.0),
    )


@dataclass(frozen=True, slots=True)
class Observation:
    """What the tuner knows about one configuration measured in this run."""

    params: TunableParams
    mean_score: float  # mean bytes/s of its windows (absolute: for display only)
    count: int  # windows measured
    ratio_to_default: float = 1.0  # paired estimate (1.10 = 10% faster than the default)
    ratio_lower_bound: float = 1.0  # ratio_to_default, pessimistic by Z_RECOMMEND std errors


@functools.cache
def _threadpools() -> Any:
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def _blas_single_thread() -> contextlib.AbstractContextManager[Any]:
    """GP algebra on one BLAS thread: the matrices are tens of rows, and the training job
    on the same cores needs the threads (scoped: OpenBLAS's count is process-wide)."""
    try:
        return _threadpools().limit(limits=1, user_api="blas")
    except Exception:  # no threadpoolctl, or a BLAS it cannot drive
        return contextlib.nullcontext()


@functools.cache
def _load_model_libraries() -> None:
    """Import what proposals need (scikit-learn's GP, scipy's normal, threadpoolctl's
    scan of BLAS libraries): over a second on a busy machine the first time, which, paid
    at the first proposal, left dozens of steps unmeasured. The tuner starts this on a
    thread of its own when built: the first candidates come from the design and need no
    model, so nothing waits for it."""
    import scipy.stats  # noqa: F401
    import sklearn.gaussian_process  # noqa: F401

    with _blas_single_thread():
        pass


class PairedTuner:
    """Propose the next window's configuration (``ask``), learn from its score (``tell``).

    ``max_samples`` counts windows told in this run; after that many ``converged`` is True
    and ``best`` is the recommendation. ``default`` is the reference every ratio is to (the
    configuration the job started with; it may lie outside the space, e.g. fusion off).
    ``first_candidates`` are measured first (a warm start's recommendation, or the
    runner-ups of a previous round), before the tuner's own design.
    """

    def __init__(
        self,
        space: SearchSpace,
        max_samples: int,
        default: TunableParams,
        noise: float = 0.3,
        seed: int = 0,
        first_candidates: Sequence[TunableParams] = (),
        n_initial_points: int = DEFAULT_INITIAL_POINTS,
    ) -> None:
        if space.is_empty:
            raise ValueError("every tunable knob is fixed: nothing to search")
        if max_samples < 1:
            raise ValueError("max_samples must be >= 1")
        threading.Thread(
            target=_load_model_libraries, name="hvdprof-autotune-import", daemon=True
        ).start()
        self.space = space
        self.max_samples = max_samples
        self.noise = float(noise)
        self.seed = seed
        self.default = space.canonical(default) if space.contains(default) else default
        self.prior_std = prior_window_std(self.noise)
        self.confirm = confirm_windows(max_samples)
        self._rng = np.random.RandomState(seed)
        self.incumbent: TunableParams = self.default
        self.trust = TRUST_START
        self._failures = 0
        self.samples_told = 0
        self.comparisons: list[Comparison] = []
        self._scores: dict[TunableParams, list[float]] = {}
        self._order: list[TunableParams] = []
        self._tried: set[TunableParams] = {self.default}
        self._queue: list[TunableParams] = []
        for p in first_candidates:
            if space.contains(p):
                self._enqueue(space.canonical(p))
        self._queue.extend(p for p in self._design(n_initial_points) if p not in self._queue)
        # the window in progress
        self._next_role = ROLE_INCUMBENT
        self._asked: TunableParams | None = None
        self._candidate: TunableParams | None = None
        self._candidate_ratios: list[float] = []
        self._last_incumbent_score: float | None = None
        self._pending_candidate_score: float | None = None
        self._estimates: dict[Hashable, RelativeEstimate] = {self.default: _ZERO}
        #: log differences of incumbent windows one candidate window apart (the noise)
        self._incumbent_steps: list[float] = []
        self._incumbent_chain: list[float] = []  # log scores of the current incumbent's run
        self.sigma = comparison_noise(self.prior_std)
        self._finalists: list[TunableParams] = []
        self._rejected: set[TunableParams] = set()
        #: finalist -> its fresh confirmation comparisons, log(finalist / default)
        self._confirmed: dict[TunableParams, list[float]] = {}
        self._confirming = False
        self._ended_early = False
        self.promotions = 0
        self.dropped_early = 0

    # --- the design ---------------------------------------------------------------------

    def _enqueue(self, params: TunableParams) -> None:
        if params not in self._queue and params != self.default:
            self._queue.append(params)

    def _design(self, n: int) -> list[TunableParams]:
        """``n`` points of a Latin hypercube in the first trust region around the default."""
        if n <= 0:
            return []
        centre = np.asarray(self.space.to_unit(self.default))
        dims = len(centre)
        strata = np.stack([self._rng.permutation(n) for _ in range(dims)], axis=1)
        unit = (strata + self._rng.uniform(size=(n, dims))) / n
        points = np.clip(
            np.round((centre + (unit - 0.5) * self.trust) * GRID_STEPS) / GRID_STEPS, 0, 1
        )
        categorical = self.space.categorical_axes()
        out: list[TunableParams] = []
        for point in points:
            for axis in categorical:  # the design keeps the default's on/off values
                point[axis] = centre[axis]
            params = self.space.from_unit(point)
            if params != self.default and params not in out:
                out.append(params)
        return out

    # --- ask / tell -------------------------------------------------------------------

    @property
    def confirming(self) -> bool:
        """True in the last ``confirm`` windows: finalists against the default."""
        return self.samples_told >= self.max_samples - self.confirm > 0

    def ask(self) -> TunableParams:
        """The configuration of the next window (the same one until something is told)."""
        if self._asked is not None:
            return self._asked
        if self.confirming and not self._confirming:
            self._start_confirmation()
        if self._next_role == ROLE_INCUMBENT:
            self._asked = self.incumbent
        else:
            if self._candidate is None:
                self._candidate = self._next_candidate()
                self._candidate_ratios = []
            self._asked = self._candidate
        return self._asked

    @property
    def next_role(self) -> str:
        """``incumbent`` or ``candidate``: the role of the window ``ask`` returns."""
        return self._next_role

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
        if pending is None or before is None or self._candidate is None:
            return
        ratio = flanked_log_ratio(before, pending, score)
        self.comparisons.append(Comparison(self._candidate, self.incumbent, ratio))
        self._candidate_ratios.append(ratio)
        self._refresh_estimates()
        self._decide()

    def _decide(self) -> None:
        """Race the candidate in hand: drop it, promote it, or measure it again."""
        candidate = self._candidate
        assert candidate is not None
        ratios = self._candidate_ratios
        n = len(ratios)
        mean = sum(ratios) / n
        se = self.sigma / math.sqrt(n)
        if self._confirming:
            self._decide_finalist(-ratios[-1])
            return
        if mean + Z_DROP * se < 0:
            if n == 1:
                self.dropped_early += 1
            self._end_candidate(promoted=False)
        elif n >= MIN_PROMOTE and mean - Z_PROMOTE * se > 0:
            self._end_candidate(promoted=True)
        elif n >= MAX_COMPARISONS:
            self._end_candidate(promoted=False)

    def _end_candidate(self, promoted: bool) -> None:
        candidate = self._candidate
        self._candidate, self._candidate_ratios = None, []
        if promoted and candidate is not None:
            self.promotions += 1
            self.incumbent = candidate
            self._last_incumbent_score = None  # the next window measures the new incumbent
            self._next_role = ROLE_INCUMBENT
            self._failures = 0
            self.trust = min(self.trust * 2, TRUST_MAX)
            return
        self._failures += 1
        if self._failures >= FAILURES_TO_SHRINK:
            self._failures = 0
            self.trust = max(self.trust / 2, TRUST_MIN)

    # --- confirmation -----------------------------------------------------------------

    def _start_confirmation(self) -> None:
        self._confirming = True
        # by lower bound, not by estimate: a configuration reached through a chain of
        # promotions, or measured once, carries the luck that selected it
        candidates = [
            (p, e)
            for p, e in self._estimates.items()
            if p != self.default and e.comparisons >= MIN_PROMOTE and e.log_ratio > 0
        ]
        candidates.sort(key=lambda pe: -pe[1].lower_bound(Z_DROP))
        self._finalists = [p for p, _ in candidates[:FINALISTS]]  # type: ignore[misc]
        self._candidate, self._candidate_ratios = None, []
        self._pending_candidate_score = None
        self._next_finalist(first=True)

    def _decide_finalist(self, log_ratio: float) -> None:
        """One fresh comparison of the finalist in hand with the default (the default sits
        between the finalist's windows, so ``log_ratio`` is finalist / default, flipped)."""
        finalist = self.incumbent
        fresh = self._confirmed.setdefault(finalist, [])
        fresh.append(log_ratio)
        mean, se = self._fresh(finalist)
        if len(fresh) >= 2 and mean + Z_DROP * se < 0:  # not better than the default
            self._rejected.add(finalist)
            self._next_finalist()

    def _fresh(self, finalist: TunableParams) -> tuple[float, float]:
        """Mean and standard error of the confirmation comparisons of ``finalist``."""
        fresh = self._confirmed.get(finalist, [])
        if not fresh:
            return 0.0, math.inf
        return sum(fresh) / len(fresh), self.sigma / math.sqrt(len(fresh))

    def _next_finalist(self, first: bool = False) -> None:
        """Make the next finalist the flanking configuration, with the default between:
        one with no confirmation yet, else the best confirmed one."""
        self._candidate_ratios = []
        pool = [p for p in self._finalists if p not in self._rejected]
        if not pool:  # nothing beat the default: the round ends here
            self._finalists = []
            self._candidate = None
            self._confirming_default_only()
            return
        untried = [p for p in pool if p not in self._confirmed]
        if untried:
            finalist = untried[0]
        else:
            finalist = max(pool, key=lambda p: self._fresh(p)[0] - Z_RECOMMEND * self._fresh(p)[1])
        if finalist != self.incumbent:
            self.incumbent = finalist
            self._last_incumbent_score = None
            self._next_role = ROLE_INCUMBENT
        self._candidate = self.default

    def _confirming_default_only(self) -> None:
        """No finalist is left: the default stays the answer and the round is over."""
        self.incumbent = self.default
        self._last_incumbent_score = None
        self._next_role = ROLE_INCUMBENT
        self._candidate = None
        self._ended_early = True

    # --- proposals ----------------------------------------------------------------------

    def _next_candidate(self) -> TunableParams:
        if self._confirming:
            return self.default
        while self._queue:
            params = self._queue.pop(0)
            if params not in self._tried and params != self.incumbent:
                self._tried.add(params)
                return params
        params = self._propose()
        self._tried.add(params)
        return params

    def _propose(self) -> TunableParams:
        """Expected improvement over the incumbent, inside the trust region around it."""
        centre = np.asarray(self.space.to_unit(self.incumbent))
        dims = len(centre)
        raw = centre + (self._rng.uniform(size=(_ACQ_SAMPLES, dims)) - 0.5) * self.trust
        for axis in self.space.categorical_axes():
            flip = self._rng.uniform(size=_ACQ_SAMPLES) > _KEEP_CATEGORY
            raw[:, axis] = np.where(flip, 1.0 - centre[axis], centre[axis])
        raw = np.clip(np.round(raw * GRID_STEPS) / GRID_STEPS, 0.0, 1.0)
        fresh: list[TunableParams] = []
        seen: set[TunableParams] = set()
        for point in raw:
            params = self.space.from_unit(point)
            if params not in self._tried and params not in seen:
                seen.add(params)
                fresh.append(params)
        if not fresh:  # the region is exhausted at this rounding: widen it
            self.trust = min(self.trust * 2, 1.0)
            fallback = self.space.from_unit(self._rng.uniform(size=dims))
            return fallback
        model = self._fit()
        if model is None:
            return fresh[int(self._rng.randint(len(fresh)))]
        x = np.asarray([self.space.to_unit(p) for p in fresh])
        with _blas_single_thread():
            mu, std = model.predict(x, return_std=True)
            best_mu = float(model.predict(np.asarray([self.space.to_unit(self.incumbent)]))[0])
        ei = expected_improvement(np.asarray(mu), np.asarray(std), best_mu)
        return fresh[int(np.argmax(ei))]

    def _fit(self) -> Any:
        """A GP on the relative estimates (each with its own noise), prior mean 0."""
        points = [(p, e) for p, e in self._estimates.items() if isinstance(p, TunableParams)]
        if len(points) < 2:
            return None
        from sklearn.gaussian_process import GaussianProcessRegressor
        from sklearn.gaussian_process.kernels import ConstantKernel, Matern

        x = np.asarray([self.space.to_unit(p) for p, _ in points])
        y = np.asarray([e.log_ratio for _, e in points])
        noise = np.asarray([max(e.std_error, 0.02) ** 2 for _, e in points])
        dims = x.shape[1]
        kernel = ConstantKernel(0.02, (1e-4, 1.0)) * Matern(
            length_scale=np.full(dims, 0.3), length_scale_bounds=(0.05, 3.0), nu=2.5
        )
        model = GaussianProcessRegressor(
            kernel=kernel, alpha=noise, normalize_y=False, random_state=self.seed
        )
        with _blas_single_thread(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.fit(x, y)
        return model

    # --- what has been learned ------------------------------------------------------

    def _refresh_estimates(self) -> None:
        self._estimates = estimate_relative(self.comparisons, self.default, self.sigma)

    def _ranked_estimates(self) -> list[tuple[TunableParams, RelativeEstimate]]:
        items = [(p, e) for p, e in self._estimates.items() if isinstance(p, TunableParams)]
        return sorted(items, key=lambda pe: -pe[1].log_ratio)

    def estimate(self, params: TunableParams) -> RelativeEstimate | None:
        """The paired estimate of ``params``'s log ratio to the default, if measured."""
        key = self.space.canonical(params) if self.space.contains(params) else params
        return self._estimates.get(key)

    def observation(self, params: TunableParams) -> Observation:
        """Measured mean and count, and the paired ratio to the default, of ``params``."""
        key = self.space.canonical(params) if self.space.contains(params) else params
        scores = self._scores.get(key, [])
        mean = sum(scores) / len(scores) if scores else 0.0
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

    @property
    def observations(self) -> list[Observation]:
        """Every configuration measured in this run, in first-measured order."""
        return [self.observation(p) for p in self._order]

    @property
    def converged(self) -> bool:
        """True once ``max_samples`` windows have been told in this run, or earlier when
        the confirmation phase found no finalist left to race against the default."""
        return self.samples_told >= self.max_samples or self._ended_early

    def _winner(self) -> TunableParams | None:
        """The eligible configuration with the highest lower bound (None: keep the default).

        Before the confirmation phase: compared with the default directly at least
        ``MIN_PROMOTE`` times, bound from every comparison. From then on: a finalist,
        bound from its fresh comparisons with the default alone, so that a candidate that
        looked good among many tried is not recommended on the looks that selected it.
        """
        best, bound = None, 0.0
        if self._confirming:  # only the finalists' fresh comparisons count
            for finalist in self._finalists:
                if len(self._confirmed.get(finalist, ())) < MIN_PROMOTE:
                    continue
                mean, se = self._fresh(finalist)
                if mean - Z_RECOMMEND * se > bound:
                    best, bound = finalist, mean - Z_RECOMMEND * se
            return best
        for params, est in self._estimates.items():
            if params == self.default or est.against_default < MIN_PROMOTE:
                continue
            lower = est.lower_bound(Z_RECOMMEND)
            if lower > bound:
                best, bound = params, lower
        return best  # type: ignore[return-value]

    @property
    def kept_default(self) -> bool:
        """True while no configuration has beaten the default in paired measurements."""
        return self._winner() is None

    @property
    def best(self) -> Observation | None:
        """The recommendation: the winner (see the module doc), else the default.

        None before anything was told in this run.
        """
        if not self._scores:
            return None
        winner = self._winner()
        return self.observation(self.default if winner is None else winner)

    def verdict(self) -> str:
        """One line on the recommendation, for people: how much it beat the default by."""
        best = self.best
        if best is None:
            return "nothing measured yet"
        if self.kept_default:
            return (
                "no configuration beat the default in paired measurements "
                f"({len(self.comparisons)} comparisons): keeping the default"
            )
        return (
            f"{best.ratio_to_default:.3f}x the default's throughput in paired measurements "
            f"(at least {best.ratio_lower_bound:.3f}x at {Z_RECOMMEND:g} standard error)"
        )

    def ranked(self) -> list[Observation]:
        """Configurations measured in this run, best paired estimate first."""
        order = [p for p, _ in self._ranked_estimates() if p in self._scores]
        rest = [p for p in self._order if p not in order]
        return [self.observation(p) for p in order + rest]


_ZERO = RelativeEstimate(0.0, 0.0, 0, 0)
