"""The autotuner's view of the search space, rebuilt from the samples a timeline recorded.

The live tuner fits a Gaussian process to its measurements and proposes where expected
improvement is highest; the timeline keeps every scored sample (``AUTOTUNE_SAMPLE``) but
not the tuner's model. This fits the same kind of model (a Matern-5/2 GP on the log of
fusion threshold and cycle time, scaled to the tuner's unit box, on the log of the score)
to those samples and evaluates it on a grid, so a person can see which region the samples
favoured. It is a picture of the evidence, not the tuner's exact internal state (which
also pooled paired comparisons and the cache axis).

It is drawn over the range the samples searched (a model says nothing where nothing was
measured), and called ``flat`` when its whole predicted range is within the noise of one
window (the tuner's recorded comparison noise, else the model's own noise term): a
colour scale stretched over differences the measurements cannot tell apart would show
structure that is not there.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import msgspec
import numpy as np

from hvdprof.analysis.registry import Analysis
from hvdprof.analysis.result import Result
from hvdprof.autotune.space import (
    CYCLE_TIME_MAX_MS,
    CYCLE_TIME_MIN_MS,
    FUSION_THRESHOLD_MAX_BYTES,
    FUSION_THRESHOLD_MIN_BYTES,
)
from hvdprof.trace.model import Run

#: Fewest distinct samples a surface is fitted to (fewer says nothing about a 2-D space).
MIN_SAMPLES = 3
#: The grid reaches this factor beyond the lowest and highest value sampled on each axis
#: (a single sampled value: that factor either side).
RANGE_PAD = 1.15
SINGLE_VALUE_PAD = 1.5
#: A surface is flat when log(highest / lowest prediction) is below this many window
#: noise standard deviations (two: about what two windows of one configuration differ by).
FLAT_NOISE_MULTIPLE = 2.0


class SurrogateSurface(Result):
    """Predicted score (MB/s) over fusion threshold (``x``, bytes) x cycle time (``y``, ms)."""

    x: list[float] = msgspec.field(default_factory=list)
    y: list[float] = msgspec.field(default_factory=list)
    z: list[list[float]] = msgspec.field(default_factory=list)  # z[i][j]: y[i], x[j]
    samples: list[dict[str, Any]] = msgspec.field(default_factory=list)
    best: dict[str, float] | None = None  # grid point of the highest prediction
    reason: str | None = None  # why there is no surface
    #: the predicted range (log of highest / lowest) against one window's noise (log
    #: units), and whether the range is within it: then nothing here is a real difference
    range_log: float | None = None
    noise_log: float | None = None
    flat: bool = False


def _searched(values: np.ndarray, lo: float, hi: float, grid: int) -> np.ndarray:
    """``grid`` log-spaced points over the sampled range of one axis, a little beyond it,
    inside the tuner's bounds."""
    a, b = float(values.min()), float(values.max())
    pad = SINGLE_VALUE_PAD if a == b else RANGE_PAD
    return np.geomspace(max(a / pad, lo), min(b * pad, hi), grid)


def _unit(threshold: np.ndarray, cycle: np.ndarray) -> np.ndarray:
    lo_t, hi_t = math.log(FUSION_THRESHOLD_MIN_BYTES), math.log(FUSION_THRESHOLD_MAX_BYTES)
    lo_c, hi_c = math.log(CYCLE_TIME_MIN_MS), math.log(CYCLE_TIME_MAX_MS)
    return np.stack(
        [(np.log(threshold) - lo_t) / (hi_t - lo_t), (np.log(cycle) - lo_c) / (hi_c - lo_c)],
        axis=-1,
    )


def autotune_surface(run: Run, grid: int = 40) -> SurrogateSurface:
    """A GP over (threshold, cycle time) fitted to the run's scored autotune samples."""
    rank = min((s.rank for s in run.autotune_samples), default=0)
    samples = [
        s for s in run.autotune_samples
        if s.rank == rank and s.score_bytes_per_s > 0 and s.fusion_threshold_bytes > 0
        and s.cycle_time_ms > 0
    ]  # fmt: skip
    out = SurrogateSurface(
        samples=[
            {"fusion_threshold_bytes": s.fusion_threshold_bytes, "cycle_time_ms": s.cycle_time_ms,
             "score_mb_per_s": s.score_bytes_per_s / 1e6, "cache_enabled": s.cache_enabled}
            for s in samples
        ]
    )  # fmt: skip
    distinct = {(s.fusion_threshold_bytes, s.cycle_time_ms) for s in samples}
    if len(distinct) < MIN_SAMPLES:
        out.reason = (
            f"{len(distinct)} distinct autotune configuration(s) recorded; "
            f"a surface needs at least {MIN_SAMPLES}"
        )
        return out
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel

    thr = np.asarray([s.fusion_threshold_bytes for s in samples], dtype=np.float64)
    cyc = np.asarray([s.cycle_time_ms for s in samples], dtype=np.float64)
    y = np.log(np.asarray([s.score_bytes_per_s for s in samples], dtype=np.float64) / 1e6)
    mean = float(y.mean())
    kernel = ConstantKernel(1.0, (1e-3, 1e2)) * Matern(
        length_scale=[0.3, 0.3], length_scale_bounds=(0.15, 3.0), nu=2.5
    ) + WhiteKernel(0.07, (1e-3, 0.1))
    model = GaussianProcessRegressor(kernel=kernel, normalize_y=False, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(_unit(thr, cyc), y - mean)
    xs = _searched(thr, FUSION_THRESHOLD_MIN_BYTES, FUSION_THRESHOLD_MAX_BYTES, grid)
    ys = _searched(cyc, CYCLE_TIME_MIN_MS, CYCLE_TIME_MAX_MS, grid)
    gx, gy = np.meshgrid(xs, ys)
    pred = np.exp(model.predict(_unit(gx.ravel(), gy.ravel())) + mean).reshape(gx.shape)
    i, j = np.unravel_index(int(np.argmax(pred)), pred.shape)
    out.x, out.y = xs.tolist(), ys.tolist()
    out.z = np.round(pred, 6).tolist()
    out.best = {"fusion_threshold_bytes": float(xs[j]), "cycle_time_ms": float(ys[i]),
                "score_mb_per_s": float(pred[i, j])}  # fmt: skip
    out.range_log = float(np.log(pred.max() / pred.min()))
    recorded = [s.comparison_noise for s in samples if s.comparison_noise]
    if recorded:  # the tuner's noise of one comparison (sqrt 2 windows): one window's
        out.noise_log = float(recorded[-1]) / math.sqrt(2.0)
    else:  # the model's own noise term (a variance of the log score)
        out.noise_log = math.sqrt(float(model.kernel_.k2.noise_level))
    out.flat = out.range_log < FLAT_NOISE_MULTIPLE * out.noise_log
    return out


# the API's alone (no verdict_order: not in analyze's report)
ANALYSIS = Analysis(
    "surrogate", autotune_surface, SurrogateSurface,
    "The autotuner's view over fusion threshold x cycle time",
)  # fmt: skip
