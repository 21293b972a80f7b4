"""A small DistributedOptimizer training loop recorded by torch.profiler on every rank.

Usage: ``analysis_profiler_worker.py OUT_DIR --steps N``. Writes
``OUT_DIR/kineto.rank<r>.json`` (torch.profiler's Chrome trace) while the test records
hvdprof's timeline through ``hvdprof run --timeline``, so the two can be analysed together.
Output: ``SECTION train OK <n>`` and ``DONE``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import _common

_common.start_watchdog()

parser = argparse.ArgumentParser()
parser.add_argument("out", type=Path)
parser.add_argument("--steps", type=int, default=10)
ARGS = parser.parse_args()

import torch  # noqa: E402
from torch import nn  # noqa: E402

import hvdprof.torch as hvd  # noqa: E402

torch.set_num_threads(1)
hvd.init()
R = hvd.rank()
ck = _common.Checks(R)
torch.manual_seed(0)
model = nn.Sequential(
    nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
)
opt = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters()
)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))

with ck.section("train"):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(ARGS.steps):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
    ck.true(bool(torch.isfinite(loss)), "loss is not finite")
    ARGS.out.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(ARGS.out / f"kineto.rank{R}.json"))
hvd.shutdown()
print("DONE", flush=True)
