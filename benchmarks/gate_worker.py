"""The demo job with a known slowdown in its backward pass, for ``gate_calibration.py``.

``python gate_worker.py --slow-ms 0.5 --slow-rank 1 -- --steps 150`` trains
``hvdprof.demo`` unchanged, except that on rank 1 (``--slow-rank -1``: every rank) the
gradient of the first layer's output takes 0.5 ms longer: extra compute in the backward
pass, which delays that layer's gradients and with them the step, as slower code would.

The extra time is torch compute (small matrix products), not a Python busy wait: a busy
wait holds the GIL, so the runtime's cycle thread could not run beside it and the step
grew by more than the wait (a 0.17-0.28 ms wait on rank 1 grew its compute by 0.58-0.68
ms, and gates measured +16% for a nominal 10%). A torch op releases the GIL as a real
layer's kernels do.

The products run until the training thread's CPU time (``time.thread_time``) has grown by
the set amount: slower code is more work, so on a busy machine it costs more wall time,
as the real thing would. Two earlier designs were each wrong somewhere: a count of
products calibrated before training ran about twice its nominal time (a product timed in
a tight loop, caches warm and the other rank idle, was twice as fast as one inside the
backward pass; gates measured +14% to +25% for a nominal 10%), and a deadline on the wall
clock is half its nominal work when the core is shared (``hvdprof ab --concurrent`` runs
both sides at once, so each rank has half a core): the step doubles, the injected wall
time does not, and the slowdown shrinks to half its share. The launcher gives each rank
cores // ranks intra-op threads: one per rank on the 2-core machine this was calibrated
on, so the products run on the calling thread and its CPU time counts them all. With
more threads a product may be split across them and the calling thread's CPU time
counts only its part, so the injected work would be larger than set.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

import hvdprof.torch as hvd
from hvdprof import demo

_A = torch.randn(128, 128)
_B = torch.randn(128, 128)


def spin(ms: float) -> None:
    """Compute until this thread has spent ``ms`` more of CPU time (a sleep would give the
    core away, as slower code does not; a Python loop would hold the GIL, as a torch
    kernel does not). It overshoots by at most one product (tens of microseconds)."""
    deadline = time.thread_time() + ms / 1000.0
    while True:
        torch.mm(_A, _B)
        if time.thread_time() >= deadline:
            return


class SlowGrad(torch.autograd.Function):
    """The identity, whose backward is slower by a set time."""

    ms = 0.0

    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        spin(SlowGrad.ms)
        return grad


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--slow-rank", type=int, default=-1, help="-1: every rank")
    p.add_argument("demo_args", nargs=argparse.REMAINDER)
    args = p.parse_args()
    rest = args.demo_args[1:] if args.demo_args[:1] == ["--"] else args.demo_args

    def prepare(model: nn.Module) -> None:
        if args.slow_ms > 0 and args.slow_rank in (-1, hvd.rank()):
            SlowGrad.ms = args.slow_ms
            first = next(iter(model.children()))
            first.register_forward_hook(lambda _m, _i, out: SlowGrad.apply(out))

    return demo.main(rest, prepare=prepare)


if __name__ == "__main__":
    raise SystemExit(main())
