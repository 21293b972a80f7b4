"""Response models of the dashboard's JSON API (what ``/docs`` shows).

Analysis results are the analysis library's own ``to_dict()`` output, carried unchanged in
``data``: the dashboard adds the envelope (which run, which version of it, notices about
what could not be shown) and never re-derives a number.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class Problem(BaseModel):
    """Something in a run's files the reader could not use, with where and why."""

    file: str
    where: str
    reason: str
    partial_tail: bool = Field(
        default=False,
        description="the file ends in an event not yet written whole: what a file still "
        "being written looks like (the page lists it only once the run is finished)",
    )


class RunRef(BaseModel):
    """A run found under the served directory."""

    id: str = Field(
        description="path relative to the served directory ('.' for the directory itself)"
    )
    kind: str = Field(description="'directory' (per-rank hvdprof files) or 'file' (one trace file)")


class RunList(BaseModel):
    """Every run under the served directory."""

    root: str
    runs: list[RunRef]
    notices: list[str] = []


class RunInfo(BaseModel):
    """What a run holds: ranks, hosts, time span, how complete it is."""

    id: str
    kind: str
    format: str = Field(description="'hvdprof' or 'horovod'")
    ranks: list[int]
    hosts: dict[str, str] = Field(description="rank -> host")
    complete: bool = Field(description="every file closed cleanly (False while a job writes)")
    t0_us: float | None
    t1_us: float | None
    tensors: int
    problems: list[Problem]
    version: int = Field(description="bumped each time new events were read")
    notices: list[str] = []


class Section(BaseModel):
    """One analysis of one run: the library's ``to_dict()`` in ``data``, or notices why not."""

    run: str
    version: int
    data: dict[str, Any] | None
    notices: list[str] = []


class TimelineWindowResponse(BaseModel):
    """Events of one time window (aggregated when there are more than ``max_items``)."""

    run: str
    version: int
    t0_us: float
    t1_us: float
    data: dict[str, Any] | None
    notices: list[str] = []


class CompareResponse(BaseModel):
    """The difference between two runs (``diff_runs(a, b).to_dict()``)."""

    a: str
    b: str
    data: dict[str, Any] | None
    notices: list[str] = []


class Health(BaseModel):
    ok: bool
    runs: int
    subscribers: int
