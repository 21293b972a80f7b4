"""Running the dashboard: in the foreground (``hvdprof dashboard``) or beside a job.

The listening socket is bound here, before uvicorn starts, so a busy port is a one-line
error instead of a log dump, and port 0 (any free port) reports the port it got.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import webbrowser
from typing import TYPE_CHECKING

from hvdprof.dashboard.settings import DashboardSettings
from hvdprof.errors import HvdprofError

if TYPE_CHECKING:
    import uvicorn

    from hvdprof.dashboard.catalog import RunCatalog

# uvicorn and the app (FastAPI, pydantic: about 0.3 s of imports) are imported where the
# server is built, so ``hvdprof dashboard`` can bind its port and start reading the run
# first (:func:`start_reading`) and the two overlap.

#: Seconds open SSE streams get to close when the server stops.
GRACEFUL_SHUTDOWN_S = 1


def bind(settings: DashboardSettings) -> socket.socket:
    """A listening socket on the settings' address; HvdprofError naming it when taken."""
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio turns Nagle off (TCP_NODELAY) only on sockets whose
    # proto says TCP, and the accepted sockets inherit the listener's proto. With Nagle
    # on, every response after the first on a kept-alive connection waited ~40 ms for
    # the client's delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((settings.host.strip("[]"), settings.port))
    except OSError as exc:
        sock.close()
        raise HvdprofError(
            f"dashboard: cannot listen on {settings.host}:{settings.port}: {exc.strerror} "
            "(choose another --port)"
        ) from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def start_reading(settings: DashboardSettings) -> RunCatalog:
    """The catalog of ``settings.root`` with its first run already being read (worker
    processes forked now, before the web stack is imported and any thread started)."""
    from hvdprof.dashboard.catalog import RunCatalog

    catalog = RunCatalog(settings.root)
    catalog.start_reading()
    return catalog


def _server(settings: DashboardSettings, catalog: RunCatalog | None = None) -> uvicorn.Server:
    import uvicorn

    from hvdprof.dashboard.app import create_app

    app = create_app(settings, catalog=catalog)

    class DashboardServer(uvicorn.Server):
        """Ends the live streams first when it stops, however it was told to (Ctrl+C in
        the foreground, or ``should_exit`` from ``run --dashboard``'s thread): an open
        stream left to the graceful-shutdown timeout is cancelled with a traceback."""

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            app.state.feed.close()
            await super().shutdown(sockets=sockets)

    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        lifespan="on",
    )
    return DashboardServer(config)


def serve(
    settings: DashboardSettings,
    *,
    open_browser: bool = True,
    sock: socket.socket | None = None,
    catalog: RunCatalog | None = None,
) -> int:
    """Serve until Ctrl+C; prints the URL first (and opens it unless told not to).

    ``sock``: a socket :func:`bind` already opened; ``catalog``: from
    :func:`start_reading`, whose first run is then already being read."""
    if sock is None:
        sock = bind(settings)
    url = settings.url(sock.getsockname()[1])
    print(f"hvdprof dashboard: serving {settings.root} at {url} (Ctrl+C to stop)", flush=True)
    if open_browser:
        with contextlib.suppress(Exception):
            webbrowser.open(url)
    server = _server(settings, catalog)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    return 0


class DashboardThread:
    """The dashboard in a daemon thread of this process (``hvdprof run --dashboard``)."""

    def __init__(self, settings: DashboardSettings) -> None:
        self._sock = bind(settings)
        self.port = self._sock.getsockname()[1]
        self.url = settings.url(self.port)
        self._server = _server(settings)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, name="hvdprof-dashboard",
            daemon=True,
        )  # fmt: skip

    def start(self, wait_s: float = 10.0) -> DashboardThread:
        self._thread.start()
        deadline = time.monotonic() + wait_s
        while not self._server.started and time.monotonic() < deadline:
            if not self._thread.is_alive():
                raise HvdprofError("dashboard: the server stopped while starting")
            time.sleep(0.02)
        return self

    def stop(self, wait_s: float = 5.0) -> None:
        self._server.should_exit = True
        self._thread.join(wait_s)
        self._sock.close()
