"""A rank of a tree of control messages dies; the others must fail on their own, promptly.

``tree_failure_worker.py VICTIM STEP``: every rank runs steps of two allreduces, new
names for the first three steps (the coordinator's path: requests merged up the tree)
and cached names after; rank VICTIM SIGKILLs itself at step STEP (0: before its first
op, while the others negotiate new names; later: on the cache's path). A survivor
prints ``RAISED <message>`` and exits with SURVIVOR_EXIT (ranks are started directly,
with no launcher to stop them).
"""

from __future__ import annotations

import os
import signal
import sys

import _common

_common.start_watchdog()

import torch  # noqa: E402

import hvdprof.torch as hvd  # noqa: E402
from hvdprof.errors import HvdprofInternalError  # noqa: E402

SURVIVOR_EXIT = 17
VICTIM, STEP = int(sys.argv[1]), int(sys.argv[2])

hvd.init()
R, N = hvd.rank(), hvd.size()
x = torch.ones(8)
try:
    for step in range(100_000):
        if R == VICTIM and step == STEP:
            os.kill(os.getpid(), signal.SIGKILL)
        tag = f"new.{step}" if step < 3 else "cached"
        handles = [hvd.allreduce_async(x, op=hvd.Sum, name=f"{tag}.{i}") for i in range(2)]
        for handle in handles:
            out = hvd.synchronize(handle)
            if out[0].item() != N:
                raise AssertionError(f"rank {R}: allreduce gave {out[0].item()}, expected {N}")
except HvdprofInternalError as exc:
    print(f"RAISED {' '.join(str(exc).split())}", flush=True)
    hvd.shutdown()
    os._exit(SURVIVOR_EXIT)
print(f"rank {R}: the loop ended without an error", flush=True)
sys.exit(1)
