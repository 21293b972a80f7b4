"""A rank that keeps the job waiting, for the hang diagnosis (``test_hang_diagnosis.py``).

``hang_worker.py MODE DIR``: every rank writes ``DIR/ready.RANK`` once ``init()`` has
returned (the SIGUSR1 handler is installed by then) and the job is past a first step;
the late rank then stays where MODE puts it until the test creates ``DIR/release``
(or for ``HVDTEST_HOLD_S`` seconds at most), and the job finishes cleanly.

- ``sleep``: rank 1 sleeps in ``load_batch`` (outside any collective) while rank 0 waits
  in an allreduce of ``grad.0``;
- ``busy``: rank 1 spins in ``crunch``, a pure-Python loop (it holds the GIL but for
  the interpreter's switch interval);
- ``mismatch``: rank 1 waits in an allgather ``other`` that rank 0 has not submitted,
  while rank 0 has submitted ``grad.0`` and polls it (so no rank can prove a deadlock);
- ``idle``: every rank waits for the release in ``idle_wait`` (the SIGUSR1 test).

Lines the tests look for carry a ``# LINE <tag>`` comment.
"""

from __future__ import annotations

import os
import sys
import time

import _common

_common.start_watchdog()

import torch  # noqa: E402

import hvdprof.torch as hvd  # noqa: E402

MODE, DIR = sys.argv[1], sys.argv[2]
HOLD_S = float(os.environ.get("HVDTEST_HOLD_S", "120"))
RELEASE = os.path.join(DIR, "release")

hvd.init()
R, N = hvd.rank(), hvd.size()


def released() -> bool:
    return os.path.exists(RELEASE)


def hold_until_released() -> None:
    deadline = time.monotonic() + HOLD_S
    while not released() and time.monotonic() < deadline:
        time.sleep(0.05)  # LINE sleep


def load_batch() -> torch.Tensor:
    if R == 1:
        hold_until_released()  # LINE load_batch
    return torch.ones(4)


def crunch() -> float:
    deadline = time.monotonic() + HOLD_S
    acc = 0.0
    while not released() and time.monotonic() < deadline:
        for i in range(200_000):  # LINE crunch
            acc += i * 0.5
    return acc


def wait_other() -> None:
    hvd.allgather(torch.ones(1, 2), name="other")  # LINE wait_other


def idle_wait() -> None:
    hold_until_released()  # LINE idle_wait


def step() -> None:
    out = hvd.allreduce(torch.ones(4), op=hvd.Sum, name="grad.0")
    assert torch.equal(out, torch.full((4,), float(N))), out


def ready() -> None:
    with open(os.path.join(DIR, f"ready.{R}"), "w") as f:
        f.write(str(os.getpid()))


step()  # one step in which nobody is late
ready()
if MODE == "sleep":
    batch = load_batch()
    step()
elif MODE == "busy":
    if R == 1:
        crunch()
    step()
elif MODE == "mismatch":
    if R == 1:
        wait_other()
        step()
    else:
        handle = hvd.allreduce_async(torch.ones(4), op=hvd.Sum, name="grad.0")
        while not released():
            time.sleep(0.05)  # polls, never blocked in a wait
        hvd.allgather(torch.ones(1, 2), name="other")
        hvd.synchronize(handle)
elif MODE == "idle":
    idle_wait()
    step()
step()
print("DONE", flush=True)
