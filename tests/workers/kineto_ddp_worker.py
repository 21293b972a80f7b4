"""A small DDP (Gloo) training job recorded with torch.profiler, one trace per rank.

Started by torchrun (``launched.py`` in front). Usage: ``kineto_ddp_worker.py OUTDIR
[SLOW_RANK [SLOW_MS]]``: every rank trains a small MLP with DistributedDataParallel on
Gloo, profiles STEPS steps after a warm-up with ``tensorboard_trace_handler(OUTDIR)``
(``<worker>.<id>.pt.trace.json``); each step first waits WAIT_MS off the CPU; SLOW_RANK
(default -1: none) does SLOW_MS of extra work before each backward, so it launches every
bucket's allreduce last.
"""

from __future__ import annotations

import gc
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

#: profiled steps: enough that a balanced job's noise is not taken for a straggler
STEPS = 20
#: Each step first waits this long off the CPU, as a rank waits for its next batch or
#: for its GPU. Without it the step was the MLP's few ms of CPU alone, and on 2 cores the
#: scheduler's time slices alone made one rank's own work 1.5-2.3 ms a step longer in
#: about 1 balanced run in 10 (both ranks pinned to one core, one on each, or unpinned:
#: 5 of 36 runs named a rank, quiet or beside a spin loop), above the bar of 10% of a
#: 5-12 ms step. With it: 0 of 45 runs named one (quiet, one and two spin loops; largest
#: excess 1.9 ms against a bar of 2.6-3.8 ms).
WAIT_MS = 20.0


def main() -> None:
    out = sys.argv[1]
    slow_rank = int(sys.argv[2]) if len(sys.argv) > 2 else -1
    slow_ms = float(sys.argv[3]) if len(sys.argv) > 3 else 60.0
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    )
    # small buckets: several allreduces per step
    ddp = DDP(model, bucket_cap_mb=0.5)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x = torch.randn(32, 256)
    y = torch.randint(0, 10, (32,))
    schedule = torch.profiler.schedule(wait=1, warmup=1, active=STEPS, repeat=1)
    handler = torch.profiler.tensorboard_trace_handler(out, worker_name=f"worker{rank}")
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], schedule=schedule, on_trace_ready=handler
    ) as prof:
        for _ in range(STEPS + 3):
            opt.zero_grad()
            time.sleep(WAIT_MS / 1000.0)  # the next batch, or the device, on every rank
            loss = torch.nn.functional.cross_entropy(ddp(x), y)
            if rank == slow_rank:
                with torch.profiler.record_function("slow_rank_extra_work"):
                    end = time.perf_counter() + slow_ms / 1000.0
                    while time.perf_counter() < end:  # busy work, like a slower GPU
                        pass
            loss.backward()
            opt.step()
            prof.step()
    dist.barrier()
    print(f"rank {rank} wrote {sorted(os.listdir(out))}", flush=True)
    # DDP's reducer and the profiler hold Gloo work objects; dropped before the group is
    # destroyed, none is left for interpreter teardown
    del ddp, opt, prof, model
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # torch 2.13's interpreter teardown after a Gloo DDP job aborted about 1 run in 30 here
    # ("terminate called without an active exception", SIGABRT after destroy_process_group
    # had returned and the traces were written); this fixture's job ends at the line above
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
