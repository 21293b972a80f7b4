"""The demo job: a small classifier trained data-parallel with ``DistributedOptimizer``.

Run it through the launcher: ``hvdprof run -np 2 -- python -m hvdprof.demo``. It is an
unchanged Horovod script except for the import line, which is the point.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from torch import nn

import hvdprof.torch as hvd


def make_dataset(
    n: int, features: int, classes: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian blobs: learnable, deterministic, and needing no download."""
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(classes, features, generator=g) * 0.35
    labels = torch.randint(0, classes, (n,), generator=g)
    points = centers[labels] + torch.randn(n, features, generator=g)
    return points, labels


def main(argv: list[str] | None = None, prepare: Callable[[nn.Module], None] | None = None) -> int:
    """Train; ``prepare`` sees the model before training (the gate calibration benchmark
    hooks a known slowdown into its backward pass there)."""
    parser = argparse.ArgumentParser(description="hvdprof demo: data-parallel training")
    # 15 epochs (960 steps of a few ms): long enough for autotune to finish a round and
    # print its decision; at 5 the job ended while the tuner was still measuring
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument(
        "--steps", type=int, default=0, help="stop after this many steps (default: all epochs)"
    )
    args = parser.parse_args(argv)

    hvd.init()
    torch.manual_seed(0)
    x, y = make_dataset(8192, 32, 10, seed=1)
    # each rank trains on its own shard
    x, y = x[hvd.rank() :: hvd.size()], y[hvd.rank() :: hvd.size()]

    model = nn.Sequential(
        nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10)
    )
    if prepare is not None:
        prepare(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    loss_fn = nn.CrossEntropyLoss()

    start = time.perf_counter()
    steps = 0
    for epoch in range(args.epochs):
        perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(epoch))
        total, batches = 0.0, 0
        for i in range(0, x.shape[0], args.batch_size):
            idx = perm[i : i + args.batch_size]
            optimizer.zero_grad()
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            optimizer.step()
            total += loss.item()
            batches += 1
            steps += 1
            if steps == args.steps:
                break
        avg = hvd.allreduce(torch.tensor(total / batches), name="epoch_loss").item()
        if hvd.rank() == 0:
            print(f"epoch {epoch}: mean loss {avg:.4f}")
        if steps == args.steps:
            break

    with torch.no_grad():
        correct = (model(x).argmax(1) == y).sum()
    accuracy = hvd.allreduce(correct.float() / x.shape[0], name="accuracy").item()
    elapsed = time.perf_counter() - start
    stats = hvd.runtime_stats()
    if hvd.rank() == 0:
        print(
            f"accuracy {accuracy:.3f} after {steps} steps in {elapsed:.1f} s on {hvd.size()} ranks"
        )
        print(
            "runtime: {cycles} cycles, {fused_groups} fused groups of {fused_tensors} tensors, "
            "{cache_hits} response-cache hits, {bytes_reduced} bytes reduced".format(**stats)
        )
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
