"""An elastic training job with deterministic data, for tests/test_elastic.py.

A linear model trained with SGD + momentum over 96 fixed samples, sharded by
``hvd.elastic.ElasticSampler``, committed after every batch. Options:

--kill-worker W --kill-step S  worker W SIGKILLs itself at its S-th step (mid-epoch)
--save-committed PATH          the new rank 0 saves the restored (committed) state at the
                               first reset, for a reference run to start from
--load PATH                    start from such a saved state instead of from scratch
--grow-file PATH --grow-step S rank 0 writes "localhost:3" to PATH (the discovery
                               script's slots) at step S, then trains until it has run
                               5 steps at 3 ranks
--hold-until-size N            while the job is smaller than N ranks, wait after each
                               commit (checking for new hosts) until a replacement worker
                               joins, so the test does not race the worker's start-up
                               (seconds of imports on a loaded machine) against the end
                               of the training

Prints ``COMMITTED <epoch> <indices>`` after every commit, ``RESET ...`` per re-formation
and, on rank 0 at the end, ``WEIGHTS <json>``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import start_watchdog

start_watchdog()

import torch  # noqa: E402

import hvdprof.torch as hvd  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--kill-worker", default="")
parser.add_argument("--kill-step", type=int, default=-1)
parser.add_argument("--save-committed", default="")
parser.add_argument("--load", default="")
parser.add_argument("--grow-file", default="")
parser.add_argument("--grow-step", type=int, default=-1)
parser.add_argument("--step-sleep", type=float, default=0.0)
parser.add_argument("--hold-until-size", type=int, default=0)
args = parser.parse_args()

N, D, BATCH = 96, 8, 4
gen = torch.Generator().manual_seed(1234)
X = torch.randn(N, D, generator=gen, dtype=torch.float64)
Y = X @ torch.randn(D, 1, generator=gen, dtype=torch.float64) + 0.1

hvd.init()
WORKER = os.environ.get("HVDPROF_ELASTIC_WORKER", "?")
torch.manual_seed(7)
model = torch.nn.Linear(D, 1).double()
optimizer = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
    named_parameters=model.named_parameters(),
)
sampler = hvd.elastic.ElasticSampler(list(range(N)), shuffle=True, seed=1)
state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, steps=0, at_three=0)

if args.load:
    saved = torch.load(args.load, weights_only=False)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    sampler.load_state_dict(saved["sampler"])
    state.epoch, state.steps = saved["epoch"], saved["steps"]


def on_reset() -> None:
    if args.save_committed and hvd.rank() == 0 and not os.path.exists(args.save_committed):
        torch.save(
            {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "sampler": sampler.state_dict(),
                "epoch": state.epoch,
                "steps": state.steps,
            },
            args.save_committed,
        )


state.register_reset_callbacks([on_reset])


@hvd.elastic.run
def train(state: hvd.elastic.TorchState) -> None:
    while state.epoch < args.epochs:
        order = list(iter(state.sampler))
        for b in range(-(-len(order) // BATCH)):
            idx = order[b * BATCH : (b + 1) * BATCH]
            if args.kill_worker == WORKER and state.steps == args.kill_step:
                os.kill(os.getpid(), signal.SIGKILL)
            if args.grow_file and hvd.rank() == 0 and state.steps == args.grow_step:
                with open(args.grow_file, "w") as f:
                    f.write("localhost:3\n")
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(X[idx]), Y[idx])
            loss.backward()
            optimizer.step()
            state.sampler.record_batch(b, BATCH)
            state.steps += 1
            if hvd.size() == 3:
                state.at_three += 1
            # printed before commit(): its save() makes the batch committed even when its
            # host check then raises HostsUpdatedInterrupt (the batch is not trained again)
            print(f"COMMITTED {state.epoch} {json.dumps(idx)}", flush=True)
            state.commit()
            if args.step_sleep:
                time.sleep(args.step_sleep)
            held_until = time.monotonic() + 90
            while hvd.size() < args.hold_until_size and time.monotonic() < held_until:
                time.sleep(0.05)
                state.check_host_updates()  # raises HostsUpdatedInterrupt once it joined
            if args.grow_file and state.at_three >= 5:
                return
        state.epoch += 1
        state.sampler.set_epoch(state.epoch)
        state.commit()


train(state)
for r in hvd.elastic.resets:
    print(
        "RESET "
        + json.dumps({k: r[k] for k in ("generation", "old_size", "new_size", "reform_s")}),
        flush=True,
    )
print(f"FINAL size={hvd.size()} rank={hvd.rank()} steps={state.steps}", flush=True)
if hvd.rank() == 0:
    print("WEIGHTS " + json.dumps([p.tolist() for p in model.parameters()]), flush=True)
hvd.shutdown()
print("DONE", flush=True)
