"""Response models of the dashboard's JSON API (what ``/docs`` shows).

Analysis results are the analysis library's own ``to_dict()`` output, carried unchanged in
``data``: the dashboard adds the envelope (which run, which version of it, notices about
what could not be shown) and never re-derives a number. Each ``/api/analysis/<name>``
declares its own :func:`typed_section`, whose ``data`` schema is generated from the
analysis's result type (:mod:`hvdprof.analysis.schema`), so ``/docs`` shows every field.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field, WithJsonSchema, create_model

from hvdprof.analysis.diff import RunDiff
from hvdprof.analysis.window import TimelineWindow


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


def typed_data(data_schema: dict[str, Any]) -> Any:
    """``data``'s type: a dict or None, declared with ``data_schema`` (a result type's
    generated schema, inlined). Validation stays a dict's: the schema is the type's own,
    and the answer was made from that type, so there is nothing to check twice."""
    return Annotated[
        dict[str, Any] | None, WithJsonSchema({"anyOf": [data_schema, {"type": "null"}]})
    ]


def result_data(kind: Any) -> Any:
    """:func:`typed_data` for the result type ``kind`` (its schema generated now)."""
    from hvdprof.analysis.schema import inline_schema

    return typed_data(inline_schema(kind))


def typed_section(name: str, data_schema: dict[str, Any], summary: str) -> type[Section]:
    """The :class:`Section` of ``/api/analysis/<name>``: ``data`` declared by the analysis's
    result schema."""
    title = "".join(part.title() for part in name.split("_"))
    model: type[Section] = create_model(
        f"{title}Section",
        __base__=Section,
        __doc__=f"{summary}: the answer in ``data``, or notices why not.",
        data=(typed_data(data_schema), ...),
    )
    return model


#: ``timeline_window(...).to_dict()`` and ``diff_runs(a, b).to_dict()``, typed
WindowData = result_data(TimelineWindow)
DiffData = result_data(RunDiff)


class TimelineWindowResponse(BaseModel):
    """Events of one time window (aggregated when there are more than ``max_items``)."""

    run: str
    version: int
    t0_us: float
    t1_us: float
    data: WindowData
    notices: list[str] = []


class CompareResponse(BaseModel):
    """The difference between two runs (``diff_runs(a, b).to_dict()``)."""

    a: str
    b: str
    data: DiffData
    notices: list[str] = []


class Health(BaseModel):
    ok: bool
    runs: int
    subscribers: int
