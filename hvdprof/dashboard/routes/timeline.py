"""``/api/timeline``: the events of one time window, aggregated when there are too many."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query

from hvdprof.dashboard.catalog import RunCatalog
from hvdprof.dashboard.models import TimelineWindowResponse
from hvdprof.dashboard.routes.deps import get_catalog
from hvdprof.dashboard.routes.runs import RunId
from hvdprof.dashboard.service import section

router = APIRouter(prefix="/api", tags=["timeline"])

#: Most items one window may ask for (the page asks for about its width in pixels x lanes).
MAX_ITEMS_LIMIT = 20000


def _ranks(text: str | None) -> tuple[int, ...] | None:
    if text is None or not text.strip():
        return None
    try:
        return tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        raise HTTPException(422, f"ranks must be comma-separated integers, got {text!r}") from None


@router.get(
    "/timeline",
    response_model=TimelineWindowResponse,
    summary="Events between t0_us and t1_us (whole run when omitted), one row per rank",
)
def timeline(
    run: RunId,
    catalog: Annotated[RunCatalog, Depends(get_catalog)],
    t0_us: Annotated[
        float | None, Query(description="window start (timeline microseconds)")
    ] = None,
    t1_us: Annotated[float | None, Query(description="window end (timeline microseconds)")] = None,
    ranks: Annotated[str | None, Query(description="comma-separated ranks (default all)")] = None,
    expand_rank: Annotated[int | None, Query(description="show this rank's tensor lanes")] = None,
    max_items: Annotated[int, Query(ge=10, le=MAX_ITEMS_LIMIT)] = 4000,
) -> TimelineWindowResponse:
    catalog.entry(run)  # 403 / 404 before anything else
    if t0_us is not None and t1_us is not None and not t1_us > t0_us:
        raise HTTPException(422, f"t1_us ({t1_us}) must be greater than t0_us ({t0_us})")
    selected = _ranks(ranks)
    try:
        from hvdprof.analysis import timeline_window
    except ImportError:
        return TimelineWindowResponse(
            run=run, version=0, t0_us=t0_us or 0.0, t1_us=t1_us or 0.0, data=None,
            notices=["this installation's analysis library has no timeline_window()"],
        )  # fmt: skip
    result = section(
        catalog,
        run,
        "timeline",
        lambda r: timeline_window(
            r,
            r.t0_us if t0_us is None else t0_us,
            r.t1_us if t1_us is None else t1_us,
            ranks=selected,
            expand_rank=expand_rank,
            max_items=max_items,
        ),
        t0_us, t1_us, selected, expand_rank, max_items,
    )  # fmt: skip
    data = result.data or {}
    return TimelineWindowResponse(
        run=result.run,
        version=result.version,
        t0_us=float(data.get("t0_us", t0_us or 0.0) or 0.0),
        t1_us=float(data.get("t1_us", t1_us or 0.0) or 0.0),
        data=result.data,
        notices=result.notices,
    )
