"""Ranks that die or leave, from the survivors' side.

``failure_worker.py kill VICTIM STAMP_FILE``: every rank runs allreduces in a loop; after
a while rank VICTIM writes the time to STAMP_FILE and SIGKILLs itself (``freeze``:
SIGSTOPs itself; the test kills it afterwards). A survivor must
get HvdprofInternalError (never hang): it prints ``RAISED <unix time> <message>``,
checks that the runtime stays failed, and exits with SURVIVOR_EXIT.

``failure_worker.py shutdown``: rank 0 calls shutdown() while the other ranks still have
an op pending; they must get HvdprofInternalError naming the shutdown, not hang.
Prints ``SECTION ...`` lines and ``DONE``.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import _common

_common.start_watchdog()

import torch  # noqa: E402

import hvdprof.torch as hvd  # noqa: E402
from hvdprof.errors import HvdprofInternalError, NotInitializedError  # noqa: E402

SURVIVOR_EXIT = 17
KILL_AT_STEP = 30

hvd.init()
R, N = hvd.rank(), hvd.size()
ck = _common.Checks(R)


def kill(victim: int, stamp: Path, signum: int = signal.SIGKILL) -> None:
    x = torch.ones(1000)
    step = 0
    try:
        while step < 100_000:
            if victim == R and step == KILL_AT_STEP:
                tmp = stamp.with_suffix(".tmp")
                tmp.write_text(repr(time.time()))
                tmp.rename(stamp)
                os.kill(os.getpid(), signum)
            out = hvd.allreduce(x, op=hvd.Sum, name="loop")
            if out[0].item() != N:
                raise AssertionError(f"rank {R}: allreduce gave {out[0].item()}, expected {N}")
            h = hvd.allreduce_async(x, op=hvd.Sum, name="loop.async")
            hvd.synchronize(h)
            step += 1
    except HvdprofInternalError as exc:
        raised = time.time()
        print(f"RAISED {raised!r} {type(exc).__name__}: {' '.join(str(exc).split())}", flush=True)
        # the runtime stays failed: the next op raises at once, shutdown does not hang
        try:
            hvd.allreduce(x, name="after")
        except HvdprofInternalError:
            print("STILL_FAILED", flush=True)
        hvd.shutdown()
        print("SHUTDOWN_RETURNED", flush=True)
        sys.stdout.flush()
        os._exit(SURVIVOR_EXIT)
    print(f"rank {R}: the loop ended without an error", flush=True)
    sys.exit(1)


def shutdown_while_pending() -> None:
    with ck.section("shutdown_while_pending"):
        out = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="together")
        ck.tensor(out, torch.full((2,), float(N)), "an op every rank runs")
        if R == 0:
            hvd.shutdown()
            ck.true(not hvd.is_initialized(), "rank 0 is shut down")
            ck.raises(NotInitializedError, lambda: hvd.allreduce(torch.ones(2)), "init")
        else:
            # only this rank submits it, so it can never complete: it must fail, at the
            # submission when this rank's cycle already saw rank 0's shutdown (a loaded
            # machine can run the cycle thread first), else when waited for
            exc = ck.raises(
                HvdprofInternalError,
                lambda: hvd.synchronize(hvd.allreduce_async(torch.ones(2), name="lonely")),
                "shut down",
            )
            if exc is not None:
                ck.true("rank 0" in str(exc), f"names the rank that shut down: {exc}")
            ck.raises(HvdprofInternalError, lambda: hvd.allreduce(torch.ones(2), name="next"))
            hvd.shutdown()  # returns, does not hang
            ck.true(not hvd.is_initialized(), "shut down afterwards")
    ck.done()


if __name__ == "__main__":
    if sys.argv[1] == "kill":
        kill(int(sys.argv[2]), Path(sys.argv[3]))
    elif sys.argv[1] == "freeze":
        kill(int(sys.argv[2]), Path(sys.argv[3]), signal.SIGSTOP)
    else:
        shutdown_while_pending()
