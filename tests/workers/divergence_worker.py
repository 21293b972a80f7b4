"""A small model trained with HVDPROF_CHECK_DIVERGENCE=1; one rank's weights are nudged
before step ``argv[1]`` (0: never). Prints ``STEP <k>`` after each step and ``DONE``."""

from __future__ import annotations

import sys

import _common

_common.start_watchdog()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import hvdprof.torch as hvd  # noqa: E402

PERTURB_AT = int(sys.argv[1])
PERTURBED_RANK = int(sys.argv[2]) if len(sys.argv) > 2 else 1
STEPS = 10

torch.set_num_threads(1)
hvd.init()
R = hvd.rank()
torch.manual_seed(3)
model = torch.nn.Sequential(
    torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)
)  # fmt: skip
opt = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.05), named_parameters=model.named_parameters()
)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
g = torch.Generator().manual_seed(100 + R)
for step in range(1, STEPS + 1):
    x, y = torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)
    opt.zero_grad()
    F.mse_loss(model(x), y).backward()
    if step == PERTURB_AT and R == PERTURBED_RANK:
        with torch.no_grad():
            model[2].bias[0] += 1e-6  # one element of one parameter, slightly
    opt.step()
    print(f"STEP {step}", flush=True)
hvd.shutdown()
print("DONE", flush=True)
