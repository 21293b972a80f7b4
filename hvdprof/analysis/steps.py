"""Steps, as the timeline shows them: step n is the n-th op of each tensor.

Op records carry no training-step number, but a training loop reduces each gradient once
per step, so the n-th negotiation of a tensor belongs to step n (``occurrence``). On each
rank, step n starts when the first tensor begins its (n+1)-th negotiation, which keeps
the boundaries ordered even when a tensor (a broadcast at start-up, a per-epoch metric)
is reduced less often.
"""

from __future__ import annotations

import numpy as np

from hvdprof.analysis.model import PHASE_NEGOTIATE, PHASE_OP, Run


def step_starts(run: Run) -> dict[int, np.ndarray]:
    """Per rank, the start (us) of each step, ascending (index = step number)."""
    s = run.slices
    out: dict[int, np.ndarray] = {}
    sel = ((s.phase == PHASE_NEGOTIATE) | (s.phase == PHASE_OP)) & (s.occurrence >= 0)
    for rank in run.ranks:
        mask = sel & (s.rank == rank)
        if not mask.any():
            continue
        occ = s.occurrence[mask]
        starts = np.full(int(occ.max()) + 1, np.inf)
        np.minimum.at(starts, occ, s.start_us[mask])
        starts = np.minimum.accumulate(starts[::-1])[::-1]  # keep them ordered
        out[rank] = starts[np.isfinite(starts)]
    return out


def step_of(starts: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Step number of each instant ``t`` (-1 before the first step)."""
    return np.searchsorted(starts, t, side="right") - 1


def count_steps(run: Run) -> int:
    """Steps in the run: the most operations any tensor had on any rank."""
    s = run.slices
    if not len(s):
        return 0
    return int(s.occurrence.max()) + 1
