"""Putting every rank's timeline on rank 0's clock.

Each rank stamps its events with its own ``perf_counter_ns``; on different hosts those
clocks share neither origin nor rate, so per-rank timelines would not line up. The runtime
measures the offset to rank 0 with NTP-style ping-pongs and hands the samples to
:func:`estimate_offset`, a pure function. The sink reads the current estimate from a shared
:class:`ClockCorrection` that the runtime updates as it re-estimates, and writes every
timestamp as ``(t_local + offset - origin) / 1000`` microseconds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

#: Estimates kept in :attr:`ClockCorrection.history` (for the manifest).
HISTORY_LENGTH = 64


@dataclass(frozen=True, slots=True)
class ClockOffset:
    """How far rank 0's clock is ahead of ours: ``t_rank0 = t_local + offset_ns``.

    ``error_ns`` bounds ``|true offset - offset_ns|`` under the only assumption NTP makes:
    the reply was produced somewhere between our send and our receive.
    """

    offset_ns: int
    error_ns: int
    rtt_ns: int = 0
    samples: int = 0


ZERO_OFFSET = ClockOffset(0, 0, 0, 0)


def estimate_offset(samples: Iterable[tuple[int, int, int]]) -> ClockOffset:
    """Offset to the remote clock from ping-pong samples ``(t_send, t_remote, t_recv)``.

    ``t_send``/``t_recv`` are local clock readings around one round trip and ``t_remote``
    the remote clock when it answered. The sample with the smallest round trip is the one
    least disturbed by scheduling and queueing, so it alone gives the estimate (as NTP's
    clock filter does): the remote reading is assumed to be taken at the midpoint, which is
    wrong by at most half the round trip, hence ``error_ns = rtt // 2``. Samples whose
    receive precedes their send are impossible and ignored.

    Raises ``ValueError`` when no usable sample is given.
    """
    best: tuple[int, int, int] | None = None
    best_rtt = 0
    count = 0
    for t_send, t_remote, t_recv in samples:
        rtt = t_recv - t_send
        if rtt < 0:
            continue
        count += 1
        if best is None or rtt < best_rtt:
            best, best_rtt = (t_send, t_remote, t_recv), rtt
    if best is None:
        raise ValueError("estimate_offset needs at least one sample with t_recv >= t_send")
    t_send, t_remote, t_recv = best
    # offset = t_remote - midpoint, computed without losing the half nanosecond twice.
    offset = (2 * t_remote - t_send - t_recv) // 2
    return ClockOffset(
        offset_ns=offset, error_ns=(best_rtt + 1) // 2, rtt_ns=best_rtt, samples=count
    )


def skewed_clock(
    skew_us: float, base: Callable[[], int] = time.perf_counter_ns
) -> Callable[[], int]:
    """A clock reading ``base() + skew_us`` microseconds: the HVDPROF_CLOCK_SKEW_US test aid.

    The runtime stamps records and answers clock ping-pongs with this clock, so a skewed
    rank looks like a rank on another host; the estimated offset must then cancel the skew.
    With no skew it returns ``base`` itself, costing nothing.
    """
    skew_ns = round(skew_us * 1000)
    if skew_ns == 0:
        return base

    def now_ns() -> int:
        return base() + skew_ns

    return now_ns


def apply_skew(t_ns: int, skew_us: float) -> int:
    """``t_ns`` shifted by ``skew_us`` microseconds (what :func:`skewed_clock` adds)."""
    return t_ns + round(skew_us * 1000)


class ClockCorrection:
    """The live mapping from this rank's clock to the timeline clock, shared with the runtime.

    ``origin_ns`` is a fixed instant on rank 0's clock that becomes timestamp 0 (the runtime
    can broadcast rank 0's start time; 0 keeps raw rank-0 ``perf_counter`` microseconds).
    ``now_ns`` is this rank's clock as the runtime reads it (skewed in tests). The offset
    changes with :meth:`update`; readers see either the old or the new estimate, never a
    mix, because the estimate is one immutable object swapped by a single assignment.
    """

    def __init__(
        self,
        offset: ClockOffset = ZERO_OFFSET,
        *,
        origin_ns: int = 0,
        now_ns: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        self.origin_ns = int(origin_ns)
        self.now_ns = now_ns
        self._current = offset
        self._lock = threading.Lock()
        self._history: list[tuple[int, ClockOffset]] = [(now_ns(), offset)]
        self.version = 0

    @property
    def current(self) -> ClockOffset:
        """The latest estimate."""
        return self._current

    @property
    def offset_ns(self) -> int:
        return self._current.offset_ns

    @property
    def error_ns(self) -> int:
        return self._current.error_ns

    @property
    def shift_ns(self) -> int:
        """What to add to a local timestamp to get timeline nanoseconds."""
        return self._current.offset_ns - self.origin_ns

    def update(self, offset: ClockOffset) -> None:
        """Install a new estimate (called by the runtime after each re-estimation)."""
        with self._lock:
            self._current = offset
            self._history.append((self.now_ns(), offset))
            del self._history[:-HISTORY_LENGTH]
            self.version += 1

    def history(self) -> list[tuple[int, ClockOffset]]:
        """``(local time of the update, estimate)`` pairs, oldest first."""
        with self._lock:
            return list(self._history)

    def to_timeline_ns(self, t_local_ns: int) -> int:
        return t_local_ns + self._current.offset_ns - self.origin_ns
