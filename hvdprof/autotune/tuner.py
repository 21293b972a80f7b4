"""Bayesian optimization of the runtime's knobs: a plain ask/tell object, no runtime inside.

``BayesianTuner`` wraps scikit-optimize's ``Optimizer`` (a Gaussian-process surrogate
with expected improvement) over a ``SearchSpace``. Tests drive it with a synthetic
objective; the controller drives it with measured throughput.

Why the objective is ``-log(score / reference)`` and not raw bytes per second:

* skopt minimises, hence the sign.
* Throughput differences are multiplicative (a setting is "20% faster"), and so is the
  measurement noise on a shared machine. In log space both become additive and roughly
  uniform across the space, which is what a stationary GP with one noise level assumes.
* The noise level (HVDPROF_AUTOTUNE_GAUSSIAN_PROCESS_NOISE) is the relative spread of one
  sample's score, e.g. 0.3 for "a configuration measures within about +-30%". It becomes
  a fixed white-noise standard deviation of ``log1p(noise)`` in log-throughput units, and
  is rescaled whenever the GP standardises its targets, so it keeps that meaning whether
  the job reduces 1 MB/s or 10 GB/s and however spread out the scores are. (Horovod adds
  its noise to raw bytes/us, where 0.8 means nothing in particular.) ``reference`` (the
  first score seen) only keeps the numbers readable: the GP is blind to a constant shift.

Noise handling (on a shared machine one configuration's score varies by 10-30%, and a
lucky sample of a mediocre configuration is the usual way a tuner goes wrong):

* ``best`` is not the single highest measurement but the measured configuration with the
  highest GP posterior mean, which pools nearby and repeated measurements. Without a
  model yet (fewer points than the initial design) it falls back to the best mean score.
* Proposals maximise expected improvement over that same posterior-mean incumbent
  ("plug-in" EI), not over the luckiest observation as skopt's own EI does: a lucky
  sample then cannot raise the bar so high that only the unexplored edges of the box
  look promising.
* The last ``remeasure_samples(max_samples)`` samples of a round measure nothing new:
  they re-measure the top ``REMEASURE_TOP`` configurations by posterior mean, the least
  measured first. The final recommendation is the best by posterior mean among the
  configurations measured at least twice, so a configuration that was lucky once has
  to be good twice to be recommended.

Warm start: points from an earlier log are told before anything else, so the model starts
informed and the random initial design is skipped for as many points as were told. The
earlier run's recommendation (the warm point with the best posterior mean) is proposed
first. Warm points inform the model but never become ``best``: only configurations
measured in this run can be recommended, since the machine or the job may have changed.
On the synthetic benchmark in the unit tests this cuts the samples needed to reach 95% of
the optimum from 12-16+ to 2 (the default, then the previous recommendation).
"""

from __future__ import annotations

import contextlib
import functools
import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hvdprof.autotune.space import SearchSpace
from hvdprof.runtime.records import TunableParams

# skopt notes when it re-proposes a measured point (expected with noisy scores) and when
# rounding makes a predicted variance negative; neither is the user's concern.
warnings.filterwarnings("ignore", message="The objective has been evaluated", module="skopt")
warnings.filterwarnings("ignore", message="Predicted variances smaller than 0", module="skopt")

#: space-filling points (a Latin hypercube) measured before the GP's proposals, after the
#: configuration the job started with: 5 strata of 3.2 octaves each on the threshold axis
DEFAULT_INITIAL_POINTS = 5
#: candidates sampled per acquisition step; enough for 3 axes, cheap enough for a thread
_ACQ_SAMPLES = 2000
#: minimum expected improvement worth a sample, in log-throughput units (1%)
_EI_XI = 0.01
#: configurations (by posterior mean) that the final samples of a round re-measure
REMEASURE_TOP = 3


def remeasure_samples(max_samples: int) -> int:
    """Samples at the end of a round spent re-measuring the leaders: a third of what is left
    after 8 samples of exploration, at most 6 (a short round only explores).

    >>> remeasure_samples(10), remeasure_samples(16), remeasure_samples(24), remeasure_samples(30)
    (0, 2, 5, 6)
    """
    return max(0, min(6, (max_samples - 8) // 3))


def expected_improvement(mu: np.ndarray, std: np.ndarray, incumbent: float) -> np.ndarray:
    """EI of minimising: how much below ``incumbent`` (less ``_EI_XI``) a point is expected
    to land, given its posterior mean ``mu`` and standard deviation ``std``."""
    from scipy.stats import norm

    improvement = incumbent - mu - _EI_XI
    safe_std = np.maximum(std, 1e-9)
    z = improvement / safe_std
    ei = improvement * norm.cdf(z) + safe_std * norm.pdf(z)
    return np.where(std > 1e-9, ei, np.maximum(improvement, 0.0))


@dataclass(frozen=True, slots=True)
class Observation:
    """What the tuner knows about one configuration measured in this run."""

    params: TunableParams
    mean_score: float  # mean of the measured bytes/s
    count: int  # how many samples measured it


@functools.cache
def _threadpools() -> Any:
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def _blas_single_thread() -> contextlib.AbstractContextManager[Any]:
    """Run GP linear algebra on one BLAS thread.

    The matrices are tens of rows, so BLAS threads cost more than they save (3x the CPU
    time in the unit tests), and the training job on the same cores needs them. Scoped
    per call because OpenBLAS's thread count is process-wide.
    """
    try:
        return _threadpools().limit(limits=1, user_api="blas")
    except Exception:  # no threadpoolctl, or a BLAS it cannot drive: run as is
        return contextlib.nullcontext()


def log_noise_std(relative_noise: float) -> float:
    """Standard deviation of ``log(score)`` for a score that varies by ``relative_noise``."""
    return math.log1p(max(relative_noise, 0.0))


def _make_gp(dims: list[Any], relative_noise: float, seed: int, restarts: int) -> Any:
    """skopt's default GP (constant x Matern 5/2 on the normalised axes), with a white-noise
    level that stays fixed in log-throughput units however the targets are standardised."""
    from skopt.learning import GaussianProcessRegressor
    from skopt.learning.gaussian_process.kernels import ConstantKernel, Matern
    from skopt.space import Space
    from skopt.utils import normalize_dimensions

    class LogNoiseGP(GaussianProcessRegressor):
        def __init__(
            self,
            kernel: Any = None,
            alpha: float = 1e-10,
            optimizer: Any = "fmin_l_bfgs_b",
            n_restarts_optimizer: int = 0,
            normalize_y: bool = True,
            copy_X_train: bool = True,
            random_state: Any = None,
            noise: Any = None,
            noise_std: float = 0.1,
        ) -> None:
            super().__init__(
                kernel=kernel,
                alpha=alpha,
                optimizer=optimizer,
                n_restarts_optimizer=n_restarts_optimizer,
                normalize_y=normalize_y,
                copy_X_train=copy_X_train,
                random_state=random_state,
                noise=noise,
            )
            self.noise_std = noise_std

        def fit(self, X: Any, y: Any) -> Any:
            # normalize_y divides the targets by their spread; scale the noise the same way
            spread = float(np.var(y))
            self.noise = max(self.noise_std**2 / spread, 1e-8) if spread > 0 else 1.0
            return super().fit(X, y)

    n_dims = Space(normalize_dimensions(dims)).transformed_n_dims
    kernel = ConstantKernel(1.0, (0.01, 1000.0)) * Matern(
        length_scale=np.ones(n_dims), length_scale_bounds=[(0.01, 100.0)] * n_dims, nu=2.5
    )
    return LogNoiseGP(
        kernel=kernel,
        normalize_y=True,
        n_restarts_optimizer=restarts,
        random_state=np.random.RandomState(seed),
        noise_std=max(log_noise_std(relative_noise), 1e-4),
    )


class BayesianTuner:
    """Propose configurations (``ask``), learn from their scores (``tell``).

    ``max_samples`` counts samples told in this run (warm-start points do not count);
    after that many, ``converged`` is True and ``best`` is the recommendation.
    ``initial_points`` are proposed first, in order, before the optimizer's own design
    (the controller uses it to re-measure good configurations after drift).
    ``gp_restarts`` is extra random restarts of the GP's hyperparameter fit; 0 was as good
    as 2 on the synthetic benchmarks and is 3x cheaper on the worker thread.
    """

    def __init__(
        self,
        space: SearchSpace,
        max_samples: int,
        noise: float = 0.8,
        seed: int = 0,
        warm_start: Iterable[tuple[TunableParams, float]] = (),
        initial_points: Sequence[TunableParams] = (),
        n_initial_points: int = DEFAULT_INITIAL_POINTS,
        gp_restarts: int = 0,
    ) -> None:
        from skopt import Optimizer

        if space.is_empty:
            raise ValueError("every tunable knob is fixed: nothing to search")
        if max_samples < 1:
            raise ValueError("max_samples must be >= 1")
        self.space = space
        self.max_samples = max_samples
        self.noise = float(noise)
        self.seed = seed
        dims = space.dimensions()
        estimator = _make_gp(dims, relative_noise=self.noise, seed=seed, restarts=gp_restarts)
        # The Latin hypercube is ours, queued like any other proposal, rather than skopt's
        # initial points: skopt counts every told point against its design and skips the
        # design's first points for them, so the job's own configuration, measured first,
        # used to displace a stratum -- on the autotune benchmark always the one holding
        # the best thresholds (350 KiB-3 MiB), which no run then ever visited.
        self._opt = Optimizer(
            dims,
            base_estimator=estimator,
            n_initial_points=1,
            initial_point_generator="random",
            acq_func="EI",
            acq_optimizer="sampling",
            acq_optimizer_kwargs={"n_points": _ACQ_SAMPLES},
            random_state=seed,
            model_queue_size=1,
        )
        self._rng = np.random.RandomState(seed + 7919)
        self.remeasure = remeasure_samples(max_samples)
        self._reference: float | None = None
        self._scores: dict[TunableParams, list[float]] = {}
        self._order: list[TunableParams] = []  # first-measured order, for stable tie-breaks
        self._pending = [space.canonical(p) for p in initial_points if space.contains(p)]
        self.samples_told = 0
        self.warm_points = 0
        self.warm_best: TunableParams | None = None
        self._tell_warm(warm_start)
        # the design, less as many points as an earlier run already measured
        design = self._latin_hypercube(n_initial_points)[self.warm_points :]
        self._pending.extend(p for p in design if p not in self._pending)

    def _latin_hypercube(self, n: int) -> list[TunableParams]:
        """``n`` configurations, one per stratum of every axis (maximin over 1000 tries)."""
        if n <= 0:
            return []
        from skopt.sampler import Lhs

        points = Lhs(criterion="maximin", iterations=1000).generate(
            self._opt.space.dimensions, n, random_state=self.seed
        )
        return list(dict.fromkeys(self.space.from_point(p) for p in points))

    # --- the objective ---------------------------------------------------------------

    def _objective(self, score: float) -> float:
        if self._reference is None:
            self._reference = score if score > 0 else 1.0
        # floor: a window that reduced nothing must not become -inf
        return -math.log(max(score, self._reference * 1e-6) / self._reference)

    def _tell_warm(self, points: Iterable[tuple[TunableParams, float]]) -> None:
        """Tell earlier measurements, then queue the earlier run's recommendation to be
        re-measured first: it is the likeliest good configuration, and only a measurement
        in this run can make it ``best``."""
        kept: list[tuple[TunableParams, float]] = []
        for params, score in points:
            if self.space.contains(params) and math.isfinite(score):
                kept.append((self.space.canonical(params), float(score)))
        self.warm_points = len(kept)
        if not kept:
            return
        with _blas_single_thread():
            self._opt.tell(
                [self.space.to_point(p) for p, _ in kept],
                [self._objective(s) for _, s in kept],
            )
        candidates = list(dict.fromkeys(p for p, _ in kept))
        predicted = self.predicted_objective(candidates)
        if predicted is not None:
            incumbent = candidates[int(np.argmin(predicted))]
        else:
            incumbent = max(kept, key=lambda ps: ps[1])[0]
        self.warm_best = incumbent
        self._pending.insert(0, incumbent)

    # --- ask / tell ------------------------------------------------------------------

    def ask(self) -> TunableParams:
        """The next configuration to measure (the same one again until something is told)."""
        while self._pending:
            candidate = self._pending[0]
            if candidate not in self._scores:
                return candidate
            self._pending.pop(0)
        if self.remeasuring:
            leader = self._least_measured_leader()
            if leader is not None:
                return leader
        with _blas_single_thread():
            if self._opt.models and self._opt._n_initial_points <= 0:
                return self._ask_plugin_ei()
            point = self._opt.ask()
        return self.space.from_point(point)

    @property
    def remeasuring(self) -> bool:
        """True in the last ``remeasure`` samples of the round: no new configurations."""
        return self.samples_told >= self.max_samples - self.remeasure and len(self._order) > 1

    def _least_measured_leader(self) -> TunableParams | None:
        """Among the top ``REMEASURE_TOP`` by posterior mean, the one measured least often
        (the better one on a tie); None without a model."""
        if self.predicted_objective(self._order) is None:
            return None
        leaders = self.ranked()[:REMEASURE_TOP]
        return min(leaders, key=lambda o: o.count).params

    def _ask_plugin_ei(self) -> TunableParams:
        """Maximise EI over random candidates, against the posterior-mean incumbent."""
        model = self._opt.models[-1]
        space = self._opt.space
        candidates = space.rvs(n_samples=_ACQ_SAMPLES, random_state=self._rng)
        mu, std = model.predict(space.transform(candidates), return_std=True)
        observed = model.predict(space.transform([self.space.to_point(p) for p in self._order]))
        ei = expected_improvement(np.asarray(mu), np.asarray(std), float(np.min(observed)))
        return self.space.from_point(candidates[int(np.argmax(ei))])

    def tell(self, params: TunableParams, score: float) -> Observation:
        """Record that ``params`` achieved ``score`` bytes/s; returns what is now known of it.

        ``params`` need not be the last proposal (the controller's first sample is the
        configuration the job started with), but it must lie in the space.
        """
        if not self.space.contains(params):
            raise ValueError(f"{params} is outside the search space {self.space}")
        if not math.isfinite(score):
            raise ValueError(f"score must be finite, got {score}")
        key = self.space.canonical(params)
        if self._pending and self._pending[0] == key:
            self._pending.pop(0)
        y = self._objective(float(score))
        with _blas_single_thread():
            self._opt.tell(self.space.to_point(params), y)
        if key not in self._scores:
            self._scores[key] = []
            self._order.append(key)
        self._scores[key].append(float(score))
        self.samples_told += 1
        return self.observation(key)

    # --- what has been learned -------------------------------------------------------

    def observation(self, params: TunableParams) -> Observation:
        """Measured mean and count for a configuration measured in this run."""
        scores = self._scores[self.space.canonical(params)]
        return Observation(params, sum(scores) / len(scores), len(scores))

    @property
    def observations(self) -> list[Observation]:
        """Every configuration measured in this run, in first-measured order."""
        return [self.observation(p) for p in self._order]

    @property
    def converged(self) -> bool:
        """True once ``max_samples`` samples have been told in this run."""
        return self.samples_told >= self.max_samples

    @property
    def best(self) -> Observation | None:
        """The recommended configuration: highest GP posterior mean among those measured
        (once the round re-measures its leaders: among those measured at least twice).

        None before anything was told in this run.
        """
        ranked = self.ranked()
        if not ranked:
            return None
        if self.remeasuring or self.converged:
            repeated = [o for o in ranked if o.count >= 2]
            if repeated:
                return repeated[0]
        return ranked[0]

    def predicted_objective(self, params: Sequence[TunableParams]) -> np.ndarray | None:
        """The GP's posterior mean of ``-log(score/reference)`` (lower is better), or None
        while no model has been fitted."""
        if not self._opt.models:
            return None
        if not params:
            return np.zeros(0)
        model = self._opt.models[-1]
        points = self._opt.space.transform([self.space.to_point(p) for p in params])
        with _blas_single_thread():
            return np.asarray(model.predict(points), dtype=float)

    def ranked(self) -> list[Observation]:
        """Configurations measured in this run, best first (same criterion as ``best``)."""
        observations = self.observations
        predicted = self.predicted_objective(self._order)
        if predicted is None:
            return sorted(observations, key=lambda o: -o.mean_score)
        order = np.argsort(predicted, kind="stable")
        return [observations[int(i)] for i in order]
