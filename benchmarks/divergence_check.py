"""What HVDPROF_CHECK_DIVERGENCE costs, on ResNet-50's parameters (25.6M float32).

Variants, interleaved in one job (2 ranks by default):

* ``optimizer_step``: ``DistributedOptimizer.step()`` with every gradient ready: the
  allreduce of the 161 gradients plus SGD with momentum (the part of a training step the
  runtime owns; forward and backward come on top);
* ``optimizer_step_checked``: the same with the divergence check in that step (N=1);
* ``check_only``: the check alone: checksums of weights and gradients, one allgather.

The ratio ``optimizer_step_checked / optimizer_step`` is the check's share of the
runtime's part of a step; the README compares ``check_only`` with whole training steps.

    python benchmarks/divergence_check.py [--np 2] [--steps 20] [--quick]
"""

from __future__ import annotations

from typing import Any

import _harness as h
from allreduce_resnet50 import EXPECTED_NUMEL, resnet50_param_shapes

NAME = "divergence_check"


def worker(args: Any) -> None:
    import torch

    import hvdprof.torch as hvd
    from hvdprof.torch.divergence import DivergenceCheck

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    hvd.init()
    h.init_baseline_group()
    torch.manual_seed(0)
    named = [
        (name, torch.nn.Parameter(torch.randn(shape) * 0.01))
        for name, shape in resnet50_param_shapes()
    ]
    params = [p for _, p in named]
    grads = [torch.randn(p.shape) * 1e-3 for p in params]

    def optimizer() -> Any:
        return hvd.DistributedOptimizer(
            torch.optim.SGD(params, lr=1e-3, momentum=0.9), named_parameters=named
        )

    plain, checked = optimizer(), optimizer()
    plain._divergence = None
    checked._divergence = DivergenceCheck(
        1, sorted(named), lambda t: hvd.allgather(t, name="hvdprof.divergence_check"), hvd.rank()
    )

    def with_grads(opt: Any) -> None:
        for p, g in zip(params, grads, strict=True):
            p.grad = g.clone()
        opt.step()

    def check_only() -> None:
        checked._divergence.check(None)

    variants = {
        "optimizer_step": lambda: with_grads(plain),
        "optimizer_step_checked": lambda: with_grads(checked),
        "check_only": check_only,
    }
    samples = h.interleave(variants, args.steps, args.warmup, progress=h.log)
    slowest = h.gather_slowest(samples)
    if hvd.rank() == 0:
        h.save_raw(
            {
                "samples": slowest,
                "hvdprof_backend": h.hvdprof_backend(),
                "diverged": checked._divergence.reported,
            }
        )
    h.finish_worker()


def main() -> None:
    p = h.parser(__doc__.splitlines()[0], steps=20, warmup=3)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    if args.quick:
        args.steps, args.warmup = 3, 1
    argv = [
        "--np", str(args.np), "--steps", str(args.steps), "--warmup", str(args.warmup),
        "--threads", str(args.threads),
    ]  # fmt: skip
    data = h.run_job(__file__, argv, args.np, timeout=args.timeout or 600)
    if data["diverged"]:
        raise SystemExit(f"the check reported a divergence in the benchmark: {data['diverged']}")
    samples = data["samples"]
    summary = h.summarise(samples)
    ratios = {
        "optimizer_step_checked / optimizer_step": h.ratio(
            samples, "optimizer_step_checked", "optimizer_step"
        )
    }
    print()
    print(
        f"{NAME}: ResNet-50's {EXPECTED_NUMEL:,} parameters, {args.np} ranks, hvdprof "
        f"{data['hvdprof_backend']}; {args.steps} interleaved rounds (median of the slowest rank)"
    )
    print(h.variant_table(summary))
    print()
    print(h.ratio_table(ratios))
    path = h.write_results(
        NAME,
        {
            "settings": {
                "np": args.np,
                "steps": args.steps,
                "warmup": args.warmup,
                "torch_threads_per_rank": h.threads_setting(args),
                "numel": EXPECTED_NUMEL,
                "optimizer": "SGD(lr=1e-3, momentum=0.9)",
            },
            "variants": summary,
            "ratios": ratios,
            "hvdprof_backend": data["hvdprof_backend"],
            "wall_s": data["wall_s"],
        },
        output=args.output,
        quick=args.quick,
    )
    print(f"results: {path}")


if __name__ == "__main__":
    main()
