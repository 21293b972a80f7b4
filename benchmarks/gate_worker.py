"""The demo job with a known slowdown in its backward pass, for ``gate_calibration.py``.

``python gate_worker.py --slow-ms 0.5 --slow-rank 1 -- --steps 150`` trains
``hvdprof.demo`` unchanged, except that on rank 1 (``--slow-rank -1``: every rank) the
gradient of the first layer's output takes 0.5 ms longer: a busy wait in the backward
pass, which delays that layer's gradients and with them the step, as slower code would.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

import hvdprof.torch as hvd
from hvdprof import demo


def spin(ms: float) -> None:
    """Busy for ``ms`` (a sleep would give the core away, as slower code does not)."""
    end = time.perf_counter() + ms / 1000.0
    while time.perf_counter() < end:
        pass


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
