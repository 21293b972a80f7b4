"""Did the ranks stop holding one model? (``DIVERGENCE`` instants, HVDPROF_CHECK_DIVERGENCE).

Every rank records the finding on its own timeline; they agree, so the earliest step is
the answer. It comes first among the verdicts: when the ranks train different models,
every timing question is moot.
"""

from __future__ import annotations

from typing import Any

import msgspec

from hvdprof.analysis.registry import Analysis
from hvdprof.analysis.result import Result
from hvdprof.common import activities as act
from hvdprof.trace.model import Run


class DivergenceReport(Result):
    #: the first step (optimizer steps, counted from 1) at which ranks differed; None: none seen
    step: int | None = None
    ranks: list[int] = msgspec.field(default_factory=list)
    weights: list[str] = msgspec.field(default_factory=list)
    grads: list[str] = msgspec.field(default_factory=list)
    weights_total: int = 0
    grads_total: int = 0
    #: ranks whose timelines recorded the finding
    seen_by: list[int] = msgspec.field(default_factory=list)
    verdict: str = ""


def _names(names: list[str], total: int) -> str:
    shown = ", ".join(f"'{n}'" for n in names)
    return shown + (f" and {total - len(names)} more" if total > len(names) else "")


def divergence_report(run: Run) -> DivergenceReport:
    found = [n for n in run.notices if n.name == act.DIVERGENCE and "step" in n.args]
    if not found:
        return DivergenceReport()
    first = min(found, key=lambda n: (int(n.args["step"]), n.rank))
    a = first.args
    report = DivergenceReport(
        step=int(a["step"]),
        ranks=[int(r) for r in a.get("ranks", [])],
        weights=[str(x) for x in a.get("weights", [])],
        grads=[str(x) for x in a.get("grads", [])],
        weights_total=int(a.get("weights_total", 0)),
        grads_total=int(a.get("grads_total", 0)),
        seen_by=sorted({n.rank for n in found}),
    )
    what = []
    if report.weights_total:
        what.append(f"the weights of {_names(report.weights, report.weights_total)}")
    if report.grads_total:
        what.append(f"the averaged gradients of {_names(report.grads, report.grads_total)}")
    ranks = ", ".join(str(r) for r in report.ranks)
    report.verdict = (
        f"The ranks diverged at step {report.step}: rank(s) {ranks} differ from rank 0 in "
        f"{' and in '.join(what) or 'their values'}, so they no longer train one model. "
        "Look for rank-dependent code that changes weights or gradients before that step."
    )
    return report


# what someone whose ranks diverged wants to know first, after a stall


def divergence_table(console: Any, number: int, d: DivergenceReport, run: dict[str, Any]) -> None:
    """Where the ranks stopped holding one model (nothing when they never did)."""
    from rich.table import Table

    from hvdprof.analysis.table_cells import fitted, some_names

    if d.step is None:
        return
    table = Table(title=f"{number}. Divergence: the ranks stopped holding one model")
    table.add_column("what", justify="left")
    table.add_column("found", justify="left")
    table.add_row("first step that differed", str(d.step))
    table.add_row("ranks differing from rank 0", ", ".join(str(r) for r in d.ranks) or "-")
    if d.weights_total:
        table.add_row("weights", some_names(d.weights, d.weights_total))
    if d.grads_total:
        table.add_row("averaged gradients", some_names(d.grads, d.grads_total))
    table.add_row("recorded by ranks", ", ".join(str(r) for r in d.seen_by))
    console.print(fitted(table))


ANALYSIS = Analysis(
    "divergence", divergence_report, DivergenceReport,
    "Divergence: the first step at which the ranks' weights or gradients differed",
    verdict_order=-10, table=divergence_table,
)  # fmt: skip
