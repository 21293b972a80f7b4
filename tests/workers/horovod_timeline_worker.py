"""Trains a few steps under whatever HOROVOD_TIMELINE the test set; prints ``TRAINED <n>``.

``argv[1]``: ``plain`` (just train), or ``dynamic DIR``: train, print ``FILES <names>``
(what DIR holds: nothing is expected yet), then every rank calls
``hvd.start_timeline(DIR/timeline.json)``, trains more and ``stop_timeline()``, and
prints ``FILES`` again. ``DONE`` at the end.
"""

from __future__ import annotations

import os
import sys

import _common

_common.start_watchdog()

import torch  # noqa: E402

import hvdprof.torch as hvd  # noqa: E402

MODE = sys.argv[1]
torch.set_num_threads(1)
hvd.init()
steps = 0


def train(n: int) -> None:
    global steps
    for _ in range(n):
        total = hvd.allreduce(torch.ones(4) * (hvd.rank() + 1), op=hvd.Sum, name="g")
        expected = sum(range(1, hvd.size() + 1))
        assert torch.equal(total, torch.full((4,), float(expected))), total
        steps += 1


def files(directory: str) -> str:
    found = sorted(
        os.path.relpath(os.path.join(root, name), directory)
        for root, dirs, names in os.walk(directory)
        for name in names + [d + "/" for d in dirs]
    )
    return ",".join(found) or "-"


train(5)
if MODE == "dynamic":
    where = sys.argv[2]
    hvd.barrier()
    print(f"FILES {files(where)}", flush=True)
    hvd.barrier()  # every rank looked before any rank starts recording
    hvd.start_timeline(os.path.join(where, "timeline.json"))
    train(5)
    hvd.stop_timeline()
    print(f"FILES {files(where)}", flush=True)
print(f"TRAINED {steps}", flush=True)
hvd.shutdown()
print("DONE", flush=True)
