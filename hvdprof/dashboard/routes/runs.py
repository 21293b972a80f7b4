"""``/api/runs``: which runs the served directory holds, and what one run contains."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from hvdprof.dashboard.catalog import RunCatalog, shown
from hvdprof.dashboard.models import RunInfo, RunList, RunRef
from hvdprof.dashboard.routes.deps import get_catalog
from hvdprof.dashboard.service import run_info

router = APIRouter(prefix="/api", tags=["runs"])

RunId = Annotated[str, Query(description="run id from /api/runs ('.' = the served directory)")]


@router.get("/runs", response_model=RunList, summary="Runs under the served directory")
def list_runs(catalog: Annotated[RunCatalog, Depends(get_catalog)]) -> RunList:
    runs = [RunRef(id=e.shown_id, kind=e.kind) for e in catalog.entries()]
    notices = [] if runs else [
        "no timeline here yet: this page updates by itself when a job starts writing one"
    ]  # fmt: skip
    return RunList(root=shown(str(catalog.root)), runs=runs, notices=notices)


@router.get("/run", response_model=RunInfo, summary="One run: ranks, hosts, time span, problems")
def get_run(run: RunId, catalog: Annotated[RunCatalog, Depends(get_catalog)]) -> RunInfo:
    return run_info(catalog, run)
