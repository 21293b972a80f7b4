"""The live watcher: notices that a run on disk grew and tells every open page.

Clients never poll whole files. The server ``stat``s the files of the runs pages have
opened (cheap: a few syscalls every ``watch_interval_s``), lets the analysis library
re-read only the appended bytes (:meth:`Run.refresh`), and pushes a small ``changed``
event (run id and version) over server-sent events; the page then re-queries just the
window it shows. New runs appearing under the root produce a ``runs`` event. While a
page watches a run that is still recording, the watcher touches the run's live mark
(:func:`hvdprof.timeline.manifest.request_live`): only then do the ranks' renderers render
beside the training, instead of at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from hvdprof.dashboard.catalog import RunCatalog
from hvdprof.timeline.manifest import request_live

#: Seconds between two scans of the root for new runs (a directory walk, not a stat).
RESCAN_INTERVAL_S = 1.0


class ChangeFeed:
    """Fan-out of change events to every connected page (one queue per subscriber)."""

    def __init__(self) -> None:
        self._subscribers: set[asyncio.Queue[dict[str, Any]]] = set()
        #: set when the server stops: open streams end by themselves (within a wake-up),
        #: so the server's graceful shutdown never has to cancel one
        self.closed = False

    def close(self) -> None:
        self.closed = True

    def subscribe(self) -> asyncio.Queue[dict[str, Any]]:
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=256)
        self._subscribers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[dict[str, Any]]) -> None:
        self._subscribers.discard(queue)

    def publish(self, event: dict[str, Any]) -> None:
        for queue in list(self._subscribers):
            with contextlib.suppress(asyncio.QueueFull):  # a stuck page misses events, not memory
                queue.put_nowait(event)

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)


class RunWatcher:
    """Background task: refresh loaded runs whose files changed, publish what changed."""

    def __init__(self, catalog: RunCatalog, feed: ChangeFeed, interval_s: float) -> None:
        self.catalog = catalog
        self.feed = feed
        self.interval_s = interval_s
        self._run_ids: tuple[str, ...] | None = None
        self._last_rescan = 0.0

    async def run_forever(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:  # the watcher must outlive any one bad file
                continue

    async def tick(self) -> None:
        for loaded in self.catalog.cached():
            if loaded.entry.kind == "directory" and not all(
                (getattr(loaded.run, "complete", None) or {0: False}).values()
            ):
                # still recording: its renderers keep the files current while we watch
                request_live(str(loaded.entry.path))
            grew = await asyncio.to_thread(self.catalog.refresh, loaded)
            if grew:
                self.feed.publish(
                    {
                        "kind": "changed",
                        "run": loaded.entry.id,
                        "version": loaded.version,
                        "at": time.time(),
                    }
                )
        now = time.monotonic()
        if now - self._last_rescan >= RESCAN_INTERVAL_S:
            self._last_rescan = now
            ids = tuple(e.id for e in await asyncio.to_thread(self.catalog.entries))
            if self._run_ids is not None and ids != self._run_ids:
                self.feed.publish({"kind": "runs", "runs": list(ids), "at": time.time()})
            self._run_ids = ids
