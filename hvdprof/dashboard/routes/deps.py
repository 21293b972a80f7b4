"""Dependencies shared by the routers: the settings, catalog and change feed of this app."""

from __future__ import annotations

from fastapi import Request

from hvdprof.dashboard.catalog import RunCatalog
from hvdprof.dashboard.live import ChangeFeed
from hvdprof.dashboard.settings import DashboardSettings


def get_catalog(request: Request) -> RunCatalog:
    """The runs this app serves (built from the settings' root at start-up)."""
    return request.app.state.catalog


def get_feed(request: Request) -> ChangeFeed:
    """Where the live watcher publishes changes."""
    return request.app.state.feed


def get_settings(request: Request) -> DashboardSettings:
    """The settings of the app serving this request."""
    return request.app.state.settings
