"""Many small ops with the timeline on, for tests/test_timeline_lossless.py.

Usage: ``lossless_worker.py OPS GO_FILE [exit]``. Each rank waits for ``GO_FILE`` to exist (the
test stops the renderers first), then submits ``OPS`` tiny allreduces in batches of 100
under names of their own, writing how many it has done to ``$HVDPROF_TIMELINE/progress.
rank.<r>`` every batch (so the test sees when the rank stops making progress), and
prints ``DONE``. With ``exit`` it never calls ``shutdown()``: the interpreter's exit ends
the runtime, as in a user's script that just returns.
"""

from __future__ import annotations

import os
import sys
import time

import _common

_common.start_watchdog()

import torch  # noqa: E402

import hvdprof.torch as hvd  # noqa: E402

OPS, GO = int(sys.argv[1]), sys.argv[2]
AT_EXIT = sys.argv[3:] == ["exit"]
torch.set_num_threads(1)
hvd.init()
R = hvd.rank()
progress = os.path.join(os.environ["HVDPROF_TIMELINE"], f"progress.rank.{R}")
with open(progress, "w") as f:
    f.write("0")
deadline = time.monotonic() + 120
while not os.path.exists(GO) and time.monotonic() < deadline:
    time.sleep(0.01)
x = torch.ones(4)
done = 0
while done < OPS:
    handles = [hvd.allreduce_async(x, name=f"small.{done + i}") for i in range(100)]
    for h in handles:
        hvd.synchronize(h)
    done += len(handles)
    with open(progress + ".tmp", "w") as f:
        f.write(str(done))
    os.replace(progress + ".tmp", progress)
if not AT_EXIT:
    hvd.shutdown()
print("DONE", flush=True)
