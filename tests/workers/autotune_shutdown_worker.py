"""The workload behind tests/test_autotune_log_timeline.py: a job that shuts down while rank
0's tuner still has a scored sample in hand.

Usage: ``autotune_shutdown_worker.py [--start-timeline DIR]``

The test turns autotune (and its log) on through ``hvdprof run``, and the timeline either
there too or, with ``--start-timeline``, from the job after ``init`` (the timeline's sink
then registers after the tuner). Rank 0 holds the tuner's first sample on its way to the
timeline, as a loaded machine's slow worker would, until the runtime is closing the tuner
or the timeline, whichever it closes first; meanwhile every rank stops at the next step
and shuts down. Each step allreduces eight named gradients, then a one-element ``ctl``
through which rank 0 says stop, so every rank runs the same steps.

Output: ``INFO held 1`` on rank 0 (a sample was held through the shutdown),
``SECTION run OK <n>`` and ``DONE``.
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

import _common

_common.start_watchdog()

parser = argparse.ArgumentParser()
parser.add_argument("--start-timeline", default="")
ARGS = parser.parse_args()

import torch  # noqa: E402

import hvdprof.torch as hvd  # noqa: E402
from hvdprof.runtime import runtime as rt_module  # noqa: E402

#: no more steps than this however the tuner runs (it hands a sample over within ~10)
MAX_STEPS = 2000
#: the longest a sample is held (the shutdown begins within a few steps of the hold)
HOLD_LIMIT_S = 60.0

torch.set_num_threads(1)
hvd.init()
R = hvd.rank()
if ARGS.start_timeline:
    hvd.start_timeline(ARGS.start_timeline)
RT = rt_module.get()
TUNER = RT.autotuner  # rank 0 only
SINK = RT.timeline.sink
ck = _common.Checks(R)
held = threading.Event()

if TUNER is not None:
    forward = TUNER.on_sample

    def hold_first(*args: Any, **decisions: Any) -> None:
        """On the tuner's worker thread: the first sample waits for the shutdown."""
        if not held.is_set():
            held.set()
            limit = time.monotonic() + HOLD_LIMIT_S
            while not (TUNER._closed or SINK._closed) and time.monotonic() < limit:
                time.sleep(0.002)
        forward(*args, **decisions)

    TUNER.on_sample = hold_first

SHAPES = [(256,)] * 6 + [(64, 64), (32 * 1024,)]
GRADS = [torch.zeros(s) for s in SHAPES]
NAMES = [f"grad.{i}" for i in range(len(SHAPES))]

with ck.section("run"):
    for k in range(MAX_STEPS):
        _common.allreduce_named_gradients(hvd, GRADS, NAMES, ck, k)
        stop = torch.tensor([1.0 if held.is_set() else 0.0])
        if float(hvd.allreduce(stop, name="ctl", op=hvd.Sum)[0]) > 0:
            break
    ck.true(R != 0 or held.is_set(), f"the tuner handed over no sample in {MAX_STEPS} steps")
hvd.shutdown()
if R == 0:
    print(f"INFO held {int(held.is_set())}", flush=True)
ck.done()
