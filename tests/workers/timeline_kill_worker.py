"""A rank that SIGKILLs itself with the timeline on: tests/test_timeline_kill.py.

Usage: ``timeline_kill_worker.py OPS [--pause-ms MS] [--pause-after K]``

Every rank runs blocking allreduces of 4 floats, each under a name of its own
(``kill.op.<k>``), so each op is one lane of the trace. After its op ``K`` rank 1 sleeps
``MS`` ms once (so some ops are surely old enough to be checked), and after ``OPS`` ops
(0: right after ``init()``) it SIGKILLs itself. Rank 0 goes on submitting until the
launcher stops it.

Rank 1 appends to ``$HVDPROF_TIMELINE/done.rank.1.txt``, with unbuffered writes, one line
``<k> <t_ns>`` when op ``k`` returned and ``kill <t_ns>`` just before the signal
(``time.perf_counter_ns``, the runtime's clock), so the test can tell which ops
completed long enough before the kill.
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import time

import _common

_common.start_watchdog()

parser = argparse.ArgumentParser()
parser.add_argument("ops", type=int)
parser.add_argument("--pause-ms", type=float, default=0.0)
parser.add_argument("--pause-after", type=int, default=-1)
ARGS = parser.parse_args()

import torch  # noqa: E402

import hvdprof.torch as hvd  # noqa: E402

torch.set_num_threads(1)
hvd.init()
R = hvd.rank()
side = -1
if R == 1:
    path = os.path.join(os.environ["HVDPROF_TIMELINE"], "done.rank.1.txt")
    side = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)


def note(text: str) -> None:
    os.write(side, f"{text} {time.perf_counter_ns()}\n".encode())


def die() -> None:
    note("kill")
    os.kill(os.getpid(), signal.SIGKILL)


if R == 1 and ARGS.ops == 0:
    die()
for k in itertools.count():
    out = hvd.allreduce(torch.full((4,), float(k)), name=f"kill.op.{k}", op=hvd.Sum)
    if R == 1:
        note(str(k))
        assert float(out[0]) == 2.0 * k, (k, out)
        if k == ARGS.pause_after:
            time.sleep(ARGS.pause_ms / 1000)
        if k + 1 == ARGS.ops:
            die()
