"""``/api/compare``: the difference between two runs under the served directory."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from hvdprof.dashboard.catalog import RunCatalog
from hvdprof.dashboard.models import CompareResponse
from hvdprof.dashboard.routes.deps import get_catalog
from hvdprof.dashboard.service import compare

router = APIRouter(prefix="/api", tags=["compare"])


@router.get("/compare", response_model=CompareResponse, summary="diff_runs(a, b)")
def compare_runs(
    a: Annotated[str, Query(description="baseline run id")],
    b: Annotated[str, Query(description="run to compare with the baseline")],
    catalog: Annotated[RunCatalog, Depends(get_catalog)],
) -> CompareResponse:
    catalog.entry(a), catalog.entry(b)  # 403/404 before loading anything
    return compare(catalog, a, b)
