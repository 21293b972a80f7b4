"""Adasum: Horovod's adaptive summation of gradients (``op=hvd.Adasum``).

Two gradients ``a`` and ``b`` combine as

    (1 - a.b / (2 |a|^2)) a  +  (1 - a.b / (2 |b|^2)) b

(a coefficient stays 1 when its vector's squared norm is below 1e-8): orthogonal
gradients add, parallel ones average. Horovod applies it per tensor along the pairs of
its recursive halving (vector-halving, distance-doubling): ranks ``r`` and ``r ^ 1``
first, then the pairs of pairs, and so on, which is why the number of ranks must be a
power of two. Its dot products and norms are over whole tensors (partial sums added
across the ranks holding the slices), so the result is exactly this binary tree.

Here every rank gathers every rank's tensor through the backend's allgather and folds
the same tree locally, in float64: the same pairs and the same formula, the same result
on every rank. It costs ``size`` times the tensor in memory and traffic, which is what
recursive halving saves; Adasum is for the gradients of one step, not a hot path here.
"""

from __future__ import annotations

import torch

from hvdprof.errors import HvdprofError

#: below this squared norm a vector's coefficient stays 1 (Horovod's threshold)
NORM_EPSILON = 1e-8


class AdasumUnsupportedError(HvdprofError, NotImplementedError):
    """Adasum cannot run here (ranks not a power of two). A ``NotImplementedError``, as
    Horovod raises for the same cases."""


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def combine_pair(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Adasum of two float64 vectors of the same shape (a new tensor)."""
    a_flat, b_flat = a.reshape(-1), b.reshape(-1)
    dot = float(torch.dot(a_flat, b_flat))
    a_sq = float(torch.dot(a_flat, a_flat))
    b_sq = float(torch.dot(b_flat, b_flat))
    a_coeff = 1.0 - dot / a_sq * 0.5 if a_sq >= NORM_EPSILON else 1.0
    b_coeff = 1.0 - dot / b_sq * 0.5 if b_sq >= NORM_EPSILON else 1.0
    return a * a_coeff + b * b_coeff


def combine_tree(contributions: list[torch.Tensor]) -> torch.Tensor:
    """Rank-ordered float64 tensors folded pairwise, level by level, as recursive
    halving pairs them: (0,1), (2,3), ... then ((0,1),(2,3)), ..."""
    level = list(contributions)
    if not is_power_of_two(len(level)):
        raise AdasumUnsupportedError(
            f"Adasum needs a power-of-two number of ranks, got {len(level)}"
        )
    while len(level) > 1:
        level = [combine_pair(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return level[0]
