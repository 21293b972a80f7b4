"""Detecting that the tuned configuration's throughput has moved (continuous mode).

After tuning, the controller keeps measuring the chosen configuration. A workload that
changes (a new phase of training, a different batch size, a neighbour job taking the
network) changes which configuration is best, and the symptom is that the same
configuration's throughput moves away from where it was.

The baseline is the median of the first few watch samples, not the score measured while
tuning: the tuner picked the configuration partly *because* it measured high, so that
score is biased upwards and would make every later sample look like a drop.

Drift is declared after ``samples`` consecutive samples outside ``baseline * (1 +- fraction)``
on the same side. Requiring a streak on one side keeps ordinary noise (which lands on
either side at random) from re-opening tuning; requiring it to be consecutive means one
calm sample resets the count.
"""

from __future__ import annotations

import statistics

#: watch samples whose median becomes the baseline
DEFAULT_BASELINE_SAMPLES = 3


class DriftDetector:
    """Feed it one score per watch sample; it says when throughput has drifted."""

    def __init__(
        self, fraction: float, samples: int, baseline_samples: int = DEFAULT_BASELINE_SAMPLES
    ) -> None:
        if fraction <= 0:
            raise ValueError("fraction must be > 0")
        if samples < 1 or baseline_samples < 1:
            raise ValueError("samples and baseline_samples must be >= 1")
        self.fraction = fraction
        self.samples = samples
        self.baseline_samples = baseline_samples
        self._warmup: list[float] = []
        self.baseline: float | None = None
        self.streak = 0
        self._direction = 0  # +1 above the band, -1 below, 0 inside
        self.drifted: list[float] = []  # the scores of the current streak

    def deviation(self, score: float) -> int:
        """+1 above the band, -1 below it, 0 inside (or while there is no baseline)."""
        if self.baseline is None or self.baseline <= 0:
            return 0
        ratio = score / self.baseline
        if ratio > 1 + self.fraction:
            return 1
        if ratio < 1 - self.fraction:
            return -1
        return 0

    def update(self, score: float) -> bool:
        """Account for one watch sample; True when drift is confirmed by this one."""
        if self.baseline is None:
            self._warmup.append(score)
            if len(self._warmup) >= self.baseline_samples:
                self.baseline = float(statistics.median(self._warmup))
            return False
        direction = self.deviation(score)
        if direction == 0:
            self.streak, self._direction, self.drifted = 0, 0, []
            return False
        if direction != self._direction:
            self.streak, self._direction, self.drifted = 0, direction, []
        self.streak += 1
        self.drifted.append(score)
        return self.streak >= self.samples

    def reset(self) -> None:
        """Forget the baseline and the streak (after tuning re-opens and converges again)."""
        self._warmup = []
        self.baseline = None
        self.streak, self._direction, self.drifted = 0, 0, []
