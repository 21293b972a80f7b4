"""Steps, as the timeline shows them: step n is the n-th op of each tensor.

Op records carry no training-step number, but a training loop reduces each gradient once
per step, so the n-th negotiation of a tensor belongs to step n (``occurrence``). On each
rank, step n starts when the first tensor begins its (n+1)-th negotiation, which keeps
the boundaries ordered even when a tensor (a broadcast at start-up, a per-epoch metric)
is reduced less often.

Where the trace marks its steps itself (torch.profiler's ``ProfilerStep#N``, read into
``run.trace_steps``), those are the steps: the user counts them, and they begin with the
data loading and forward pass that precede the step's first collective.
"""

from __future__ import annotations

import numpy as np

from hvdprof.trace.model import PHASE_NEGOTIATE, PHASE_OP, Run


def step_starts(run: Run) -> dict[int, np.ndarray]:
    """Per rank, the start (us) of each step, ascending (index = step number)."""
    s = run.slices
    out: dict[int, np.ndarray] = {}
    sel = ((s.phase == PHASE_NEGOTIATE) | (s.phase == PHASE_OP)) & (s.occurrence >= 0)
    for rank in run.ranks:
        marked = run.trace_steps.get(rank)
        if marked is not None and np.isfinite(marked.start_us).any():
            starts = np.where(np.isfinite(marked.start_us), marked.start_us, np.inf)
            starts = np.minimum.accumulate(starts[::-1])[::-1]
            out[rank] = starts[np.isfinite(starts)]
            continue
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


#: Steps needed before the first one (warm-up: start-up broadcasts, first allocations) is
#: left out of a run's typical step time.
MIN_STEPS_TO_SKIP_WARMUP = 5


def warmup_steps(count: int) -> int:
    """How many leading steps of ``count`` are warm-up and left out (0 or 1): the one rule
    every step-time figure follows, so that a gate's load window, a summary's series and
    the typical step all cover the same steps."""
    return 1 if count >= MIN_STEPS_TO_SKIP_WARMUP else 0


def typical_step_ms(run: Run, first: int | None = None) -> float:
    """The run's step time (ms): the median over ranks and steps of the time from one
    step's start to the next's, from step ``first`` on (default: the warm-up step left out
    when the run has :data:`MIN_STEPS_TO_SKIP_WARMUP` steps). One number for one fact:
    ``analyze``, ``diff`` and the page all quote this. 0 with fewer than two steps."""
    spans: list[np.ndarray] = []
    for starts in step_starts(run).values():
        lo = warmup_steps(len(starts)) if first is None else first
        d = np.diff(starts[lo:])
        spans.append(d[np.isfinite(d)])
    values = np.concatenate(spans) if spans else np.zeros(0)
    return float(np.median(values)) / 1000.0 if len(values) else 0.0


def one_time_tensors(run: Run) -> np.ndarray:
    """Indices into ``run.tensors`` of the tensors reduced only once in a run of several
    steps (start-up parameter broadcasts): not per-step work, so per-step tables and
    advice leave them out."""
    s = run.slices
    if not len(s) or count_steps(run) < 2:
        return np.zeros(0, dtype=np.int64)
    sel = s.tensor >= 0
    most = np.full(len(run.tensors), -1, dtype=np.int64)
    np.maximum.at(most, s.tensor[sel].astype(np.int64), s.occurrence[sel].astype(np.int64))
    return np.flatnonzero(most == 0)
