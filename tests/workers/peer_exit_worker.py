"""Rank 1 finishes and exits; rank 0 then calls ``init()`` again (Horovod's test files call
it at the start of every test). Usage: ``peer_exit_worker.py MARKER``."""

from __future__ import annotations

import os
import sys
import time

import _common

_common.start_watchdog()

import torch  # noqa: E402

import hvdprof.torch as hvd  # noqa: E402

MARKER = sys.argv[1]
hvd.init()
R = hvd.rank()
ck = _common.Checks(R)
with ck.section("peer_exit"):
    out = hvd.allreduce(torch.ones(3), op=hvd.Sum, name="first")
    ck.tensor(out, torch.full((3,), 2.0), "the first allreduce")
    if R == 1:
        open(MARKER, "w").close()
    else:
        deadline = time.monotonic() + 60
        while not os.path.exists(MARKER) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # rank 1 is on its way out
        ck.raises(
            hvd.HorovodInternalError, lambda: hvd.allreduce(torch.ones(3), name="late"), "rank 1"
        )
        hvd.init()  # idempotent: no new rendezvous with a rank that is gone
        ck.true(hvd.is_initialized(), "init() returned at once, the runtime still there")
        ck.raises(
            hvd.HorovodInternalError, lambda: hvd.allreduce(torch.ones(3), name="again"), "rank 1"
        )
        hvd.shutdown()
ck.done()
