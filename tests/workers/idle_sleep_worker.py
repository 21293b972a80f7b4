"""Idle ranks sleep on their sockets, and wake when any rank has work (see
``ControlChannel.sleep``). Run with ``HVDPROF_IDLE_SLEEP_MAX_SECONDS`` far above the job's
deadline, so that nothing but a wake-up can end a sleep.

Usage: idle_sleep_worker.py MODE FLAG_DIR. Modes:

* ``idle``: after one op, every rank idles a second: prints the cycles it took
  (``IDLE_CYCLES <n>``); then the ranks submit one at a time, each a while after the
  previous one, and the sums are checked.
* ``set``: ranks 1 and 2 reduce in a process set while rank 0 submits nothing: it waits
  for rank 1's flag file, written once the set's op completed. Only the wake-up carried
  from rank 1 to rank 0 can complete it (rank 0 is asleep, and its cycle must run).
* ``wait``: every rank but the last submits at once, the last a second later: each rank
  prints the cycles it took meanwhile (``WAIT_CYCLES <n>``); the waiting ranks, and the
  late one, sleep on their links instead of cycling every cycle time.
* ``kill``: after a second of idle, the last rank kills itself (SIGKILL); the others
  then submit and print the error they get (``ERROR <message>``).
* ``submit``: while every rank sleeps, each submits a small op and computes for half a
  second before it waits: prints the cycles that took (``SUBMIT_CYCLES <n>``: none unless
  ``HVDPROF_WAKE_ON_SUBMIT_BYTES=0``); the same with an op of 400 KB
  (``LARGE_SUBMIT_CYCLES <n>``: it runs at once); then an op waited on only by polling
  (``POLL_SECONDS <s>``), and one that rank 0 waits on while the last rank submits it
  late and computes on (``LATE_WAIT_SECONDS <s>`` on rank 0: the submission must wake
  it, not the last rank's own wait two seconds later).
* ``steps``: eight steps of a small op submitted at the start of a 0.1 s "backward pass"
  (a sleep) and waited on at its end, for a timeline to be read; prints the cycles the
  eight steps took (``STEP_CYCLES <n>``).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import _common
import torch

import hvdprof.torch as hvd


def cycles() -> int:
    return int(hvd.runtime_stats()["cycles"])


def idle(ck: _common.Checks, rank: int, size: int) -> None:
    hvd.allreduce(torch.ones(2), name="warm")
    before = cycles()
    time.sleep(1.0)
    print(f"IDLE_CYCLES {cycles() - before}", flush=True)
    time.sleep(0.3 * rank)  # the ranks wake one by one: the first waits for the rest
    out = hvd.allreduce(torch.full((3,), float(rank)), op=hvd.Sum, name="late")
    ck.eq(out.tolist(), [float(sum(range(size)))] * 3, "the late ranks' sum")


def late_rank(ck: _common.Checks, rank: int, size: int) -> None:
    hvd.allreduce(torch.ones(2), name="warm")
    before = cycles()
    if rank == size - 1:
        time.sleep(1.0)  # its training, while the others wait on its op
    out = hvd.allreduce(torch.full((3,), float(rank)), op=hvd.Sum, name="late")
    print(f"WAIT_CYCLES {cycles() - before}", flush=True)
    ck.eq(out.tolist(), [float(sum(range(size)))] * 3, "the sum the others waited for")


def in_a_set(ck: _common.Checks, rank: int, flags: Path) -> None:
    pair = hvd.add_process_set([1, 2])
    hvd.allreduce(torch.ones(1), name="warm")
    time.sleep(0.5)  # every rank asleep
    flag = flags / "set-done"
    if rank == 0:
        deadline = time.monotonic() + 30
        while not flag.exists() and time.monotonic() < deadline:
            time.sleep(0.05)  # submits nothing meanwhile: its cycle sleeps
        ck.true(flag.exists(), "the set's op completed while rank 0 submitted nothing")
    else:
        out = hvd.allreduce(torch.full((2,), float(rank)), op=hvd.Sum, process_set=pair)
        ck.eq(out.tolist(), [3.0, 3.0], "the set's sum")
        if rank == 1:
            flag.write_text("done")
    hvd.allreduce(torch.ones(1), name="end")


def submitted(ck: _common.Checks, rank: int, size: int) -> None:
    hvd.allreduce(torch.ones(2), name="warm")
    time.sleep(0.5)  # every rank asleep, nothing pending
    t = torch.full((3,), float(rank))
    before = cycles()
    handle = hvd.allreduce_async_(t, op=hvd.Sum, name="lazy")
    time.sleep(0.5)  # its backward pass, say
    print(f"SUBMIT_CYCLES {cycles() - before}", flush=True)
    hvd.synchronize(handle)
    ck.eq(t.tolist(), [float(sum(range(size)))] * 3, "the sum, once waited on")

    time.sleep(0.5)
    large = torch.ones(100_000)
    before = cycles()
    handle = hvd.allreduce_async_(large, op=hvd.Sum, name="large")
    time.sleep(0.5)
    print(f"LARGE_SUBMIT_CYCLES {cycles() - before}", flush=True)
    hvd.synchronize(handle)
    ck.eq(float(large[0]), float(size), "the large op's sum")

    time.sleep(0.5)
    polled = torch.ones(4)
    handle = hvd.allreduce_async_(polled, op=hvd.Sum, name="polled")
    start = time.monotonic()
    while not hvd.poll(handle) and time.monotonic() - start < 30:
        time.sleep(0.01)
    print(f"POLL_SECONDS {time.monotonic() - start:.3f}", flush=True)
    ck.true(hvd.poll(handle), "an op only ever polled completes")
    hvd.synchronize(handle)
    ck.eq(polled.tolist(), [float(size)] * 4, "the polled sum")

    time.sleep(0.5)
    late = torch.ones(2)
    start = time.monotonic()
    if rank == size - 1:
        time.sleep(0.5)
        handle = hvd.allreduce_async_(late, op=hvd.Sum, name="late-submit")
        time.sleep(2.0)  # computes on: the others must not wait for this
        hvd.synchronize(handle)
    else:
        hvd.allreduce_(late, op=hvd.Sum, name="late-submit")
        print(f"LATE_WAIT_SECONDS {time.monotonic() - start:.3f}", flush=True)
    ck.eq(late.tolist(), [float(size)] * 2, "the late submission's sum")


def steps(ck: _common.Checks, rank: int, size: int) -> None:
    hvd.allreduce(torch.ones(2), name="warm")
    before = cycles()
    for _ in range(8):
        time.sleep(0.05)  # forward: every rank goes back to sleep
        grad = torch.full((3,), float(rank))
        handle = hvd.allreduce_async_(grad, op=hvd.Sum, name="grad")
        time.sleep(0.1)  # the rest of backward
        hvd.synchronize(handle)
        ck.eq(grad.tolist(), [float(sum(range(size)))] * 3, "each step's sum")
    print(f"STEP_CYCLES {cycles() - before}", flush=True)


def killed(rank: int, size: int) -> None:
    hvd.allreduce(torch.ones(1), name="warm")
    time.sleep(1.0)
    if rank == size - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.5)
    try:
        hvd.allreduce(torch.ones(1), name="after")
    except Exception as exc:  # the survivors' error, for the test to read
        print(f"ERROR {exc}", flush=True)
        sys.stdout.flush()
        os._exit(0)
    print("NO ERROR", flush=True)


def main() -> None:
    _common.start_watchdog()
    mode, flags = sys.argv[1], Path(sys.argv[2])
    hvd.init(process_sets="dynamic" if mode == "set" else None)
    rank, size = hvd.rank(), hvd.size()
    if mode == "kill":
        killed(rank, size)
        return
    ck = _common.Checks(rank)
    with ck.section(mode):
        if mode == "idle":
            idle(ck, rank, size)
        elif mode == "wait":
            late_rank(ck, rank, size)
        elif mode == "submit":
            submitted(ck, rank, size)
        elif mode == "steps":
            steps(ck, rank, size)
        else:
            in_a_set(ck, rank, flags)
    hvd.shutdown()
    ck.done()


if __name__ == "__main__":
    main()
