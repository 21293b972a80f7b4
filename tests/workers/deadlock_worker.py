"""Ranks that diverge (a deadlock) against a rank that is only slow.

``deadlock_worker.py diverge``: rank 0 allreduces 'dl.a' while every other rank
allgathers 'dl.b': every rank is blocked on a name the others never submit. Every rank
must raise StallAbortError naming the deadlock, each rank and the name it waits on, then
the runtime stays failed; ``shutdown(); init()`` starts a working runtime again (what
Horovod's test suite does after a failed test). Prints ``DEADLOCK_AFTER <seconds>``.

``deadlock_worker.py cached``: the same on the response cache's path: both names were
negotiated together first, then rank 0 allreduces 'dl.x' and the others 'dl.y'.

``deadlock_worker.py join``: rank 0 calls join() while ranks 1 and 2 allreduce different
names: ranks 1 and 2 deadlock (rank 0 waits in join, which the message says); every
rank, the joined one included, must raise.

``deadlock_worker.py slow``: the last rank sleeps longer than the stall check time before
submitting (it computes: nothing of it is blocked). That is not a deadlock: the others
wait, rank 0 logs the stall warning, and the op completes on every rank.

Run with HVDPROF_STALL_SHUTDOWN_TIME_SECONDS unset (never abort), so a deadlock that is
not detected hangs until the watchdog ends the worker.
"""

from __future__ import annotations

import os
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
CHECK_S = float(os.environ["HVDPROF_STALL_CHECK_TIME_SECONDS"])


def expect_deadlock(op, *contains: str) -> None:
    started = time.monotonic()
    exc = ck.raises(StallAbortError, op, "hvdprof deadlock", f"(rank {R})", *contains)
    print(f"DEADLOCK_AFTER {time.monotonic() - started:.2f}", flush=True)
    if exc is not None:
        print(f"MESSAGE {exc}", flush=True)
        ck.true(isinstance(exc, HvdprofInternalError), "a deadlock is an internal error")
    # the runtime stays failed: further ops raise at once instead of hanging
    ck.raises(HvdprofInternalError, lambda: hvd.allreduce(torch.ones(2), name="dl.after"))


def recover() -> None:
    with ck.section("recover"):
        hvd.shutdown()
        hvd.init()
        out = hvd.allreduce(torch.ones(3), op=hvd.Sum, name="dl.again")
        ck.tensor(out, torch.full((3,), float(N)), "a new runtime works after the deadlock")


def diverge() -> None:
    with ck.section("diverge"):
        out = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="dl.before")
        ck.tensor(out, torch.full((2,), float(N)), "before the divergence")
        others = ", ".join(str(r) for r in range(1, N))
        if R == 0:
            expect_deadlock(
                lambda: hvd.allreduce(torch.ones(2), name="dl.a"),
                f"rank 0 waits on allreduce 'dl.a' (not submitted by rank(s) [{others}])",
                "rank 1 waits on allgather 'dl.b' (not submitted by rank(s) [0])",
            )
        else:
            expect_deadlock(
                lambda: hvd.allgather(torch.ones(2, 2), name="dl.b"),
                "rank 0 waits on allreduce 'dl.a'",
                f"rank {R} waits on allgather 'dl.b' (not submitted by rank(s) [0])",
            )
    recover()


def cached() -> None:
    with ck.section("cached"):
        for _ in range(2):  # negotiated once, then served by the response cache
            for name in ("dl.x", "dl.y"):
                out = hvd.allreduce(torch.ones(2), op=hvd.Sum, name=name)
                ck.tensor(out, torch.full((2,), float(N)), f"{name} together")
        ck.true(hvd.runtime_stats()["cache_hits"] >= 2, "both names are cached")
        name = "dl.x" if R == 0 else "dl.y"
        expect_deadlock(
            lambda: hvd.allreduce(torch.ones(2), name=name),
            f"rank {R} waits on allreduce {name!r}",
        )
    recover()


def join() -> None:
    with ck.section("join"):
        if R == 0:
            expect_deadlock(hvd.join, "rank 0 has called join()")
        else:
            name = f"dl.join.{R}"
            expect_deadlock(
                lambda: hvd.allreduce(torch.ones(2), name=name),
                f"rank {R} waits on allreduce {name!r}",
            )


def slow() -> None:
    with ck.section("slow"):
        if R == N - 1:
            time.sleep(CHECK_S + 4)  # computing, longer than the stall check time
        out = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="dl.slow")
        ck.tensor(out, torch.full((2,), float(N)), "the slow rank is waited for")
        out = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="dl.after.slow")
        ck.tensor(out, torch.full((2,), float(N)), "the job goes on")


if __name__ == "__main__":
    {"diverge": diverge, "cached": cached, "join": join, "slow": slow}[sys.argv[1]]()
    ck.done()
