"""A 2-rank DDP job on one GPU, recorded with torch.profiler (CPU and CUDA), one rank slow.

Started by torchrun (``--nproc_per_node 2``) from ``benchmarks/gpu_check.py``. Usage:
``kineto_gpu_worker.py OUTDIR SLOW_RANK SLOW_MS``. Both ranks train a small MLP on the one
GPU with DistributedDataParallel on Gloo (CUDA tensors: NCCL refuses two ranks on one
device) and profile STEPS steps after a warm-up with ``tensorboard_trace_handler(OUTDIR,
use_gzip=True)``. SLOW_RANK sleeps SLOW_MS before each backward, inside a
``record_function`` range, so it reaches every bucket's allreduce that much later: the
straggler ``hvdprof analyze`` must name, with about SLOW_MS of cost per step.
"""

from __future__ import annotations

import gc
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

#: profiled steps: enough for the straggler analysis to judge, few enough for small files
STEPS = 12


def main() -> None:
    out = sys.argv[1]
    slow_rank = int(sys.argv[2])
    slow_ms = float(sys.argv[3])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank % torch.cuda.device_count())
    dev = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096),
        torch.nn.ReLU(),
        torch.nn.Linear(4096, 4096),
        torch.nn.ReLU(),
        torch.nn.Linear(4096, 10),
    ).to(dev)
    ddp = DDP(model, device_ids=[dev.index], bucket_cap_mb=16)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x = torch.randn(256, 1024, device=dev)
    y = torch.randint(0, 10, (256,), device=dev)
    schedule = torch.profiler.schedule(wait=1, warmup=2, active=STEPS, repeat=1)
    handler = torch.profiler.tensorboard_trace_handler(
        out, worker_name=f"worker{rank}", use_gzip=True
    )
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(
        activities=activities, schedule=schedule, on_trace_ready=handler
    ) as prof:
        for _ in range(STEPS + 3):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(ddp(x), y)
            if rank == slow_rank:
                with torch.profiler.record_function("slow_rank_sleep"):
                    time.sleep(slow_ms / 1000.0)
            loss.backward()
            opt.step()
            prof.step()
    torch.cuda.synchronize()
    dist.barrier()
    print(f"rank {rank} wrote {sorted(os.listdir(out))}", flush=True)
    del ddp, opt, prof, model
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # as tests/workers/kineto_ddp_worker.py: the traces are written; no Gloo teardown abort
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
