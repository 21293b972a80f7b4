"""Where a step goes in the user's own words: the ``record_function`` ranges of the trace.

A torch.profiler trace carries the names its author chose (``with record_function("forward")``,
torchrec's ``## backward ##``, DDP's own ``DistributedDataParallel.forward``,
``Optimizer.step#SGD.step``). A breakdown in those names answers "which part of *my* step
got slower" without translating from runtime phases. Per rank and step: the time in each
outermost range on the training thread (so nested ranges are not counted twice and the
ranges of a step add up to at most the step) and the rest of the step, outside every
range. The warm-up step is left out of the means, as in the step time.

The ranks are compared name by name: a range one rank spends much longer in than the
others' median (or that only some ranks have, such as an extra piece of work on one rank)
is where that rank's step differs, and the verdict names it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hvdprof.analysis.steps import MIN_STEPS_TO_SKIP_WARMUP
from hvdprof.trace.model import Run

#: The row for the part of a step outside every range.
OUTSIDE = "(outside any range)"
#: A range differs between ranks when one rank's mean exceeds the others' median by this
#: much per step (ms) ...
MIN_DIFFERENCE_MS = 0.5
#: ... and by this share of the rank's step.
MIN_DIFFERENCE_SHARE = 0.05


def display_name(name: str) -> str:
    """A range's name as people say it: torchrec-style ``## forward ##`` is "forward"."""
    bare = name.strip().strip("#").strip()
    return bare or name


@dataclass
class RankPhases:
    rank: int
    steps: int
    step_ms: list[float]  # each step's length (the trace's own step span)
    per_step_ms: dict[str, list[float]]  # range name (display) -> ms in each step

    def mean_ms(self, name: str) -> float:
        values = self.per_step_ms.get(name) or []
        if len(values) >= MIN_STEPS_TO_SKIP_WARMUP:
            values = values[1:]
        return float(np.mean(values)) if values else 0.0

    def mean_step_ms(self) -> float:
        values = self.step_ms[1:] if len(self.step_ms) >= MIN_STEPS_TO_SKIP_WARMUP else self.step_ms
        return float(np.mean(values)) if values else 0.0


@dataclass
class UserPhases:
    """Per rank, ms per step in each of the trace's own ranges; empty without ranges."""

    names: list[str] = field(default_factory=list)  # display names, in order of first use
    ranks: list[RankPhases] = field(default_factory=list)
    #: (rank, name, its mean ms per step, the other ranks' median) where a rank differs
    outlier: tuple[int, str, float, float] | None = None
    verdict: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "names": list(self.names),
            "outside": OUTSIDE,
            "ranks": [
                {
                    "rank": r.rank,
                    "steps": r.steps,
                    "mean_step_ms": r.mean_step_ms(),
                    "mean_ms": {n: r.mean_ms(n) for n in [*self.names, OUTSIDE]},
                    "per_step_ms": r.per_step_ms,
                }
                for r in self.ranks
            ],
            "outlier": (
                {
                    "rank": self.outlier[0],
                    "name": self.outlier[1],
                    "ms": self.outlier[2],
                    "others_ms": self.outlier[3],
                }
                if self.outlier
                else None
            ),
            "verdict": self.verdict,
        }


def user_phases(run: Run) -> UserPhases:
    """Each rank's steps cut into its outermost ``record_function`` ranges."""
    out = UserPhases()
    for rank in sorted(run.user_ranges):
        ranges = run.user_ranges[rank]
        steps = run.trace_steps.get(rank)
        if steps is None or not len(ranges.start_us):
            continue
        known = np.isfinite(steps.start_us)
        n = len(steps.start_us)
        spans = np.where(known, steps.end_us - steps.start_us, 0.0) / 1000.0
        inside = ranges.step >= 0
        labels = [display_name(x) for x in ranges.names]
        per: dict[str, list[float]] = {}
        covered = np.zeros(n)
        for code in np.unique(ranges.name[inside]).tolist():
            sel = inside & (ranges.name == code)
            # a range past its step's end counts to the end only (a cut trace)
            stop = np.minimum(
                ranges.start_us[sel] + ranges.dur_us[sel], steps.end_us[ranges.step[sel]]
            )
            ms = (
                np.bincount(
                    ranges.step[sel],
                    weights=np.maximum(stop - ranges.start_us[sel], 0.0),
                    minlength=n,
                )[:n]
                / 1000.0
            )
            name = labels[code]
            prior = np.asarray(per.get(name, np.zeros(n)))
            per[name] = (prior + ms).tolist()
            covered += ms
            if name not in out.names:
                out.names.append(name)
        per[OUTSIDE] = np.maximum(spans - covered, 0.0).tolist()
        # steps the trace has for this rank only (a gap in its numbering is no step)
        keep = np.flatnonzero(known)
        out.ranks.append(
            RankPhases(
                rank,
                len(keep),
                [round(float(x), 6) for x in spans[keep]],
                {k: [round(float(v[i]), 6) for i in keep.tolist()] for k, v in per.items()},
            )
        )
    out.outlier, out.verdict = _compare(out)
    return out


def _compare(p: UserPhases) -> tuple[tuple[int, str, float, float] | None, str | None]:
    """The range in which one rank differs most from the others (its mean against their
    median), when the difference is material."""
    if not p.ranks:
        return None, None
    if len(p.ranks) < 2:
        top = max(p.names, key=p.ranks[0].mean_ms) if p.names else None
        if top is None:
            return None, None
        r = p.ranks[0]
        return None, (
            f"In the trace's own ranges, rank {r.rank}'s step ({r.mean_step_ms():.1f} ms) goes "
            f"most to '{top}': {r.mean_ms(top):.1f} ms."
        )
    best: tuple[float, int, str, float, float] | None = None
    for name in [*p.names, OUTSIDE]:
        means = np.array([r.mean_ms(name) for r in p.ranks])
        for i, r in enumerate(p.ranks):
            others = float(np.median(np.delete(means, i)))
            excess = float(means[i]) - others
            floor = max(MIN_DIFFERENCE_MS, MIN_DIFFERENCE_SHARE * r.mean_step_ms())
            if excess >= floor and (best is None or excess > best[0]):
                best = (excess, r.rank, name, float(means[i]), others)
    if best is None:
        return None, (
            f"The ranks spend about the same time in each of the trace's own ranges "
            f"({', '.join(repr(n) for n in p.names[:6])}{' ...' if len(p.names) > 6 else ''})."
        )
    excess, rank, name, mine, others = best
    where = f"in '{name}'" if name != OUTSIDE else "outside the trace's ranges"
    missing = sum(1 for r in p.ranks if r.rank != rank and not r.per_step_ms.get(name))
    text = (
        f"In the trace's own ranges, rank {rank} spends {excess:.1f} ms per step more than "
        f"the others {where} ({mine:.1f} ms against {others:.1f})"
    )
    if name != OUTSIDE and missing == len(p.ranks) - 1:
        text += ": the other ranks have no such range"
    return (rank, name, mine, others), text + "."
