"""Q1: where does the time go, per rank? Wall time by phase, totals and per step.

Phases overlap (many tensors negotiate at once; a fused group's children appear on each
of its tensors' lanes), so this counts wall time, not summed durations: at each instant
a rank is in the highest-priority phase that any of its slices is in, or idle when none
(the categories, their order and words, and that cut are :mod:`hvdprof.analysis.phases`,
shared with ``hvdprof diff``, the gate, the run summary and the binned timeline).
Idle is time with no collective activity: computing, or waiting on the data loader.
The phases of a rank therefore add up to its wall time.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from hvdprof.analysis.phases import CATEGORIES, LABELS, PRIORITY, SHORT_LABELS, rank_segments
from hvdprof.analysis.registry import Analysis
from hvdprof.analysis.result import Result
from hvdprof.analysis.steps import step_of, step_starts, warmup_steps
from hvdprof.analysis.user_phases import UserPhases, user_phases, user_phases_table
from hvdprof.trace.model import Run


class RankBreakdown(Result):
    rank: int
    wall_ms: float
    total_ms: dict[str, float]  # category -> ms over the whole run
    steps: int
    per_step_ms: dict[str, list[float]]  # category -> ms in each step
    #: :meth:`share` and :meth:`mean_step_ms` of every category, as the JSON carries them
    shares: dict[str, float] = msgspec.field(default_factory=dict, name="share")
    step_means: dict[str, float] = msgspec.field(default_factory=dict, name="mean_step_ms")

    def __post_init__(self) -> None:
        known = [c for c in CATEGORIES if c in self.total_ms]
        self.shares = {c: self.share(c) for c in known}
        self.step_means = {c: self.mean_step_ms(c) for c in known}

    def share(self, category: str) -> float:
        return self.total_ms[category] / self.wall_ms if self.wall_ms > 0 else 0.0

    def mean_step_ms(self, category: str) -> float:
        """Mean per step, the warm-up step (start-up broadcasts, first allocations) left out
        as in the run's step time, so the two add up."""
        values = self.per_step_ms.get(category) or []
        values = values[warmup_steps(len(values)) :]
        return float(np.mean(values)) if values else 0.0


class Breakdown(Result):
    """Wall time by phase per rank (ms); ``per_step_ms`` lists one value per step."""

    categories: list[str] = msgspec.field(default_factory=lambda: list(CATEGORIES))
    #: each category in plain words
    labels: dict[str, str] = msgspec.field(default_factory=lambda: dict(LABELS))
    ranks: list[RankBreakdown] = msgspec.field(default_factory=list)
    verdict: str | None = None
    #: the same steps in the trace's own ``record_function`` ranges (Kineto), if any
    user: UserPhases = msgspec.field(default_factory=UserPhases, name="user_phases")


def time_breakdown(run: Run) -> Breakdown:
    """Wall time per rank in each phase and idle, over the run and per step."""
    seg_rank, seg_start, seg_len, seg_cat = rank_segments(run)
    starts = step_starts(run)
    s = run.slices
    out = Breakdown()
    k = len(PRIORITY)
    for rank in run.ranks:
        mask_r = s.rank == rank
        if not mask_r.any():
            continue
        r0 = float(s.start_us[mask_r].min())
        r1 = float((s.start_us[mask_r] + s.dur_us[mask_r]).max())
        sel = seg_rank == rank
        cat = seg_cat[sel].astype(np.int64)
        lengths = seg_len[sel]
        totals = np.bincount(cat, weights=lengths, minlength=k)[:k] / 1000.0
        wall = (r1 - r0) / 1000.0
        total_ms = {CATEGORIES[i]: float(totals[i]) for i in range(k)}
        total_ms["idle"] = max(wall - float(totals.sum()), 0.0)
        bounds = starts.get(rank, np.zeros(0))
        per_step: dict[str, list[float]] = {c: [] for c in CATEGORIES}
        n_steps = len(bounds)
        if n_steps:
            step = step_of(bounds, seg_start[sel])
            ok = step >= 0
            flat = step[ok] * k + cat[ok]
            table = np.bincount(flat, weights=lengths[ok], minlength=n_steps * k)
            table = table[: n_steps * k].reshape(n_steps, k) / 1000.0
            ends = np.append(bounds[1:], r1)
            spans = (ends - bounds) / 1000.0
            for i in range(k):
                per_step[CATEGORIES[i]] = [round(float(x), 6) for x in table[:, i]]
            idle = np.maximum(spans - table.sum(axis=1), 0.0)
            per_step["idle"] = [round(float(x), 6) for x in idle]
        out.ranks.append(RankBreakdown(rank, wall, total_ms, n_steps, per_step))
    out.verdict = _verdict(out)
    out.user = user_phases(run)
    return out


def _verdict(b: Breakdown) -> str | None:
    if not b.ranks:
        return None
    busy = [c for c in CATEGORIES if c != "idle"]
    mean_share = {c: float(np.mean([r.share(c) for r in b.ranks])) for c in CATEGORIES}
    top = max(busy, key=lambda c: mean_share[c])
    comm = sum(mean_share[c] for c in busy)
    text = (
        f"Collective work covers {comm:.0%} of the wall time on average across "
        f"{len(b.ranks)} rank(s); the largest part is {LABELS[top]}: "
        f"{mean_share[top]:.0%} of the wall time."
    )
    if top == "negotiate" and len(b.ranks) > 1:
        worst = max(b.ranks, key=lambda r: r.share("negotiate"))
        least = min(b.ranks, key=lambda r: r.share("negotiate"))
        # Not "the others wait for it": the rank that waits least need not be late (rank
        # 0 coordinates, so it learns first that everyone is ready). Blame is the straggler
        # analysis' verdict, from every rank's own arrival times.
        text += (
            f" Rank {worst.rank} waits longest in negotiation ({worst.share('negotiate'):.0%}),"
            f" rank {least.rank} least ({least.share('negotiate'):.0%}); whether one rank keeps"
            " the others waiting is the straggler verdict's answer."
        )
    return text


def _said(b: Breakdown) -> list[str]:
    """The job's verdict, then the one over the trace's own ranges."""
    return [text for text in (b.verdict, b.user.verdict) if text]


def breakdown_table(console: Any, number: int, b: Breakdown, run: dict[str, Any]) -> None:
    """Where the time goes per rank; then the trace's own ranges (``{number}b``)."""
    from rich.table import Table

    from hvdprof.analysis.table_cells import fitted

    if b.ranks:
        steps = sorted({rb.steps for rb in b.ranks})
        # the step count goes in the title when every rank has the same (a column fewer:
        # the table then fits 80 columns with whole headers)
        per_rank = len(steps) > 1
        shown = "" if per_rank else f", {steps[0]} steps"
        if all(warmup_steps(rb.steps) for rb in b.ranks):
            shown += ", the first left out"
        table = Table(
            title=f"{number}. Where the time goes, per rank (mean ms per step{shown}, "
            "share of wall time)"
        )
        table.add_column("rank", justify="right")
        if per_rank:
            table.add_column("steps", justify="right")
        for c in CATEGORIES:
            table.add_column(SHORT_LABELS[c], justify="right")
        for rb in b.ranks:
            table.add_row(
                str(rb.rank),
                *([str(rb.steps)] if per_rank else []),
                *[f"{rb.mean_step_ms(c):.2f} ({rb.share(c):.0%})" for c in CATEGORIES],
            )
        console.print(fitted(table))
        console.print(
            "  waiting = negotiation wait: submitted, waiting for the other ranks;"
            " idle = no collective activity on the rank (compute, data loading);"
            " backend = the backend's collective call",
            highlight=False,
        )
    if b.user.ranks:
        user_phases_table(console, f"{number}b", b.user)


ANALYSIS = Analysis(
    "breakdown", time_breakdown, Breakdown, "Time per phase per rank",
    verdict_order=30, verdicts=_said, table=breakdown_table,
)  # fmt: skip
