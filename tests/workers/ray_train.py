"""One training job, run the same way under ``hvdprof run`` and on Ray actors.

``train()`` is what a ``RayExecutor`` runs on every rank; run as a script (under
``hvdprof run -np N``) it calls the same function and rank 0 saves the parameters to
``--out``, so tests/test_ray.py can compare the two jobs step for step. Same seed, same
data per rank, same model, ``DistributedOptimizer``: the parameters after ``steps``
steps must agree to float tolerance. ``sleep_rank`` sleeps ``sleep_ms`` before each
step's backward, a straggler by a known amount (the arithmetic does not change).

The elastic variant, ``train_elastic()``, runs under ``ElasticRayExecutor``: worker
``kill_worker`` kills its own process (SIGKILL) at batch ``kill_at`` of the first
generation, and the survivors must finish every batch.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from typing import Any


def _model_and_data(seed: int, rank: int, steps: int) -> tuple[Any, list[Any]]:
    import torch

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    batches = [
        (torch.randn(16, 8, generator=g), torch.randint(0, 2, (16,), generator=g))
        for _ in range(steps)
    ]
    return model, batches


def train(steps: int = 12, seed: int = 7, sleep_rank: int = -1, sleep_ms: float = 0.0) -> dict:
    """Train, return this rank's view: rank, local rank, size, host, final parameters."""
    import socket

    import torch

    import hvdprof.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    rank = hvd.rank()
    model, batches = _model_and_data(seed, rank, steps)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    for x, y in batches:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        if rank == sleep_rank:
            time.sleep(sleep_ms / 1000.0)
        loss.backward()
        optimizer.step()
    return {
        "rank": rank,
        "local_rank": hvd.local_rank(),
        "size": hvd.size(),
        "host": socket.gethostname(),
        "params": [p.detach().clone() for p in model.parameters()],
    }


def train_elastic(
    batches: int = 40,
    kill_worker: str = "1",
    kill_at: int = 5,
    pause_s: float = 0.05,
    report: bool = False,
) -> dict:
    """An ``@hvd.elastic.run`` loop of allreduces; returns where this worker ended. With
    ``report``, rank 0 sends each committed batch to the driver's callbacks."""
    import torch

    import hvdprof.torch as hvd
    from hvdprof.ray import ray_logger

    torch.set_num_threads(1)
    hvd.init()
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    state = hvd.elastic.TorchState(model, optimizer, batch=0, sizes=[])
    me = os.environ.get("HVDPROF_ELASTIC_WORKER", "")  # (a test: read as a user would)

    @hvd.elastic.run
    def loop(state: Any) -> None:
        while state.batch < batches:
            if me == kill_worker and state.batch == kill_at and hvd.size() > 1:
                os.kill(os.getpid(), signal.SIGKILL)
            total = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="count")
            state.sizes.append(int(total.item()))
            state.batch += 1
            time.sleep(pause_s)
            state.commit()
            if report:
                ray_logger.log({"batch": state.batch, "rank": hvd.rank(), "worker": me})

    loop(state)
    return {"worker": me, "rank": hvd.rank(), "size": hvd.size(), "batch": state.batch}


def train_until_killed(steps: int = 400, die_rank: int = 1, die_at: int = 3) -> int:
    """Allreduce step after step; rank ``die_rank`` SIGKILLs its own process at ``die_at``."""
    import torch

    import hvdprof.torch as hvd

    hvd.init()
    for step in range(steps):
        if hvd.rank() == die_rank and step == die_at:
            os.kill(os.getpid(), signal.SIGKILL)
        hvd.allreduce(torch.ones(4), name="grad")
        time.sleep(0.01)
    return hvd.rank()


def main() -> None:
    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    result = train(args.steps, args.seed)
    if result["rank"] == 0:
        torch.save(result["params"], args.out)
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
