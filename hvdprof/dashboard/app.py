"""The FastAPI application: routers, the token check, error mapping, the live watcher.

``create_app(settings)`` is all a server, a test or the report writer needs. The app is
read-only: every route is a GET, and every path it touches is resolved inside the served
directory (or ``web/``) first.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import re
import threading
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qs

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from hvdprof import __version__
from hvdprof.dashboard.catalog import RunCatalog, RunNotFoundError
from hvdprof.dashboard.live import ChangeFeed, RunWatcher
from hvdprof.dashboard.paths import OutsideRootError
from hvdprof.dashboard.routes import analyses, compare, docs, live, page, runs, timeline
from hvdprof.dashboard.settings import (
    TOKEN_HEADER,
    TOKEN_QUERY,
    DashboardSettings,
    is_loopback,
)

#: Cookie that carries the token once a page was opened with ``?token=``.
TOKEN_COOKIE = "hvdprof_token"

_DESCRIPTION = """\
The JSON API behind hvdprof's dashboard. Every analysis is one call into
`hvdprof.analysis`, returned as its `to_dict()` in `data`, with `notices` saying what
could not be shown (a run still being written, a truncated file). Runs are named by their
path relative to the served directory (`/api/runs`). `/api/events` streams live changes.
When the server was started with `--token`, send it as the `X-Hvdprof-Token` header or the
`token` query parameter on every request.
"""


class TokenCheck:
    """ASGI middleware: every HTTP request must carry the token (header, query or the
    cookie set when it came as a query parameter)."""

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self.token = token.encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        given = headers.get(TOKEN_HEADER.lower().encode())
        from_query = False
        if given is None:
            values = parse_qs(scope.get("query_string", b"").decode("latin-1")).get(TOKEN_QUERY)
            given, from_query = (values[0].encode(), True) if values else (b"", False)
        if not given:
            given = _cookie(headers.get(b"cookie", b""), TOKEN_COOKIE.encode())
        if not hmac.compare_digest(given, self.token):
            response = JSONResponse(
                {"detail": f"missing or wrong token: pass ?{TOKEN_QUERY}=... or {TOKEN_HEADER}"},
                status_code=401,
            )
            await response(scope, receive, send)
            return
        if not from_query:
            await self.app(scope, receive, send)
            return

        async def send_with_cookie(message: dict[str, Any]) -> None:
            # /docs fetches /openapi.json by itself: a cookie carries the token there.
            if message["type"] == "http.response.start":
                cookie = f"{TOKEN_COOKIE}={self.token.decode()}; Path=/; HttpOnly; SameSite=Strict"
                message["headers"] = [*message.get("headers", []), (b"set-cookie", cookie.encode())]
            await send(message)

        await self.app(scope, receive, send_with_cookie)


def _cookie(header: bytes, name: bytes) -> bytes:
    """The value of cookie ``name`` in a Cookie header, b"" when absent.

    Parsed by hand, not with ``http.cookies``: browsers send other local apps' cookies
    too, and SimpleCookie raises on names it deems illegal (``a@b=c``), which turned a
    valid token into an error.
    """
    for part in header.split(b";"):
        key, sep, value = part.strip().partition(b"=")
        if sep and key.strip() == name:
            return value.strip().strip(b'"')
    return b""


#: a Host header (or an Origin's netloc) as RFC 9110 allows it: a name, an IPv4 address or
#: a bracketed IPv6 one, then perhaps a port; nothing else (``localhost:80@evil.example``
#: is one of the forms a looser parse read as ``localhost``)
_HOST_RE = re.compile(r"(\[[0-9a-f:.]+\]|[a-z0-9._-]+)(:[0-9]{1,5})?")


def _host_name(value: str) -> str:
    """The host of a Host header or an Origin's netloc, without port or brackets; ``""``
    for anything that is not one host and port."""
    value = value.strip().lower()
    m = _HOST_RE.fullmatch(value)
    if m is None:
        return ""
    return m.group(1).strip("[]")


class HostCheck:
    """ASGI middleware against DNS rebinding: a server on loopback answers only requests
    addressed to a loopback name (or the name it was bound to), and any request carrying
    an ``Origin`` must come from that same host and port.

    Without it, a web page the user visits could point its own host name at 127.0.0.1
    and read ``/api/*`` (the served directory's absolute path, host names) in the
    default mode, which has no token.
    """

    def __init__(self, app: Any, bound_host: str) -> None:
        self.app = app
        # (a bound IPv6 address comes without brackets; "" is no host and never allowed)
        self.allowed = {"localhost", "127.0.0.1", "::1", bound_host.strip().strip("[]").lower()}
        self.allowed.discard("")

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw = scope.get("headers") or []
        headers = dict(raw)
        host = headers.get(b"host", b"").decode("latin-1")
        problem = None
        hosts = sum(1 for name, _ in raw if name == b"host")
        if hosts > 1 or sum(1 for name, _ in raw if name == b"origin") > 1:
            what = "Host" if hosts > 1 else "Origin"
            problem = f"more than one {what} header: which one is meant cannot be told"
        elif _host_name(host) not in self.allowed:
            problem = (
                f"host {host!r} is not this dashboard's (it answers on "
                f"{', '.join(sorted(self.allowed))}: a guard against DNS rebinding)"
            )
        origin = headers.get(b"origin")
        if problem is None and origin is not None and origin != b"null":
            netloc = origin.decode("latin-1").partition("://")[2]
            if netloc.lower() != host.lower():
                problem = f"requests from {origin.decode('latin-1')!r} are refused (another origin)"
        if problem is not None:
            await JSONResponse({"detail": problem}, status_code=403)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _preload_first_run(catalog: RunCatalog) -> None:
    with contextlib.suppress(Exception):  # a run that cannot be read is reported on request
        entries = catalog.entries()
        if entries:
            catalog.loaded(entries[0].id)


def create_app(settings: DashboardSettings, *, catalog: RunCatalog | None = None) -> FastAPI:
    """The dashboard app serving ``settings.root`` (``catalog``: one made for that root,
    perhaps already reading its first run; see :func:`~hvdprof.dashboard.server.serve`)."""
    catalog = catalog if catalog is not None else RunCatalog(settings.root)
    feed = ChangeFeed()
    watcher = RunWatcher(catalog, feed, settings.watch_interval_s)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        task = asyncio.create_task(watcher.run_forever())
        # Read the run the page opens first while the browser is still starting (a daemon
        # thread: stopping the server never waits for a large run to finish loading).
        threading.Thread(
            target=_preload_first_run, args=(catalog,), name="hvdprof-preload", daemon=True
        ).start()
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    app = FastAPI(
        title="hvdprof dashboard",
        version=__version__,
        description=_DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,  # routes.docs serves /docs with Swagger UI from a package, not a CDN
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.catalog = catalog
    app.state.feed = feed
    app.state.watcher = watcher
    for module in (runs, timeline, analyses, compare, live, docs, page):
        app.include_router(module.router)

    @app.exception_handler(OutsideRootError)
    async def outside_root(_request: Request, exc: OutsideRootError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=403)

    @app.exception_handler(RunNotFoundError)
    async def run_not_found(_request: Request, exc: RunNotFoundError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=404)

    @app.exception_handler(Exception)
    async def unexpected(_request: Request, exc: Exception) -> JSONResponse:
        # A bug must not look like a crash to the page: it gets a message it can show.
        return JSONResponse(
            {"detail": f"the dashboard could not answer: {type(exc).__name__}: {exc}"},
            status_code=503,
        )

    if settings.token is not None:
        app.add_middleware(TokenCheck, token=settings.token)
    if is_loopback(settings.host):  # elsewhere the token guards: it is not in a rebound page
        app.add_middleware(HostCheck, bound_host=settings.host)
    return app
