"""A toy analysis in one file: how many slices each rank's timeline holds.

Named in ``HVDPROF_ANALYSES=plugins.toy_slice_count`` (with ``tests`` on ``PYTHONPATH``),
it is in ``hvdprof analyze`` (a verdict and a numbered table), ``--json``, the API
(``/api/analysis/toy_slice_count``), ``/openapi.json`` with its typed schema, and on the
page, drawn from its result: no other file names it.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from hvdprof.analysis.registry import Analysis
from hvdprof.analysis.result import Result
from hvdprof.trace.model import Run


class RankSlices(msgspec.Struct):
    rank: int
    slices: int
    #: the slices' summed duration
    busy_ms: float


class SliceCount(Result):
    """The toy's answer: slices in all, and per rank."""

    slices: int
    ranks: list[RankSlices]
    verdict: str


def slice_count(run: Run) -> SliceCount:
    rank, dur = run.slices.rank, run.slices.dur_us
    ranks = [
        RankSlices(r, int((rank == r).sum()), round(float(dur[rank == r].sum()) / 1000.0, 3))
        for r in np.unique(rank).tolist()
    ]
    total = len(run.slices)
    return SliceCount(total, ranks, f"Toy: {total} slices were read from {len(ranks)} rank(s).")


def slice_count_table(console: Any, number: int, value: SliceCount, run: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=f"{number}. Toy: slices per rank", title_justify="left")
    for column in ("rank", "slices", "busy ms"):
        table.add_column(column, justify="right")
    for r in value.ranks:
        table.add_row(str(r.rank), str(r.slices), f"{r.busy_ms:.3f}")
    console.print(table)


ANALYSIS = Analysis(
    name="toy_slice_count",
    function=slice_count,
    result=SliceCount,
    summary="Toy: how many slices each rank's timeline holds",
    verdict_order=90,  # after every built-in verdict
    table=slice_count_table,
)
