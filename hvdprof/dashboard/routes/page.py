"""The page itself: ``/`` and its static files from ``web/``, plus Plotly from the package.

Plotly's JavaScript comes from the installed ``plotly`` Python package (no CDN: cluster
nodes are often offline). Static paths go through :func:`resolve_inside`, so ``..``,
percent-encoded or not, and symlinks out of ``web/`` are refused.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException
from fastapi.responses import FileResponse, Response

from hvdprof.dashboard.catalog import RunCatalog
from hvdprof.dashboard.live import ChangeFeed
from hvdprof.dashboard.models import Health
from hvdprof.dashboard.paths import OutsideRootError, resolve_inside
from hvdprof.dashboard.routes.deps import get_catalog, get_feed, get_settings
from hvdprof.dashboard.settings import DashboardSettings

router = APIRouter(tags=["page"])

_TYPES = {
    ".js": "text/javascript",
    ".css": "text/css",
    ".html": "text/html",
    ".svg": "image/svg+xml",
}


def plotly_js_path() -> Path:
    """``plotly.min.js`` shipped inside the installed ``plotly`` package."""
    resource = importlib.resources.files("plotly") / "package_data" / "plotly.min.js"
    return Path(str(resource))


@router.get("/", include_in_schema=False)
def index(settings: Annotated[DashboardSettings, Depends(get_settings)]) -> FileResponse:
    page = settings.web_dir / "index.html"
    if not page.is_file():
        raise HTTPException(
            404, f"the dashboard page is not installed ({page} is missing): reinstall hvdprof"
        )
    return FileResponse(page, media_type="text/html")


@router.get("/static/plotly.min.js", include_in_schema=False)
def plotly_js() -> FileResponse:
    path = plotly_js_path()
    if not path.is_file():
        raise HTTPException(404, "plotly.min.js is not in the installed plotly package")
    return FileResponse(path, media_type="text/javascript")


@router.get("/static/{name:path}", include_in_schema=False)
def static(name: str, settings: Annotated[DashboardSettings, Depends(get_settings)]) -> Response:
    try:
        path = resolve_inside(settings.web_dir, name)
    except OutsideRootError as exc:
        raise HTTPException(403, str(exc)) from None
    if not path.is_file():
        raise HTTPException(404, f"no static file {name!r}")
    return FileResponse(path, media_type=_TYPES.get(path.suffix, "application/octet-stream"))


@router.get("/api/health", response_model=Health, tags=["runs"], summary="Is the server up")
def health(
    catalog: Annotated[RunCatalog, Depends(get_catalog)],
    feed: Annotated[ChangeFeed, Depends(get_feed)],
) -> Health:
    return Health(ok=True, runs=len(catalog.cached()), subscribers=feed.subscribers)
