"""Synthetic training throughput: hvdprof DistributedOptimizer against PyTorch DDP (Gloo).

In the spirit of Horovod's ``pytorch_synthetic_benchmark.py``: a small conv net defined
here (conv+BN+ReLU blocks, global pooling, a 1000-way linear layer; about 1.4M
parameters), a fixed synthetic batch (32 x 3 x 64 x 64, fixed seed), cross-entropy,
plain SGD. Two copies of the same model train in the same processes:

* ``hvdprof``: ``hvd.DistributedOptimizer(SGD)`` (gradients averaged as backward produces
  them), after ``hvd.broadcast_parameters`` and ``hvd.broadcast_optimizer_state``;
* ``ddp``: ``torch.nn.parallel.DistributedDataParallel`` on the default Gloo group, with
  its defaults (25 MB buckets, ``broadcast_buffers=True``), and the same SGD;
* ``local`` (only with ``--local``): a third copy with plain SGD and no communication
  (each rank trains alone), for context. On this shared, overloaded machine it came out
  *slower* than both distributed variants, so it is no ceiling here and is off by default.

They alternate blocks of ``--block`` iterations; a block's time gives images per second
(all ranks: batch x ranks x iterations / time). Goal: hvdprof / ddp >= 1.0.

    python benchmarks/synthetic_training.py [--np 2] [--steps 16] [--block 5] [--quick]
"""

from __future__ import annotations

import sys
from typing import Any

import _harness as h

NAME = "synthetic_training"
CHANNELS = (32, 64, 128, 256)


def make_model(num_classes: int = 1000) -> Any:
    from torch import nn

    def block(cin: int, cout: int, stride: int) -> list[Any]:
        return [
            nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(inplace=True),
        ]

    layers = block(3, CHANNELS[0], 2)  # stem: 64x64 -> 32x32
    cin = CHANNELS[0]
    for i, c in enumerate(CHANNELS):
        layers += block(cin, c, 1 if i == 0 else 2)
        layers += block(c, c, 1)
        cin = c
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes)]
    return nn.Sequential(*layers)


def worker(args: Any) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    import hvdprof.torch as hvd

    torch.set_num_threads(args.threads)
    hvd.init()
    h.init_baseline_group()
    rank, size = hvd.rank(), hvd.size()

    torch.manual_seed(42)
    base = make_model()
    model_h = make_model()
    model_h.load_state_dict(base.state_dict())
    model_d = make_model()
    model_d.load_state_dict(base.state_dict())
    model_l = make_model()
    model_l.load_state_dict(base.state_dict())
    opt_l = torch.optim.SGD(model_l.parameters(), lr=args.lr)
    params = sum(p.numel() for p in base.parameters())

    opt_h = hvd.DistributedOptimizer(
        torch.optim.SGD(model_h.parameters(), lr=args.lr),
        named_parameters=model_h.named_parameters(),
    )
    hvd.broadcast_parameters(model_h.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt_h, root_rank=0)
    ddp = DDP(model_d)
    opt_d = torch.optim.SGD(ddp.parameters(), lr=args.lr)

    gen = torch.Generator().manual_seed(1234 + rank)
    data = torch.randn(args.batch, 3, args.image, args.image, generator=gen)
    target = torch.randint(0, 1000, (args.batch,), generator=gen)

    def train(model: Any, opt: Any) -> None:
        for _ in range(args.block):
            opt.zero_grad()
            loss = F.cross_entropy(model(data), target)
            loss.backward()
            opt.step()

    meter = h.StatsMeter()
    fns = {
        "hvdprof": meter.wrap(lambda: train(model_h, opt_h)),
        "ddp": lambda: train(ddp, opt_d),
    }
    if args.local:
        fns["local"] = lambda: train(model_l, opt_l)
    h.log(
        f"{NAME}: {params:,} parameters, batch {args.batch} x 3 x {args.image} x {args.image}, "
        f"{args.block} iterations per block"
    )
    samples = h.interleave(fns, args.steps, args.warmup, progress=h.log, after_warmup=meter.reset)
    samples = h.gather_slowest(samples)

    # Sanity: each model is identical on every rank, and the two stayed close together
    # (same data, same averaged gradients, same number of SGD steps).
    with torch.no_grad():
        vec_h = torch.cat([p.reshape(-1) for p in model_h.parameters()])
        vec_d = torch.cat([p.reshape(-1) for p in model_d.parameters()])
        sums = [float(vec_h.double().sum()), float(vec_d.double().sum())]
        everyone: list[Any] = [None] * size
        dist.all_gather_object(everyone, sums)
        ranks_agree = all(e == everyone[0] for e in everyone)
        max_diff = float((vec_h - vec_d).abs().max())
    if rank == 0:
        h.save_raw(
            {
                "samples": samples,
                "params": params,
                "hvdprof_per_block": meter.per_call(),
                "ranks_agree": ranks_agree,
                "max_abs_param_diff_hvdprof_vs_ddp": max_diff,
            }
        )
    h.finish_worker()


def main() -> None:
    p = h.parser(__doc__.splitlines()[0], steps=16, warmup=1)
    p.add_argument(
        "--block", type=int, default=5, help="iterations per interleaved block (default 5)"
    )
    p.add_argument("--batch", type=int, default=32, help="batch size per rank (default 32)")
    p.add_argument("--image", type=int, default=64, help="image side (default 64)")
    p.add_argument("--lr", type=float, default=0.01, help="SGD learning rate (default 0.01)")
    p.add_argument("--local", action="store_true", help="also time a no-communication copy")
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    if args.quick:
        args.steps, args.warmup, args.block, args.batch = 2, 1, 2, 16
    timeout = args.timeout or (120 if args.quick else 900)
    argv = [
        "--np", str(args.np), "--steps", str(args.steps), "--warmup", str(args.warmup),
        "--threads", str(args.threads), "--block", str(args.block), "--batch", str(args.batch),
        "--image", str(args.image), "--lr", str(args.lr),
    ] + (["--local"] if args.local else [])  # fmt: skip
    data = h.run_job(__file__, argv, args.np, timeout=timeout)
    samples = data["samples"]
    summary = h.summarise(samples)
    images = args.batch * args.np * args.block
    img_s = {v: round(images / (s["median_ms"] / 1e3), 2) for v, s in summary.items()}
    # img/sec ratio hvdprof / ddp is the inverse of the time ratio.
    t = h.ratio(samples, "ddp", "hvdprof")
    ratio = {**t, "goal": ">= 1.0", "met": t["of_medians"] >= 1.0}
    ratios = {"img/sec hvdprof / ddp": ratio}
    if "local" in samples:
        ratios["img/sec hvdprof / local (scaling efficiency)"] = h.ratio(
            samples, "local", "hvdprof"
        )
        ratios["img/sec ddp / local (scaling efficiency)"] = h.ratio(samples, "local", "ddp")
    if not data["ranks_agree"]:
        raise SystemExit("the ranks' parameters differ after training: a synchronization bug")

    print()
    print(
        f"{NAME}: {data['params']:,} params, batch {args.batch}/rank of 3x{args.image}x{args.image}, "
        f"SGD, {args.np} ranks; {args.steps} interleaved blocks of {args.block} iterations "
        f"after {args.warmup} warmup block(s)"
    )
    rows = [
        (v, f"{summary[v]['median_ms'] / args.block:.1f}", f"{img_s[v]:.1f}", summary[v]["n"])
        for v in summary
    ]
    print(h.table(rows, ("variant", "ms/iteration", "img/sec (all ranks)", "blocks")))
    if "local" in summary:
        print("(local: each rank trains alone, no communication; img/sec counts all ranks' images)")
    print()
    print(h.ratio_table(ratios))
    print(f"hvdprof per block: {data['hvdprof_per_block']}")
    print(
        f"max |param hvdprof - param ddp| after training: "
        f"{data['max_abs_param_diff_hvdprof_vs_ddp']:.3g}; ranks agree: {data['ranks_agree']}"
    )

    path = h.write_results(
        NAME,
        {
            "settings": {
                "np": args.np,
                "blocks": args.steps,
                "warmup_blocks": args.warmup,
                "iterations_per_block": args.block,
                "quick": args.quick,
                "torch_threads_per_rank": args.threads,
                "batch_per_rank": args.batch,
                "image": [3, args.image, args.image],
                "params": data["params"],
                "model": f"conv3x3+BN+ReLU: stem {CHANNELS[0]} s2, stages {list(CHANNELS)} x2 "
                "(stride 2 from the 2nd), avgpool, linear 1000",
                "optimizer": f"SGD lr={args.lr}",
                "hvdprof": "DistributedOptimizer (op=Average) + broadcast_parameters/optimizer_state",
                "ddp": "DistributedDataParallel defaults on the default gloo group",
                "hvdprof_env": h.knob_env(),
                "timing": "per block: barrier, then wall time; slowest rank per block; medians",
            },
            "variants": {v: {**summary[v], "img_per_sec": img_s[v]} for v in summary},
            "ratios": ratios,
            "hvdprof_per_block": data["hvdprof_per_block"],
            "checks": {
                "ranks_agree": data["ranks_agree"],
                "max_abs_param_diff_hvdprof_vs_ddp": data["max_abs_param_diff_hvdprof_vs_ddp"],
            },
            "job_wall_s": data["wall_s"],
        },
        args.output,
        args.quick,
    )
    print(f"\nwrote {path}")


if __name__ == "__main__":
    sys.exit(main())
