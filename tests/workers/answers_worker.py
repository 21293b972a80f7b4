"""A small real training loop with one slow rank: the ground truth of tests/test_answers.py.

Usage: ``answers_worker.py --steps N [--slow-rank R[,R2...] --delay-ms D --where WHERE
[--onset K] [--fraction F --seed S]] [--width W --layers L --batch B] [--out FILE]``

An MLP of ``L`` linear layers trained with hvdprof's ``DistributedOptimizer`` (gradients
allreduced as backward produces them). From step ``K`` on, each rank listed in ``R``
(one, or several: a slow host) spends ``D`` ms more per step, in every step or, with
``--fraction F``, in a share ``F`` of the steps drawn with seed ``S`` (the same steps on
every slow rank: an intermittent fault), where ``WHERE`` says:

* ``data``: sleeping while it "loads" its batch, before forward;
* ``forward``: sleeping in a forward hook of the middle layer;
* ``backward``: sleeping in a hook on the middle activation's gradient, so the gradients
  of the layers after it (produced first) are on time and the others are late.

Rank 0 writes ``FILE`` (JSON): every step's wall time on rank 0 (``step_ms``), measured
from one step's start to the next's, and the steps that were slowed (``slow_steps``): the
ground truth the verdicts are checked against; every rank writes ``FILE.rank<R>``: its data,
forward, backward and optimizer step times per step (its own work), the time it waited for
the other ranks' gradients, and the delay it actually slept (a sleep overshoots on a busy
machine).
Output: ``SECTION train OK <n>`` and ``DONE``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import time

import _common

_common.start_watchdog()

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, required=True)
parser.add_argument("--slow-rank", default="", help="rank, or ranks comma-separated")
parser.add_argument("--delay-ms", type=float, default=0.0)
parser.add_argument("--where", choices=("data", "forward", "backward"), default="data")
parser.add_argument("--onset", type=int, default=0)
parser.add_argument("--fraction", type=float, default=1.0, help="share of the steps slowed")
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--width", type=int, default=256)
parser.add_argument("--layers", type=int, default=6)
parser.add_argument("--batch", type=int, default=64)
parser.add_argument("--out", default="")
ARGS = parser.parse_args()

import torch  # noqa: E402

import hvdprof.torch as hvd  # noqa: E402

torch.set_num_threads(1)
torch.manual_seed(0)
hvd.init()
R = hvd.rank()
ck = _common.Checks(R)
DELAY_S = ARGS.delay_ms / 1000.0
STATE = {"slow": False}
SLOW_RANKS = {int(x) for x in ARGS.slow_rank.split(",") if x.strip()}
SLOW = R in SLOW_RANKS
# the steps slowed: drawn once, the same on every rank (whole-host faults hit together)
_draw = random.Random(ARGS.seed)
SLOW_STEPS = [
    k
    for k in range(ARGS.steps)
    if SLOW_RANKS and k >= ARGS.onset and _draw.random() < ARGS.fraction
]


SLEPT = [0.0]  # this step's injected delay as slept (a sleep overshoots on a busy machine)


def pause(*_: object) -> None:
    if STATE["slow"]:
        t = time.perf_counter()
        time.sleep(DELAY_S)
        SLEPT[0] += time.perf_counter() - t


layers: list[torch.nn.Module] = []
for _ in range(ARGS.layers):
    layers += [torch.nn.Linear(ARGS.width, ARGS.width), torch.nn.ReLU()]
model = torch.nn.Sequential(*layers, torch.nn.Linear(ARGS.width, 1))
middle = layers[2 * (ARGS.layers // 2)]  # a Linear in the middle
if SLOW and ARGS.where == "forward":
    middle.register_forward_hook(lambda *_: pause())
if SLOW and ARGS.where == "backward":
    # the gradient of the middle layer's output: computed after the later layers' weight
    # gradients (already submitted), before the earlier layers'

    def hook_gradient(_module: object, _inputs: object, out: torch.Tensor) -> None:
        out.register_hook(lambda _grad: pause())

    middle.register_forward_hook(hook_gradient)

opt = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=1e-3), named_parameters=model.named_parameters()
)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
starts: list[float] = []
# per step: data, forward, backward, optimizer step (its own work), waiting for the others (s)
spans: list[tuple[float, ...]] = []
slept: list[float] = []  # per step: the delay injected, as slept (s)

with ck.section("train"):
    for k in range(ARGS.steps):
        starts.append(time.perf_counter())
        STATE["slow"] = SLOW and k in SLOW_STEPS
        SLEPT[0] = 0.0
        t_data = time.perf_counter()
        x = torch.randn(ARGS.batch, ARGS.width)  # "loading" the batch
        y = x.sum(dim=1, keepdim=True)
        if ARGS.where == "data":
            pause()
        opt.zero_grad()
        t0 = time.perf_counter()
        loss = torch.nn.functional.mse_loss(model(x), y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.synchronize()  # waiting for the other ranks: not this rank's own work
        t3 = time.perf_counter()
        with opt.skip_synchronize():
            opt.step()
        spans.append((t0 - t_data, t1 - t0, t2 - t1, time.perf_counter() - t3, t3 - t2))
        slept.append(SLEPT[0])
        ck.true(bool(torch.isfinite(loss)), f"step {k}: loss is finite")
    starts.append(time.perf_counter())
    if R == 0 and ARGS.out:
        with open(ARGS.out, "w") as f:
            step_ms = [(b - a) * 1000.0 for a, b in itertools.pairwise(starts)]
            json.dump({"step_ms": step_ms, "slow_steps": SLOW_STEPS}, f)
    if ARGS.out:  # every rank: its data, forward, backward, optimizer step and waiting
        # times (ms), and the delay it slept in each step
        with open(f"{ARGS.out}.rank{R}", "w") as f:
            phases = [[round(x * 1000.0, 3) for x in s] for s in spans]
            delays = [round(x * 1000.0, 3) for x in slept]
            json.dump({"phases_ms": phases, "slept_ms": delays}, f)
hvd.shutdown()
print("DONE", flush=True)
