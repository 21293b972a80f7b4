"""``init()`` after ``shutdown()``, in a loop, the way Horovod's own test suite runs.

``reinit_worker.py CYCLES``: every rank runs CYCLES times ``init(); allreduce; allgather;
broadcast; barrier(); shutdown()``. On every other cycle rank 0 lingers after the barrier
before shutting down, so the other ranks reach their next ``init()`` while rank 0's
previous incarnation is still alive: a rank that read that incarnation's address would
connect to a closed listener ("Connection refused"). Each cycle's results are checked; a
failed ``init()`` ends the loop (every later one would fail too) and is reported with the
cycle number. Prints ``SECTION reinit_loop ...`` and ``DONE``.
"""

from __future__ import annotations

import sys
import time

import _common

_common.start_watchdog()

import torch  # noqa: E402

import hvdprof.torch as hvd  # noqa: E402

CYCLES = int(sys.argv[1]) if len(sys.argv) > 1 else 50
LINGER_S = 0.05


def one_cycle(ck: _common.Checks, cycle: int) -> None:
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    ck.rank = rank
    out = hvd.allreduce(torch.full((4,), float(rank + cycle)), op=hvd.Sum, name="reinit.sum")
    expected = float(sum(r + cycle for r in range(size)))
    ck.tensor(out, torch.full((4,), expected), f"cycle {cycle}: allreduce")
    gathered = hvd.allgather(torch.full((rank + 1, 2), float(rank)), name="reinit.gather")
    want = torch.cat([torch.full((r + 1, 2), float(r)) for r in range(size)])
    ck.tensor(gathered, want, f"cycle {cycle}: allgather")
    root = cycle % size
    sent = hvd.broadcast(torch.full((3,), float(rank * 10 + cycle)), root, name="reinit.bcast")
    ck.tensor(sent, torch.full((3,), float(root * 10 + cycle)), f"cycle {cycle}: broadcast")
    hvd.barrier()
    if rank == 0 and cycle % 2:
        time.sleep(LINGER_S)  # the peers race ahead into their next init()
    hvd.shutdown()
    ck.true(not hvd.is_initialized(), f"cycle {cycle}: shut down")


def main() -> None:
    ck = _common.Checks()
    completed = 0
    with ck.section("reinit_loop"):
        for cycle in range(CYCLES):
            try:
                one_cycle(ck, cycle)
            except Exception as exc:
                ck.fail(f"cycle {cycle}", f"{type(exc).__name__}: {exc}")
                break
            completed += 1
        ck.eq(completed, CYCLES, "init/op/shutdown cycles completed")
    print(f"CYCLES_COMPLETED {completed}", flush=True)
    ck.done()


if __name__ == "__main__":
    main()
