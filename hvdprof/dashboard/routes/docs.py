"""``/docs``: the JSON API's Swagger UI, working on a machine with no internet access.

FastAPI's own ``/docs`` loads Swagger UI's JavaScript, CSS and favicon from a CDN, so on an
offline cluster node it is a blank page. This one serves those files from the installed
``fastapi-offline`` package (the same reason Plotly comes from the ``plotly`` package),
and turns off Swagger UI's online validator badge. Only the three named files are served.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

from fastapi import APIRouter, HTTPException, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse

router = APIRouter(tags=["page"])

#: Path the Swagger UI assets are served under.
ASSETS = "/docs-assets"
#: The files Swagger UI needs, by name -> media type.
_ASSET_TYPES = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "favicon.png": "image/png",
}


def swagger_assets() -> Path | None:
    """Swagger UI's files inside the installed ``fastapi_offline`` package, if installed."""
    try:
        return Path(str(importlib.resources.files("fastapi_offline") / "static"))
    except ModuleNotFoundError:
        return None


@router.get("/docs", include_in_schema=False)
def docs(request: Request) -> HTMLResponse:
    root = request.scope.get("root_path", "")
    assets = swagger_assets()
    local = assets is not None and all((assets / name).is_file() for name in _ASSET_TYPES)
    urls = (
        {
            "swagger_js_url": f"{root}{ASSETS}/swagger-ui-bundle.js",
            "swagger_css_url": f"{root}{ASSETS}/swagger-ui.css",
            "swagger_favicon_url": f"{root}{ASSETS}/favicon.png",
        }
        if local
        else {}  # FastAPI's defaults (a CDN) when fastapi-offline is missing
    )
    return get_swagger_ui_html(
        openapi_url=f"{root}{request.app.openapi_url}",
        title=f"{request.app.title}: API",
        swagger_ui_parameters={"validatorUrl": None, "deepLinking": True},
        **urls,
    )


@router.get(ASSETS + "/{name}", include_in_schema=False)
def docs_asset(name: str) -> FileResponse:
    assets = swagger_assets()
    if name not in _ASSET_TYPES or assets is None or not (assets / name).is_file():
        raise HTTPException(404, f"no documentation asset {name!r}")
    return FileResponse(assets / name, media_type=_ASSET_TYPES[name])
