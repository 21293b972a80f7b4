"""``/api/analysis/*``: one endpoint per analysis of :mod:`hvdprof.analysis.registry`.

Each route calls its analysis's function and returns its ``to_dict()``; nothing is
computed here. The routes are made from the registry when an app is made (``router`` and
``ANALYSES`` are built on access), so an analysis registered there, at import or later,
has its route with no change here, and its response model: a section whose ``data`` has
the schema generated from the analysis's result type (:mod:`hvdprof.analysis.schema`,
the same one ``python -m hvdprof.analysis.schema`` publishes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel

from hvdprof.analysis import registry, schema
from hvdprof.dashboard.catalog import RunCatalog
from hvdprof.dashboard.models import Section, typed_section
from hvdprof.dashboard.routes.deps import get_catalog
from hvdprof.dashboard.routes.runs import RunId
from hvdprof.dashboard.service import section

PREFIX = "/api/analysis"


def analysis_routes() -> dict[str, tuple[registry.Ref, str]]:
    """URL name -> (the function it calls, what it answers): the whole report first, then
    every registered analysis that has a route of its own."""
    routes: dict[str, tuple[registry.Ref, str]] = {
        registry.REPORT_NAME: (registry.REPORT_FUNCTION, registry.REPORT_SUMMARY)
    }
    for analysis in registry.analyses():
        if analysis.route:
            routes[analysis.name] = (analysis.function, analysis.summary)
    return routes


class AnalysisRoute(BaseModel):
    """One analysis the API answers: what a page loops over to load every section."""

    name: str
    path: str
    summary: str
    #: its key in ``/api/analysis/report``'s ``data`` (false: the API's alone)
    in_report: bool


def analysis_function(function: registry.Ref) -> Callable[[Any], Any] | None:
    """The function a route names, None if this installation lacks it."""
    try:
        found = registry.resolve(function)
    except (ImportError, AttributeError):
        return None
    return found if callable(found) else None


def response_model(name: str) -> type[Section]:
    """The route's typed section; the plain one when its result type cannot be found in
    this installation or is not one msgspec can describe (a plugin's own class)."""
    try:
        if name == registry.REPORT_NAME:
            kind: Any = schema.report_struct()
            summary = registry.REPORT_SUMMARY
        else:
            analysis = registry.get(name)
            kind, summary = schema.result_type(analysis), analysis.summary
        return typed_section(name, schema.inline_schema(kind), summary)
    except (ImportError, AttributeError, TypeError):
        return Section


def _endpoint(name: str, function: registry.Ref) -> Callable[..., Section]:
    def analysis(run: RunId, catalog: Annotated[RunCatalog, Depends(get_catalog)]) -> Section:
        catalog.entry(run)  # 403 / 404 before anything else
        compute = analysis_function(function)
        if compute is None:
            return Section(
                run=run, version=0, data=None,
                notices=[f"this installation's analysis library has no "
                         f"{registry.qualified(function)}()"],
            )  # fmt: skip
        return section(catalog, run, name, compute)

    analysis.__name__ = f"analysis_{name}"
    return analysis


def listed_analyses() -> list[AnalysisRoute]:
    """``GET /api/analysis``: every analysis with a route, in the registry's order (the
    page draws those it has no drawer for from their results)."""
    return [
        AnalysisRoute(name=a.name, path=f"{PREFIX}/{a.name}", summary=a.summary,
                      in_report=a.in_report)
        for a in registry.analyses()
        if a.route
    ]  # fmt: skip


def build_router() -> APIRouter:
    """One GET route per entry of :func:`analysis_routes`, as the registry stands now."""
    router = APIRouter(prefix=PREFIX, tags=["analyses"])
    listed = listed_analyses()

    def analysis_index() -> list[AnalysisRoute]:
        return listed

    router.add_api_route(
        "",
        analysis_index,
        methods=["GET"],
        response_model=list[AnalysisRoute],
        summary="The analyses this API answers, in the registry's order",
        description="Each has its route; `report` holds those with `in_report` at once.",
    )
    for name, (function, summary) in analysis_routes().items():
        router.add_api_route(
            f"/{name}",
            _endpoint(name, function),
            methods=["GET"],
            response_model=response_model(name),
            summary=summary,
            description=f"`{registry.qualified(function)}(run).to_dict()` in `data`, typed "
            "by the result's generated schema.",
        )
    return router


def __getattr__(name: str) -> Any:
    # ``create_app`` includes ``routes.analyses.router``: built then, from the registry
    if name == "router":
        return build_router()
    if name == "ANALYSES":
        return analysis_routes()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
