"""``/api/events``: server-sent events telling pages that a run grew or runs appeared."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Annotated

import anyio
from fastapi import APIRouter, Depends, Request
from sse_starlette.sse import EventSourceResponse

from hvdprof.dashboard.live import ChangeFeed
from hvdprof.dashboard.routes.deps import get_feed

router = APIRouter(prefix="/api", tags=["live"])

#: Seconds between keep-alive comments, so proxies and browsers keep the stream open.
PING_S = 10
#: Longest a stream sleeps before checking for a disconnected client or a stopping server.
WAKE_S = 0.25


@router.get(
    "/events",
    summary="Live changes (text/event-stream)",
    description="Events `changed` ({run, version}) when a run's files grew and were re-read, "
    "and `runs` when runs appear or vanish under the served directory.",
)
async def events(
    request: Request, feed: Annotated[ChangeFeed, Depends(get_feed)]
) -> EventSourceResponse:
    queue = feed.subscribe()
    shutdown = anyio.Event()  # set by sse-starlette when the server stops

    async def stream() -> AsyncIterator[dict[str, str]]:
        try:
            yield {"event": "hello", "data": json.dumps({"kind": "hello"})}
            while not shutdown.is_set() and not feed.closed and not await request.is_disconnected():
                try:
                    event = await asyncio.wait_for(queue.get(), timeout=WAKE_S)
                except asyncio.TimeoutError:
                    continue
                yield {"event": event["kind"], "data": json.dumps(event)}
        finally:
            feed.unsubscribe(queue)

    try:  # end the stream cleanly on Ctrl+C (sse-starlette >= 3 tells the generator)
        return EventSourceResponse(
            stream(), ping=PING_S, shutdown_event=shutdown, shutdown_grace_period=WAKE_S * 2
        )
    except TypeError:
        return EventSourceResponse(stream(), ping=PING_S)
