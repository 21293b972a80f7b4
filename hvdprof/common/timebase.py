"""The one clock every runtime timestamp is read from.

Normally ``time.perf_counter_ns`` itself. HVDPROF_CLOCK_SKEW_US shifts it, to make one
rank look like a rank on another host and prove that the timeline's clock-offset
correction undoes the difference.
"""

from __future__ import annotations

import time
from collections.abc import Callable

now_ns: Callable[[], int] = time.perf_counter_ns


def set_skew_us(skew_us: float) -> None:
    global now_ns
    skew_ns = round(skew_us * 1000)
    if skew_ns == 0:
        now_ns = time.perf_counter_ns
        return

    def skewed() -> int:
        return time.perf_counter_ns() + skew_ns

    now_ns = skewed
