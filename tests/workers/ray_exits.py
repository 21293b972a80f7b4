"""What a ``RayExecutor`` runs in tests/test_hostile_input_3.py (issue 48, item 7): a rank
that ends its own process, and a rank that comes to ``hvd.init()`` too late."""

from __future__ import annotations

import os
import time


def exit_on(rank: int, code: int) -> int:
    """Rank ``rank`` ends its process with ``os._exit(code)`` (no cleanup, no exception);
    the others return their rank."""
    me = int(os.environ["HVDPROF_RANK"])
    if me == rank:
        time.sleep(0.5)
        os._exit(code)
    time.sleep(3)
    return me


def init_late(rank: int, late_s: float) -> int:
    """Every rank calls ``hvd.init()``; rank ``rank`` only after ``late_s`` seconds."""
    import hvdprof.torch as hvd

    if int(os.environ["HVDPROF_RANK"]) == rank:
        time.sleep(late_s)
    hvd.init()
    try:
        return hvd.rank()
    finally:
        hvd.shutdown()
