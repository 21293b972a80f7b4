"""Many small tensors: 2,000 x 256 float32 (2 MB), summed, hvdprof against torch.distributed.

* ``per_tensor_async``: ``dist.all_reduce(t, async_op=True)`` for each tensor, then wait
  on all (about 1.3 ms per op on Gloo: seconds per step, so it runs in few rounds);
* ``flat``: one ``dist.all_reduce`` of a preallocated flat tensor of the same bytes;
* ``hvdprof``: ``hvd.allreduce_async_(t, name=..., op=hvd.Sum)`` x 2,000, then
  ``hvd.synchronize`` on every handle.

Reported: hvdprof's speed-up over per-tensor (goal >= 50x), hvdprof / flat, hvdprof's
own cost per tensor, (hvdprof - flat) / 2000, in microseconds, and where that cost goes:
rank 0's CPU per op on the training thread (submit and wait) and on the cycle thread by
stage (negotiate, perform, account), read from thread CPU clocks.

    python benchmarks/small_tensors.py [--np 2] [--steps 40] [--per-tensor-steps 5] [--quick]
        [--load]

``--load`` runs one Python spin loop per core beside the job (results in
``small_tensors.loaded.json``).
"""

from __future__ import annotations

import sys
from typing import Any

import _harness as h

NAME = "small_tensors"
VARIANTS = ("per_tensor_async", "flat", "hvdprof")


def worker(args: Any) -> None:
    import torch
    import torch.distributed as dist

    import hvdprof.torch as hvd

    if args.threads > 0:  # 0: the launcher's default, as a user runs
        torch.set_num_threads(args.threads)
    hvd.init()
    h.init_baseline_group()
    rank, size = hvd.rank(), hvd.size()
    n, numel = args.tensors, args.numel
    tensors = [torch.zeros(numel) for _ in range(n)]
    names = [f"small.{i}" for i in range(n)]
    flat = torch.zeros(n * numel)

    def run_flat() -> None:
        dist.all_reduce(flat)

    def run_per_tensor() -> None:
        works = [dist.all_reduce(t, async_op=True) for t in tensors]
        for w in works:
            w.wait()

    def run_hvdprof() -> None:
        handles = [
            hvd.allreduce_async_(t, name=names[i], op=hvd.Sum) for i, t in enumerate(tensors)
        ]
        for handle in handles:
            hvd.synchronize(handle)

    fns = {"per_tensor_async": run_per_tensor, "flat": run_flat, "hvdprof": run_hvdprof}

    # Correctness: hvdprof (and the cheap baseline) must give the sum over ranks.
    expected = size * (size + 1) / 2
    for name in ("flat", "hvdprof"):
        for i, t in enumerate(tensors):
            t.fill_((rank + 1) * (i % 5 + 1))
        flat.fill_(rank + 1)
        fns[name]()
        ok = (
            bool(torch.all(flat == expected))
            if name == "flat"
            else all(bool(torch.all(t == expected * (i % 5 + 1))) for i, t in enumerate(tensors))
        )
        if not ok:
            raise SystemExit(f"rank {rank}: variant {name} produced a wrong sum")
    for t in tensors:
        t.zero_()
    flat.zero_()
    h.log(f"{NAME}: {n} x {numel} float32 ({n * numel * 4 / 1e6:.1f} MB); sums verified")

    meter = h.StatsMeter()
    fns["hvdprof"] = meter.wrap(run_hvdprof)
    samples = h.interleave(
        fns,
        args.steps,
        args.warmup,
        counts={"per_tensor_async": args.per_tensor_steps},
        warmup_counts={"per_tensor_async": min(1, args.warmup)},
        progress=h.log,
        after_warmup=meter.reset,
    )
    samples = h.gather_slowest(samples)
    if rank == 0:
        h.save_raw(
            {
                "samples": samples,
                "hvdprof_per_step": meter.per_call(),
                "hvdprof_cpu_per_op_us": meter.cpu_per_op(n),
                "hvdprof_backend": h.hvdprof_backend(),
            }
        )
    h.finish_worker()


def main() -> None:
    p = h.parser(__doc__.splitlines()[0], steps=40, warmup=5)
    p.add_argument("--tensors", type=int, default=2000, help="number of tensors (default 2000)")
    p.add_argument("--numel", type=int, default=256, help="float32 per tensor (default 256)")
    p.add_argument(
        "--per-tensor-steps",
        type=int,
        default=5,
        help="timed rounds in which per_tensor_async runs (spread over --steps; default 5)",
    )
    p.add_argument(
        "--load",
        action="store_true",
        help="one spin loop per core beside the job (results in small_tensors.loaded.json)",
    )
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    if args.quick:
        args.steps, args.warmup, args.per_tensor_steps = 8, 2, 1
    args.per_tensor_steps = max(1, min(args.per_tensor_steps, args.steps))
    timeout = args.timeout or (120 if args.quick else 900)
    argv = [
        "--np", str(args.np), "--steps", str(args.steps), "--warmup", str(args.warmup),
        "--threads", str(args.threads), "--tensors", str(args.tensors), "--numel", str(args.numel),
        "--per-tensor-steps", str(args.per_tensor_steps),
    ]  # fmt: skip
    with h.spin_loops(args.load):
        data = h.run_job(__file__, argv, args.np, timeout=timeout)
    samples = data["samples"]
    summary = h.summarise(samples)

    speedup = h.ratio(samples, "per_tensor_async", "hvdprof")
    speedup["goal"] = ">= 50"
    speedup["met"] = speedup["of_medians"] >= 50
    vs_flat = h.ratio(samples, "hvdprof", "flat")
    ratios = {"per_tensor_async / hvdprof (speed-up)": speedup, "hvdprof / flat": vs_flat}
    overhead_us = (
        (summary["hvdprof"]["median_ms"] - summary["flat"]["median_ms"]) * 1e3 / args.tensors
    )
    hv_stats = data["hvdprof_per_step"]

    print()
    print(
        f"{NAME}: {args.tensors} x {args.numel} float32, sum, {args.np} ranks; baselines "
        f"Gloo, hvdprof {data['hvdprof_backend']}; "
        f"{args.steps} interleaved rounds after {args.warmup} warmup, per_tensor_async in "
        f"{args.per_tensor_steps} of them (median of the slowest rank)"
    )
    print(h.variant_table(summary))
    print()
    print(h.ratio_table(ratios))
    print(f"hvdprof cost per tensor: (hvdprof - flat) / {args.tensors} = {overhead_us:.1f} us")
    print(f"hvdprof per step: {hv_stats}")
    cpu = data["hvdprof_cpu_per_op_us"]
    print(
        "hvdprof's own CPU per op on rank 0 (us): "
        + ", ".join(f"{k.replace('_', ' ')} {v:.2f}" for k, v in cpu.items())
    )

    path = h.write_results(
        f"{NAME}.loaded" if args.load else NAME,
        {
            "settings": {
                "np": args.np,
                "load": "one spin loop per core" if args.load else "quiet",
                "steps": args.steps,
                "warmup": args.warmup,
                "per_tensor_steps": args.per_tensor_steps,
                "per_tensor_warmup": min(1, args.warmup),
                "quick": args.quick,
                "torch_threads_per_rank": h.threads_setting(args),
                "tensors": args.tensors,
                "numel_per_tensor": args.numel,
                "dtype": "float32",
                "reduce_op": "sum (hvd.Sum for hvdprof, ReduceOp.SUM for the baselines)",
                "baseline_group": "torch.distributed default group, gloo, default options",
                "hvdprof_env": h.knob_env(),
                "timing": "per step: barrier, then wall time; slowest rank per round; medians",
            },
            "variants": summary,
            "ratios": ratios,
            "hvdprof_cost_per_tensor_us": round(overhead_us, 2),
            "hvdprof_per_step": hv_stats,
            "hvdprof_cpu_per_op_us": cpu,
            "hvdprof_backend": data["hvdprof_backend"],
            "job_wall_s": data["wall_s"],
        },
        args.output,
        args.quick,
    )
    print(f"\nwrote {path}")


if __name__ == "__main__":
    sys.exit(main())
