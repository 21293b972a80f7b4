"""A small DDP (Gloo) training job recorded with torch.profiler, one trace per rank.

Started by torchrun (``launched.py`` in front). Usage: ``kineto_ddp_worker.py OUTDIR
[SLOW_RANK [SLOW_MS]]``: every rank trains a small MLP with DistributedDataParallel on
Gloo, profiles STEPS steps after a warm-up with ``tensorboard_trace_handler(OUTDIR)``
(``<worker>.<id>.pt.trace.json``); SLOW_RANK (default -1: none) does SLOW_MS of extra
work before each backward, so it launches every bucket's allreduce last.
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


def main() -> None:
    out = sys.argv[1]
    slow_rank = int(sys.argv[2]) if len(sys.argv) > 2 else -1
    slow_ms = float(sys.argv[3]) if len(sys.argv) > 3 else 60.0
    # both ranks on one core: the scheduler shares it fairly between them, where on two
    # cores another busy process on one of them would make its rank the slow one
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
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
