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

from collections.abc import Iterator
from typing import Any, ClassVar

import msgspec
import numpy as np

from hvdprof.analysis.result import Result
from hvdprof.analysis.steps import warmup_steps
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


class Outlier(Result):
    """The range in which one rank differs most: its mean ms per step there against the
    other ranks' median."""

    rank: int
    name: str
    ms: float
    others_ms: float

    def __iter__(self) -> Iterator[int | str | float]:
        return iter((self.rank, self.name, self.ms, self.others_ms))


class RankPhases(Result, dict=True):
    rank: int
    steps: int
    per_step_ms: dict[str, list[float]]  # range name (display) -> ms in each step
    #: :meth:`mean_step_ms` and :meth:`mean_ms` of every range (``OUTSIDE`` included), as
    #: the JSON carries them: set by :func:`user_phases` once every range's name is known
    step_mean: float = msgspec.field(default=0.0, name="mean_step_ms")
    means: dict[str, float] = msgspec.field(default_factory=dict, name="mean_ms")
    #: each step's length (the trace's own step span): the means' working, not in the JSON
    #: (``dict=True`` lets an instance set it)
    step_ms: ClassVar[list[float]] = []

    def mean_ms(self, name: str) -> float:
        values = self.per_step_ms.get(name) or []
        values = values[warmup_steps(len(values)) :]
        return float(np.mean(values)) if values else 0.0

    def mean_step_ms(self) -> float:
        values = self.step_ms[warmup_steps(len(self.step_ms)) :]
        return float(np.mean(values)) if values else 0.0


class UserPhases(Result):
    """Per rank, ms per step in each of the trace's own ranges; empty without ranges."""

    names: list[str] = msgspec.field(default_factory=list)  # display names, in order of first use
    ranks: list[RankPhases] = msgspec.field(default_factory=list)
    #: the range in which a rank differs (None: none does materially)
    outlier: Outlier | None = None
    #: the name of the time in no range
    outside: str = OUTSIDE
    verdict: str | None = None


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
        phases = RankPhases(
            rank,
            len(keep),
            {k: [round(float(v[i]), 6) for i in keep.tolist()] for k, v in per.items()},
        )
        phases.step_ms = [round(float(x), 6) for x in spans[keep]]
        out.ranks.append(phases)
    for phases in out.ranks:
        phases.step_mean = phases.mean_step_ms()
        phases.means = {n: phases.mean_ms(n) for n in [*out.names, OUTSIDE]}
    found, out.verdict = _compare(out)
    out.outlier = Outlier(*found) if found else None
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


def user_phases_table(console: Any, number: str, p: UserPhases) -> None:
    """The trace's own ranges, one row each, one column per rank (up to 8; beyond, the
    median and the rank with the most)."""
    from rich.table import Table

    from hvdprof.analysis.table_cells import fitted, ms

    table = Table(
        title=f"{number}. The step in the trace's own ranges (record_function; mean ms per step)"
    )
    table.add_column("range", justify="left", overflow="fold")
    few = len(p.ranks) <= 8
    if few:
        for r in p.ranks:
            table.add_column(f"rank {r.rank}", justify="right")
    else:
        table.add_column("median", justify="right")
        table.add_column("most (rank)", justify="right")
    for name in [*p.names, OUTSIDE, "step"]:
        values = [r.mean_step_ms() if name == "step" else r.mean_ms(name) for r in p.ranks]
        if few:
            table.add_row(name, *[ms(v) for v in values])
        else:
            top = int(np.argmax(values))
            table.add_row(
                name, ms(float(np.median(values))), f"{ms(values[top])} ({p.ranks[top].rank})"
            )
    console.print(fitted(table))
