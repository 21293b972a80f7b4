"""The stall inspector, from the ranks' side.

``stall_worker.py warn [LATE]``: rank LATE (default: the last) is a few seconds late to
submit a new tensor name, then a name already in the response cache. Rank 0 must log a
warning naming the late rank and each tensor (the test reads rank 0's stderr), and the
job must go on once the late rank submits.

``stall_worker.py abort``: the last rank submits a different tensor from the others, so
both wait forever; with HVDPROF_STALL_SHUTDOWN_TIME_SECONDS set, every rank prints the
stall line and exits instead of hanging (under ``hvdprof run``; elsewhere a wait raises
StallAbortError, checked here should the rank get there first). The last rank
polls its handle instead of blocking in synchronize (as a rank that keeps computing
would), so this is a stall the deadlock detection cannot prove (see test_deadlock.py).
"""

from __future__ import annotations

import sys
import time

import _common

_common.start_watchdog()

import torch  # noqa: E402

import hvdprof.torch as hvd  # noqa: E402
from hvdprof.errors import HvdprofInternalError, StallAbortError  # noqa: E402

hvd.init()
R, N = hvd.rank(), hvd.size()
ck = _common.Checks(R)
LATE = int(sys.argv[2]) if len(sys.argv) > 2 else N - 1
DELAY_S = 4.5


def late_allreduce(name: str) -> None:
    if R == LATE:
        time.sleep(DELAY_S)
    out = hvd.allreduce(torch.ones(3), op=hvd.Sum, name=name)
    ck.tensor(out, torch.full((3,), float(N)), f"{name} completes once the late rank submits")


def warn() -> None:
    with ck.section("stall_new_name"):
        late_allreduce("stall.fresh")
    with ck.section("stall_cached_name"):
        out = hvd.allreduce(torch.ones(3), op=hvd.Sum, name="stall.cached")
        ck.tensor(out, torch.full((3,), float(N)), "first use of stall.cached")
        hvd.barrier()
        late_allreduce("stall.cached")
        ck.true(hvd.runtime_stats()["cache_hits"] > 0, "the second stall.cached hit the cache")
    with ck.section("after_stall"):
        for i in range(5):
            out = hvd.allreduce(torch.full((2,), float(i)), op=hvd.Sum)
            ck.tensor(out, torch.full((2,), float(i * N)), "the job goes on")


def abort() -> None:
    with ck.section("stall_abort"):
        out = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="before")
        ck.tensor(out, torch.full((2,), float(N)), "before the stall")
        name = "stall.other" if R == LATE else "stall.never"
        started = time.monotonic()

        def submit_and_wait() -> object:
            handle = hvd.allreduce_async(torch.ones(2), name=name)
            while R == LATE and not hvd.poll(handle):  # busy, never blocked in a wait
                time.sleep(0.01)
            return hvd.synchronize(handle)

        exc = ck.raises(StallAbortError, submit_and_wait)
        print(f"ABORTED_AFTER {time.monotonic() - started:.2f}", flush=True)
        if exc is not None:
            text = str(exc)
            ck.true(isinstance(exc, HvdprofInternalError), "StallAbortError is internal error")
            ck.true(isinstance(exc, hvd.HorovodInternalError), "... i.e. HorovodInternalError")
            ck.true("HVDPROF_STALL_SHUTDOWN_TIME_SECONDS" in text, f"names the setting: {text}")
            ck.true(
                f"rank {LATE} has not submitted 'stall.never'" in text,
                f"names the late rank: {text}",
            )
            ck.true("stall.never" in text, f"names the tensor: {text}")
        # the runtime stays failed: further ops raise at once instead of hanging
        ck.raises(HvdprofInternalError, lambda: hvd.allreduce(torch.ones(2), name="after"))


if __name__ == "__main__":
    {"warn": warn, "abort": abort}[sys.argv[1]]()
    ck.done()
