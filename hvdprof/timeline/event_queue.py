"""The bounded queue between the cycle thread and whatever ships events out.

Bounded in events, not items (one cycle can carry thousands). When full, the producer
waits for the consumer (``wait_when_full``, the default: lossless, the job slows down
instead), unless the consumer took nothing for ``stuck_s``; otherwise, or with waiting
off, the item is dropped and counted.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any


class EventQueue:
    def __init__(
        self,
        capacity: int,
        batch_events: int,
        wait_when_full: bool = True,
        stuck_s: float = 2.0,
    ) -> None:
        self.capacity = max(1, int(capacity))
        self.wait_when_full = wait_when_full
        #: a consumer that takes nothing for this long is stuck: waiting producers drop
        self.stuck_s = stuck_s
        #: seconds producers spent waiting for room
        self.waited_s = 0.0
        #: pending events that wake the consumer before its flush interval
        self.batch_events = max(1, min(batch_events, self.capacity))
        self.wake = threading.Event()
        self.lock = threading.Lock()  # guards the counters and ``closed``
        self._room = threading.Condition(self.lock)
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
            if pending and pending + weight > self.capacity and self.wait_when_full:
                self._wait_for_room_locked(weight)
                pending = self._put_weight - self._taken_weight
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

    def _wait_for_room_locked(self, weight: int) -> None:
        started = time.monotonic()
        progress_at, taken = started, self._taken_weight
        self.wake.set()
        while not self.closed:
            pending = self._put_weight - self._taken_weight
            if not pending or pending + weight <= self.capacity:
                break
            self._room.wait(0.05)
            now = time.monotonic()
            if self._taken_weight != taken:
                progress_at, taken = now, self._taken_weight
            elif now - progress_at > self.stuck_s:
                break
        self.waited_s += time.monotonic() - started

    def __len__(self) -> int:
        """Items queued now (a consumer takes only these, so that it cannot chase
        producers past a close while it yields the GIL)."""
        return len(self._items)

    def take(self) -> tuple[Any, int]:
        """The oldest ``(item, weight)``; call at most ``len(queue)`` times."""
        item, weight = self._items.popleft()
        with self.lock:
            self._taken_weight += weight
            self._room.notify_all()
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
            self._room.notify_all()
            return True

    @property
    def pending(self) -> int:
        """Events queued and not yet taken."""
        return self._put_weight - self._taken_weight
