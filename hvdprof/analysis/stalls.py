"""Stalls: which rank kept the job waiting, for how long, at which step, and where.

Rank 0 puts a ``STALL`` instant on its timeline each time it reports a stall (once per
HVDPROF_STALL_CHECK_TIME_SECONDS while it lasts), with the late ranks' stacks. One stall
is the run of reports with the same late ranks and names that started at the same time;
how long it kept the job waiting comes from the stalled op's negotiation on the
reporting rank (from submission until every rank was ready), which runs past the last
report, else from the last report.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from hvdprof.analysis.registry import Analysis
from hvdprof.analysis.result import Result
from hvdprof.trace.model import PHASE_NEGOTIATE, Run, StallRecord

#: reports whose starts (report time - time waited) are this close belong to one stall
_SAME_START_US = 1_000_000.0


class Stall(Result):
    start_us: float
    end_us: float  # the last report, or when the op finally negotiated
    missing: list[int]
    names: list[str]
    waited_s: float
    step: int
    where: dict[int, str] = msgspec.field(default_factory=dict)
    collective: dict[int, str] = msgspec.field(default_factory=dict)
    reports: int = 1
    shutdown: bool = False
    line: str = ""
    #: :meth:`sentence`, as the JSON carries it (kept current by :func:`stall_report`)
    said: str = msgspec.field(default="", name="sentence")

    def __post_init__(self) -> None:
        self.said = self.sentence()

    def sentence(self) -> str:
        """``rank 1 kept the job waiting 20.1 s at step 1, in load_batch (train.py:4)``"""
        who = (
            f"rank {self.missing[0]}"
            if len(self.missing) == 1
            else "ranks " + ", ".join(str(r) for r in self.missing)
        )
        step = f" at step {self.step}" if self.step >= 0 else ""
        text = f"{who} kept the job waiting {self.waited_s:.1f} s{step}"
        places = []
        for rank in self.missing:
            where = self.where.get(rank)
            if not where:
                continue
            first = where.split(" <- ")[0]
            coll = self.collective.get(rank)
            inside = f"waiting in {coll} (a mismatch), called from " if coll else ""
            places.append(
                (f"rank {rank} " if len(self.missing) > 1 else "") + f"in {inside}{first}"
            )
        if places:
            text += ", " + "; ".join(places)
        if self.shutdown:
            text += " (the job was ended: HVDPROF_STALL_SHUTDOWN_TIME_SECONDS)"
        return text


class StallReport(Result):
    stalls: list[Stall] = msgspec.field(default_factory=list)

    @property
    def verdicts(self) -> list[str]:
        """One sentence per stall, longest first."""
        return [s.sentence() + "." for s in sorted(self.stalls, key=lambda s: -s.waited_s)]


def stall_report(run: Run) -> StallReport:
    stalls: list[Stall] = []
    open_: dict[tuple[tuple[int, ...], tuple[str, ...]], Stall] = {}
    for rec in run.stalls:
        start = rec.ts_us - rec.waited_s * 1e6
        key = (tuple(rec.missing), tuple(rec.names))
        cur = open_.get(key)
        if cur is not None and abs(cur.start_us - start) <= _SAME_START_US:
            _merge(cur, rec)
            continue
        cur = Stall(
            start_us=start,
            end_us=rec.ts_us,
            missing=list(rec.missing),
            names=list(rec.names),
            waited_s=rec.waited_s,
            step=rec.step,
            where=dict(rec.where),
            collective=dict(rec.collective),
            shutdown=rec.shutdown,
            line=rec.line,
        )
        open_[key] = cur
        stalls.append(cur)
    for stall in stalls:
        _refine(run, stall, observer=0)
        stall.said = stall.sentence()  # merged and refined since it was made
    return StallReport(stalls)


def _merge(cur: Stall, rec: StallRecord) -> None:
    cur.reports += 1
    if rec.ts_us >= cur.end_us:
        cur.end_us = rec.ts_us
        cur.waited_s = max(cur.waited_s, rec.waited_s)
        cur.where.update(rec.where)
        cur.collective = dict(rec.collective)
        cur.line = rec.line
    cur.shutdown = cur.shutdown or rec.shutdown


def _refine(run: Run, stall: Stall, observer: int) -> None:
    """The whole wait and its step from the stalled op's negotiation slice, when the
    reporting rank recorded one spanning the reports."""
    s = run.slices
    if not len(s):
        return
    codes = [i for i, name in enumerate(run.tensors) if name in set(stall.names)]
    if not codes:
        return
    mask = (s.phase == PHASE_NEGOTIATE) & (s.rank == observer) & np.isin(s.tensor, codes)
    mask &= (s.start_us <= stall.start_us + _SAME_START_US) & (s.end_us >= stall.end_us)
    if not mask.any():
        return
    i = int(np.flatnonzero(mask)[np.argmax(s.dur_us[mask])])
    stall.waited_s = max(stall.waited_s, float(s.dur_us[i]) / 1e6)
    stall.end_us = max(stall.end_us, float(s.start_us[i] + s.dur_us[i]))
    if int(s.occurrence[i]) >= 0:
        stall.step = int(s.occurrence[i])


def stall_table(console: Any, number: int, s: StallReport, run: dict[str, Any]) -> None:
    """Each stall rank 0 reported, longest first: who, how long, at which step, where."""
    from rich.table import Table

    from hvdprof.analysis.table_cells import fitted, some_names

    if not s.stalls:
        return
    table = Table(title=f"{number}. Stalls: who kept the job waiting (longest first)")
    for col in ("late rank(s)", "waited (s)", "step", "reports", "ops waited for", "where"):
        table.add_column(
            col, justify="right" if col in ("waited (s)", "step", "reports") else "left"
        )
    for x in sorted(s.stalls, key=lambda x: -x.waited_s):
        places = []
        for rank in x.missing:
            where = x.where.get(rank)
            if where:
                coll = x.collective.get(rank)
                inside = f"waiting in {coll} (a mismatch), called from " if coll else ""
                places.append(f"rank {rank}: {inside}{where.split(' <- ')[0]}")
        table.add_row(
            ", ".join(str(r) for r in x.missing),
            f"{x.waited_s:.1f}" + (" (job ended)" if x.shutdown else ""),
            str(x.step) if x.step >= 0 else "-",
            f"{x.reports:,}",
            some_names(x.names, len(x.names)) or "-",
            "\n".join(places) or "-",
        )
    console.print(fitted(table))


# what someone whose job hung wants to know first: the first verdict
ANALYSIS = Analysis(
    "stalls", stall_report, StallReport,
    "Stalls: which rank kept the job waiting, how long, and where",
    verdict_order=-20, table=stall_table, report_key="stalls",
)  # fmt: skip
