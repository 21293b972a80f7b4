"""The bounded queue between the cycle thread and whatever ships events out.

Bounded in events, not items (one cycle can carry thousands), and it never blocks the
producer: when full, an item is dropped and counted. The in-process writer and the feeder
to the renderer process share it.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any


class EventQueue:
    def __init__(self, capacity: int, batch_events: int) -> None:
        self.capacity = max(1, int(capacity))
        #: pending events that wake the consumer before its flush interval
        self.batch_events = max(1, min(batch_events, self.capacity))
        self.wake = threading.Event()
        self.lock = threading.Lock()  # guards the counters and ``closed``
        self.closed = False
        self.dropped_events = 0
        self.dropped_items = 0
        self._items: deque[tuple[Any, int]] = deque()
        self._put_weight = 0
        self._taken_weight = 0

    def put(self, item: Any, weight: int = 1) -> bool:
        """Queue ``item`` (``weight`` events); False when it was dropped. Never blocks."""
        with self.lock:
            pending = self._put_weight - self._taken_weight
            # An item larger than the whole queue is still taken when the queue is empty:
            # otherwise a big enough cycle could never be recorded.
            if self.closed or (pending and pending + weight > self.capacity):
                self.dropped_events += weight
                self.dropped_items += 1
                return False
            self._items.append((item, weight))
            self._put_weight += weight
            wake = self._put_weight - self._taken_weight >= self.batch_events
        if wake and not self.wake.is_set():
            self.wake.set()
        return True

    def __len__(self) -> int:
        """Items queued now (a consumer takes only these, so that it cannot chase
        producers past a close while it yields the GIL)."""
        return len(self._items)

    def take(self) -> tuple[Any, int]:
        """The oldest ``(item, weight)``; call at most ``len(queue)`` times."""
        item, weight = self._items.popleft()
        with self.lock:
            self._taken_weight += weight
        return item, weight

    def count_dropped(self, events: int, items: int = 1) -> None:
        with self.lock:
            self.dropped_events += events
            self.dropped_items += items

    def drops(self) -> tuple[int, int]:
        with self.lock:
            return self.dropped_events, self.dropped_items

    def close(self) -> bool:
        """Refuse further puts; True the first time only."""
        with self.lock:
            if self.closed:
                return False
            self.closed = True
            return True

    @property
    def pending(self) -> int:
        """Events queued and not yet taken."""
        return self._put_weight - self._taken_weight
