"""What the hang diagnosis' stack capture costs a rank that is training.

    hvdprof run -np 2 -- python benchmarks/stack_capture_cost.py [--steps 300] [--rounds 6]

Two ranks train a small MLP (forward, backward, an allreduce per gradient), in blocks of
``--steps`` steps, rotating three kinds of block ``--rounds`` times (so drift in the
machine's load falls on every kind alike):

- ``off``: nothing else;
- ``request``: rank 0 asks rank 1 for its stack over the control channel once a second
  (what a stall report does: rank 1's cycle thread walks the main thread's frames and
  sends them; rank 0 captures its own too);
- ``sigusr1``: every rank gets SIGUSR1 once a second (the on-demand dump: formatted on
  the main thread, the training thread, and written to stderr).

Prints one JSON line (``RESULT {...}``) per rank: the median and mean step time per kind.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import threading
import time

import torch

import hvdprof.torch as hvd
from hvdprof.runtime import runtime as rt_module
from hvdprof.runtime.directives import ReportStacks

KINDS = ("off", "request", "sigusr1")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
        torch.nn.ReLU(), torch.nn.Linear(512, 10),
    )  # fmt: skip
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    loss_fn = torch.nn.CrossEntropyLoss()
    params = list(model.parameters())
    runtime = rt_module.get()

    mode = {"kind": "off"}
    stop = threading.Event()

    def ticker() -> None:  # once a second, what the block's kind asks for
        while not stop.wait(1.0):
            if mode["kind"] == "request" and hvd.rank() == 0:
                runtime.cycle.add_directive(ReportStacks((1,)))
            elif mode["kind"] == "sigusr1":
                os.kill(os.getpid(), signal.SIGUSR1)

    threading.Thread(target=ticker, daemon=True).start()

    def step() -> None:
        model.zero_grad()
        loss_fn(model(x), y).backward()
        handles = [
            hvd.allreduce_async_(p.grad, name=f"grad.{i}", op=hvd.Average)
            for i, p in enumerate(params)
        ]
        for h in handles:
            hvd.synchronize(h)

    for _ in range(50):  # warm up
        step()
    times: dict[str, list[float]] = {k: [] for k in KINDS}
    for _round in range(args.rounds):
        for kind in KINDS:
            hvd.barrier()
            mode["kind"] = kind
            for _ in range(args.steps):
                t0 = time.perf_counter()
                step()
                times[kind].append(time.perf_counter() - t0)
            mode["kind"] = "off"
    stop.set()
    hvd.barrier()
    result = {
        "rank": hvd.rank(),
        "steps_per_kind": len(times["off"]),
        **{
            f"{k}_ms": {
                "median": round(statistics.median(v) * 1000, 3),
                "mean": round(statistics.fmean(v) * 1000, 3),
            }
            for k, v in times.items()
        },
    }
    print("RESULT " + json.dumps(result), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
