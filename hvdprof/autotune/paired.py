"""Paired comparisons: what interleaved windows say about configurations, relative to the default.

Absolute throughput samples taken at different moments are not comparable on a shared
machine: its speed drifts by more than good configurations differ. So the tuner measures a
candidate in windows that alternate with the incumbent's (``A B A B A``) and scores each
candidate window against the mean of the two incumbent windows around it, in log space:
``log(B) - (log(A_before) + log(A_after)) / 2``. A drift that is linear over the three
windows cancels exactly, and slower drift nearly so.

Each such score is one ``Comparison``: an estimate of ``f(candidate) - f(incumbent)``,
where ``f(x) = log(throughput(x) / throughput(default))``. Comparisons form a graph rooted
at the default (the first incumbent), and ``estimate_relative`` solves it by least squares
with ``f(default) = 0``: every measured configuration gets an estimate of its log ratio to
the default with a standard error, however many incumbents the chain went through.

The noise level comes from the incumbent's own windows: an incumbent window differs from
the mean of the incumbent windows on either side (one candidate window away) only by
noise, linear drift cancelling, so that difference estimates one window's variance, blended with a prior of a few
pseudo-observations so that three windows cannot claim the machine is quiet. Consecutive
comparisons share an incumbent window, so they are not independent: the mean of ``n`` of
them has a variance of about ``2 / n`` window variances, not ``1.5 / n``. The comparison
noise used for standard errors is therefore ``sqrt(2)`` window noises.

Pure functions and frozen records; the tuner decides what to measure next.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

#: pseudo-observations behind the prior noise level when pooling the residuals' variance
PRIOR_WEIGHT = 2.0


@dataclass(frozen=True, slots=True)
class Comparison:
    """``log_ratio`` estimates ``f(candidate) - f(incumbent)`` from one interleaved window.

    ``noise``: its noise relative to the round's first windows (windows that grew to four
    times the steps have about half the noise: 0.5), so that comparisons from windows of
    different lengths are weighted as they deserve.
    """

    candidate: Hashable
    incumbent: Hashable
    log_ratio: float
    noise: float = 1.0


@dataclass(frozen=True, slots=True)
class RelativeEstimate:
    """A configuration's log throughput ratio to the default, with its standard error."""

    log_ratio: float
    std_error: float
    comparisons: int  # comparisons it took part in
    against_default: int  # of those, directly against the default

    @property
    def ratio(self) -> float:
        """Throughput relative to the default (1.1 = 10% faster)."""
        return math.exp(self.log_ratio)

    def lower_bound(self, z: float) -> float:
        """``log_ratio - z * std_error``: pessimistic by ``z`` standard errors."""
        return self.log_ratio - z * self.std_error


def flanked_log_ratio(before: float, candidate: float, after: float) -> float:
    """``log(candidate)`` less the mean log of the incumbent windows on either side.

    >>> round(flanked_log_ratio(100.0, 110.0, 100.0), 4)
    0.0953
    >>> round(flanked_log_ratio(90.0, 100.0 * 1.1, 110.0), 2)  # drift 90 -> 110: still ~0.1
    0.1
    """
    floor = 1e-12  # a window that reduced nothing must not become -inf
    return math.log(max(candidate, floor)) - 0.5 * (
        math.log(max(before, floor)) + math.log(max(after, floor))
    )


def drift_free_difference(first: float, middle: float, last: float) -> float:
    """How far the middle of three incumbent log scores lies from the mean of its
    neighbours, scaled to the spread of a plain difference of two windows (``sqrt(2)``
    window noises) so that ``window_noise`` reads it as one. A plain difference of two
    windows also holds the drift between them (a job still warming up, a machine whose
    load changes), which would inflate the noise and make every comparison look weaker
    than it is; linear drift cancels here, as it does in a comparison.

    >>> round(drift_free_difference(1.0, 1.1, 1.2), 12)  # pure drift: no noise
    0.0
    """
    return (middle - 0.5 * (first + last)) * math.sqrt(4.0 / 3.0)


def window_noise(incumbent_steps: Sequence[float], prior_std: float) -> float:
    """Standard deviation of one window's log score, from differences of incumbent log
    scores (``drift_free_difference``: each with the spread of a plain difference of two
    windows), blended with ``prior_std``.

    >>> round(window_noise([], 0.2), 3)
    0.2
    >>> round(window_noise([0.1, -0.1] * 50, 0.2), 3)  # differences of 0.1: noise ~0.07
    0.075
    """
    sum_sq = sum(d * d for d in incumbent_steps) / 2
    var = (PRIOR_WEIGHT * prior_std**2 + sum_sq) / (PRIOR_WEIGHT + len(incumbent_steps))
    return math.sqrt(var)


def comparison_noise(window_std: float) -> float:
    """Noise of one comparison for standard errors: ``sqrt(2)`` windows (see module doc)."""
    return window_std * math.sqrt(2.0)


def estimate_relative(
    comparisons: Sequence[Comparison],
    reference: Hashable,
    comparison_std: float,
    noise_unit: float = 1.0,
) -> dict[Hashable, RelativeEstimate]:
    """Least-squares ``f`` for every configuration in ``comparisons`` with ``f(reference) = 0``.

    Returns the estimates (the reference included, at 0 with no error), standard errors
    for a comparison noise of ``comparison_std`` at the comparisons whose ``noise`` is
    ``noise_unit`` (the current windows); the others are weighted by their relative noise
    (weighted least squares). A configuration not connected to the reference through the
    comparisons gets no estimate.
    """
    nodes: list[Hashable] = []
    index: dict[Hashable, int] = {}
    for c in comparisons:
        for node in (c.candidate, c.incumbent):
            if node != reference and node not in index:
                index[node] = len(nodes)
                nodes.append(node)
    counts = {node: 0 for node in nodes}
    direct = {node: 0 for node in nodes}
    for c in comparisons:
        for node, other in ((c.candidate, c.incumbent), (c.incumbent, c.candidate)):
            if node in counts:
                counts[node] += 1
                direct[node] += other == reference
    estimates: dict[Hashable, RelativeEstimate] = {
        reference: RelativeEstimate(0.0, 0.0, len(comparisons), 0)
    }
    if not nodes:
        return estimates
    design = np.zeros((len(comparisons), len(nodes)))
    y = np.zeros(len(comparisons))
    for row, c in enumerate(comparisons):
        weight = noise_unit / c.noise if c.noise > 0 else 1.0
        if c.candidate in index:
            design[row, index[c.candidate]] += weight
        if c.incumbent in index:
            design[row, index[c.incumbent]] -= weight
        y[row] = c.log_ratio * weight
    solution = np.linalg.lstsq(design, y, rcond=None)[0]
    sigma = comparison_std
    gram = design.T @ design
    connected = _connected_to_reference(comparisons, reference)
    keep = [i for i, node in enumerate(nodes) if node in connected]
    if keep:
        sub = gram[np.ix_(keep, keep)]
        cov_diag = np.diag(np.linalg.pinv(sub)) * sigma**2
        for j, i in enumerate(keep):
            node = nodes[i]
            estimates[node] = RelativeEstimate(
                float(solution[i]),
                float(math.sqrt(max(cov_diag[j], 0.0))),
                counts[node],
                direct[node],
            )
    return estimates


def _connected_to_reference(comparisons: Sequence[Comparison], reference: Hashable) -> set:
    """Nodes reachable from ``reference`` through comparisons (the others float freely)."""
    neighbours: dict[Hashable, set] = {}
    for c in comparisons:
        neighbours.setdefault(c.candidate, set()).add(c.incumbent)
        neighbours.setdefault(c.incumbent, set()).add(c.candidate)
    seen = {reference}
    frontier = [reference]
    while frontier:
        node = frontier.pop()
        for other in neighbours.get(node, ()):
            if other not in seen:
                seen.add(other)
                frontier.append(other)
    return seen
