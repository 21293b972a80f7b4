"""``/api/timeline``: the events of one time window, aggregated when there are too many."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, HTTPException, Query

from hvdprof.dashboard.catalog import RunCatalog
from hvdprof.dashboard.models import TimelineWindowResponse
from hvdprof.dashboard.routes.deps import get_catalog
from hvdprof.dashboard.routes.runs import RunId
from hvdprof.dashboard.service import section

router = APIRouter(prefix="/api", tags=["timeline"])

#: Most items one window may ask for (the page asks for about its width in pixels x lanes).
MAX_ITEMS_LIMIT = 20000
#: Ranks are int32 in the analysis' columns; anything beyond cannot name a rank.
MAX_RANK = 2**31 - 1


def _ranks(text: str | None) -> tuple[int, ...] | None:
    if text is None or not text.strip():
        return None
    try:
        ranks = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        raise HTTPException(422, f"ranks must be comma-separated integers, got {text!r}") from None
    bad = [r for r in ranks if not 0 <= r < MAX_RANK]
    if bad:
        raise HTTPException(422, f"ranks must lie in 0..{MAX_RANK - 1}, got {bad[0]}")
    return ranks


def _check_rank(catalog: RunCatalog, run: str, rank: int) -> None:
    """422 when the run has no such rank: its lanes would be empty rows, said by nobody
    (a run that cannot be read is let through: the section's notice says why)."""
    from hvdprof.dashboard.catalog import RunLoadError

    try:
        loaded = catalog.loaded(run).run
    except RunLoadError:
        return
    ranks = sorted(loaded.ranks)
    if rank not in ranks:
        if not ranks:
            has = "none"
        elif ranks == list(range(ranks[0], ranks[-1] + 1)):
            has = f"{ranks[0]}-{ranks[-1]}"
        else:
            has = ", ".join(map(str, ranks[:20])) + (" ..." if len(ranks) > 20 else "")
        raise HTTPException(
            422, f"expand_rank={rank}: this run has no rank {rank} (its ranks: {has})"
        )


def _stream_extent(catalog: RunCatalog, run: str, rank: int | None) -> tuple[float, float] | None:
    """The whole-run window of ``rank``'s stream lanes; 422 when it has no GPU activity
    (None when the run cannot be read: the section's notice says why)."""
    from hvdprof.analysis.gpu_lanes import stream_extent
    from hvdprof.dashboard.catalog import RunLoadError

    try:
        loaded = catalog.loaded(run).run
    except RunLoadError:
        return None
    if rank not in loaded.gpu:
        has = sorted(loaded.gpu)
        raise HTTPException(
            422,
            f"rank {rank} has no GPU activity in this run: no stream lanes"
            + (f" (ranks with GPU activity: {', '.join(map(str, has))})" if has else ""),
        )
    return stream_extent(loaded, rank)


@router.get(
    "/timeline",
    response_model=TimelineWindowResponse,
    summary="Events between t0_us and t1_us (whole run when omitted), one row per rank",
    description="`hvdprof.analysis.timeline_window(run, t0_us, t1_us, ...).to_dict()` in "
    "`data`: one row per rank, or with `expand_rank` that rank's tensor, phase or GPU "
    "stream lanes; "
    "`slices` when they fit in `max_items`, else `buckets` (time bins with their dominant "
    "phase, slice count and busy time).",
)
def timeline(
    run: RunId,
    catalog: Annotated[RunCatalog, Depends(get_catalog)],
    t0_us: Annotated[
        float | None,
        Query(allow_inf_nan=False, description="window start (timeline microseconds)"),
    ] = None,
    t1_us: Annotated[
        float | None, Query(allow_inf_nan=False, description="window end (timeline microseconds)")
    ] = None,
    ranks: Annotated[str | None, Query(description="comma-separated ranks (default all)")] = None,
    expand_rank: Annotated[
        int | None,
        Query(ge=0, lt=MAX_RANK, description="show this rank's slices in lanes (see `lanes`)"),
    ] = None,
    lanes: Annotated[
        Literal["tensor", "phase", "stream"],
        Query(
            description="how `expand_rank` is split: one row per tensor, one row per "
            "phase (negotiate, op, queue, memcpy_in, collective, memcpy_out, ...), or "
            "(runs with GPU activity: torch.profiler traces recorded on a GPU) the rank's "
            "CPU side and one row per GPU stream, kernels coloured by kind (gpu_computation, "
            "gpu_communication, gpu_memory, gpu_other), each with its launch on the CPU"
        ),
    ] = "tensor",
    max_items: Annotated[int, Query(ge=10, le=MAX_ITEMS_LIMIT)] = 4000,
) -> TimelineWindowResponse:
    catalog.entry(run)  # 403 / 404 before anything else
    if t0_us is not None and t1_us is not None and not t1_us > t0_us:
        raise HTTPException(422, f"t1_us ({t1_us}) must be greater than t0_us ({t0_us})")
    if lanes in ("phase", "stream") and expand_rank is None:
        raise HTTPException(
            422, f"lanes={lanes} needs expand_rank: the rank whose {lanes}s to show"
        )
    extent = None
    if lanes == "stream":  # (a rank without GPU activity: said there)
        extent = _stream_extent(catalog, run, expand_rank)
    elif expand_rank is not None:
        _check_rank(catalog, run, expand_rank)
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
            (extent or (r.t0_us, r.t1_us))[0] if t0_us is None else t0_us,
            (extent or (r.t0_us, r.t1_us))[1] if t1_us is None else t1_us,
            ranks=selected,
            expand_rank=expand_rank,
            lanes=lanes,
            max_items=max_items,
        ),
        t0_us, t1_us, selected, expand_rank, lanes, max_items,
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
