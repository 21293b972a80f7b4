"""What one dashboard server serves and how: read once, handed to routes by injection.

The settings object is built by the CLI (or a test) and stored on the app; routes receive
it through ``routes.deps.get_settings`` so nothing reads globals or the environment per
request. This module imports no web framework, so the CLI can use its defaults cheaply.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path

from hvdprof.errors import ConfigError

#: Default port of ``hvdprof dashboard`` (Dash/Plotly's usual one).
DEFAULT_PORT = 8050
#: Default address: loopback only, so nothing is exposed without asking.
DEFAULT_HOST = "127.0.0.1"
#: Seconds between two stat passes of the live watcher (the page updates within 2 s).
DEFAULT_WATCH_INTERVAL_S = 0.25
#: Header that carries the access token (``?token=`` works too, for EventSource and links).
TOKEN_HEADER = "X-Hvdprof-Token"
#: Query parameter that carries the access token.
TOKEN_QUERY = "token"


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (127.0.0.0/8, ::1, ``localhost``)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def web_directory() -> Path:
    """The static page: see :func:`hvdprof.dashboard.paths.web_directory`."""
    from hvdprof.dashboard.paths import web_directory as locate

    return locate()


@dataclass(frozen=True)
class DashboardSettings:
    """One server's configuration: the directory it may read, where it listens, its token."""

    root: Path
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    token: str | None = None
    watch_interval_s: float = DEFAULT_WATCH_INTERVAL_S
    web_dir: Path = field(default_factory=web_directory)

    def __post_init__(self) -> None:
        root = Path(os.path.abspath(self.root))
        if not root.is_dir():
            problem = "does not exist" if not root.exists() else "is not a directory"
            raise ConfigError(f"dashboard: {root} {problem}")
        object.__setattr__(self, "root", root.resolve())
        if self.token is not None and not self.token.strip():
            raise ConfigError("dashboard: --token must not be empty")
        if not is_loopback(self.host) and self.token is None:
            raise ConfigError(
                f"dashboard: refusing to listen on {self.host}, which other machines can reach, "
                "without --token (pass --token T, or keep the default --host 127.0.0.1)"
            )
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"dashboard: port {self.port} is not in 0..65535")

    def url(self, port: int | None = None) -> str:
        """The address to open in a browser, with the token when one is required."""
        host = (
            self.host
            if is_loopback(self.host) or self.host not in ("0.0.0.0", "::")
            else "127.0.0.1"
        )
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        url = f"http://{host}:{self.port if port is None else port}/"
        return f"{url}?{TOKEN_QUERY}={self.token}" if self.token else url
