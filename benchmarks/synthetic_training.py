"""Synthetic training throughput: hvdprof DistributedOptimizer against PyTorch DDP (Gloo).

In the spirit of Horovod's ``pytorch_synthetic_benchmark.py``, on two models that stress
different costs:

* ``conv``: a small conv net defined here (conv+BN+ReLU blocks, global pooling, a
  1000-way linear layer; about 1.4M parameters in 29 tensors), a fixed synthetic batch
  (32 x 3 x 64 x 64), cross-entropy: few, mostly large gradients;
* ``transformer``: a stack of 16 small pre-norm transformer encoder blocks (width 64,
  4 heads), a token embedding and a vocabulary head (about 0.67M parameters in 198
  tensors, half of them 512 bytes or less), next-token cross-entropy on 32 random
  sequences of 32 tokens: many small gradients, where per-tensor cost dominates.

Two copies of each model train in the same processes, with plain SGD:

* ``hvdprof``: ``hvd.DistributedOptimizer(SGD)`` (gradients averaged as backward produces
  them), after ``hvd.broadcast_parameters`` and ``hvd.broadcast_optimizer_state``;
* ``ddp``: ``torch.nn.parallel.DistributedDataParallel`` on the default Gloo group, with
  its defaults (25 MB buckets, ``broadcast_buffers=True``), and the same SGD;
* ``local`` (only with ``--local``): a third copy with plain SGD and no communication;
* ``hvdprof_per_gradient`` (only with ``--per-gradient``): ``DistributedOptimizer`` with
  one allreduce per gradient, as Horovod does (``HVDPROF_BUCKET_BYTES=0``), to show what
  the default buckets buy.

Threads are what a user gets: ``--threads 0`` (the default) leaves torch's setting to
the launcher (``hvdprof run``'s per-rank default, or the user's ``OMP_NUM_THREADS``).

All variants of all models alternate blocks of ``--block`` iterations, shuffled per round;
a block's time gives samples per second (all ranks: batch x ranks x iterations / time).
Each block also records the CPU time of every thread of the rank (from
``/proc/self/task/*/schedstat``): the main thread, hvdprof's cycle thread, and the rest
(Gloo's threads, OpenMP workers), per iteration. Goals (issue 47): hvdprof / ddp >= 1.05 for conv at 2 ranks, >= 1.0
otherwise.

    python benchmarks/synthetic_training.py [--np 2] [--steps 16] [--block 5] [--quick] [--load]
        [--models conv,transformer] [--local] [--per-gradient]
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from typing import Any

import _harness as h

NAME = "synthetic_training"
#: issue 47's goals, hvdprof / DDP by (model, ranks); 1.0 elsewhere
GOAL_VS_DDP = {("conv", 2): 1.05}
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


#: The second model: a stack of small transformer blocks (many small tensors).
TF_VOCAB, TF_DIM, TF_HEADS, TF_FFN, TF_LAYERS, TF_SEQ = 1000, 64, 4, 128, 16, 32


def make_transformer() -> Any:
    """Token embedding, ``TF_LAYERS`` small pre-norm encoder blocks, a vocabulary head.

    About 300 parameter tensors, most of them a few hundred bytes to a few tens of KiB:
    per-tensor cost (hooks, negotiation, fusion bookkeeping) dominates its gradients'
    communication, unlike the conv net's.
    """
    import torch
    from torch import nn

    class TinyTransformer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(TF_VOCAB, TF_DIM)
            self.pos = nn.Parameter(torch.zeros(TF_SEQ, TF_DIM))
            self.blocks = nn.ModuleList(
                nn.TransformerEncoderLayer(
                    TF_DIM, TF_HEADS, TF_FFN, dropout=0.0, batch_first=True, norm_first=True
                )
                for _ in range(TF_LAYERS)
            )
            self.norm = nn.LayerNorm(TF_DIM)
            self.head = nn.Linear(TF_DIM, TF_VOCAB)

        def forward(self, tokens: Any) -> Any:
            x = self.embed(tokens) + self.pos
            for block in self.blocks:
                x = block(x)
            return self.head(self.norm(x))

    return TinyTransformer()


def transformer_batch(batch: int, gen: Any) -> tuple[Any, Any]:
    """Random token sequences and next-token targets of ``TF_SEQ`` tokens."""
    import torch

    tokens = torch.randint(0, TF_VOCAB, (batch, TF_SEQ + 1), generator=gen)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def transformer_loss(model: Any, tokens: Any, targets: Any) -> Any:
    import torch.nn.functional as F

    logits = model(tokens)
    return F.cross_entropy(logits.reshape(-1, TF_VOCAB), targets.reshape(-1))


def thread_cpu_ns() -> dict[str, int]:
    """CPU time so far of this process's threads, by role: main, cycle, other."""
    roles = {t.native_id: t.name for t in threading.enumerate()}
    main_id = threading.main_thread().native_id
    out = {"main": 0, "cycle": 0, "other": 0}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):  # the thread exited meanwhile
            continue
        ident = int(tid)
        if ident == main_id:
            out["main"] += ns
        elif roles.get(ident) == "hvdprof-cycle":
            out["cycle"] += ns
        else:
            out["other"] += ns
    return out


class CpuMeter:
    """Per variant, each block's CPU ms per iteration by thread role (this rank)."""

    def __init__(self, iterations: int) -> None:
        self.iterations = iterations
        self.blocks: dict[str, list[dict[str, float]]] = {}
        self.enabled = os.path.exists("/proc/self/task")

    def reset(self) -> None:
        self.blocks.clear()

    def wrap(self, name: str, fn: Any) -> Any:
        if not self.enabled:
            return fn

        def measured() -> Any:
            before = thread_cpu_ns()
            out = fn()
            after = thread_cpu_ns()
            self.blocks.setdefault(name, []).append(
                {k: (after[k] - before[k]) / 1e6 / self.iterations for k in after}
            )
            return out

        return measured

    def medians(self) -> dict[str, dict[str, float]]:
        return {
            name: {
                k: round(statistics.median(b[k] for b in blocks), 2)
                for k in ("main", "cycle", "other")
            }
            for name, blocks in self.blocks.items()
        }


class PhaseMeter:
    """Per variant, each iteration's wall ms in forward, backward and ``step()`` (this rank),
    and for hvdprof the share of the step's allreduced bytes done before backward returned.

    Where a step's time goes: DDP waits for its last bucket inside backward, hvdprof in
    ``step()`` (``synchronize``); the overlap says how much communication backward hid.
    """

    def __init__(self) -> None:
        self.rows: dict[str, list[tuple[float, float, float, float]]] = {}

    def reset(self) -> None:
        self.rows.clear()

    def add(self, name: str, fwd: float, bwd: float, step: float, overlap: float) -> None:
        self.rows.setdefault(name, []).append((fwd * 1e3, bwd * 1e3, step * 1e3, overlap))

    def medians(self) -> dict[str, dict[str, float]]:
        keys = ("forward_ms", "backward_ms", "step_ms", "overlap")
        return {
            name: {k: round(statistics.median(r[i] for r in rows), 3) for i, k in enumerate(keys)}
            for name, rows in self.rows.items()
        }


def build(kind: str, rank: int, batch: int, image: int) -> tuple[Any, Any, Any]:
    """(model factory, inputs, loss function) of one of the two models."""
    import torch
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(1234 + rank)
    if kind == "conv":
        data = torch.randn(batch, 3, image, image, generator=gen)
        target = torch.randint(0, 1000, (batch,), generator=gen)

        def conv_loss(model: Any) -> Any:
            return F.cross_entropy(model(data), target)

        return make_model, data, conv_loss
    tokens, targets = transformer_batch(batch, gen)

    def tf_loss(model: Any) -> Any:
        return transformer_loss(model, tokens, targets)

    return make_transformer, tokens, tf_loss


def worker(args: Any) -> None:
    import torch
    import torch.distributed as dist

    import hvdprof.torch as hvd

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    hvd.init()
    h.init_baseline_group()
    rank, size = hvd.rank(), hvd.size()
    models = args.models.split(",")

    fns: dict[str, Any] = {}
    meters: dict[str, h.StatsMeter] = {}
    cpu = CpuMeter(args.block)
    phases = PhaseMeter()
    pairs: dict[str, tuple[Any, Any]] = {}
    info: dict[str, Any] = {}
    for kind in models:
        meters[kind] = h.StatsMeter()
        pairs[kind], info[kind] = add_model(args, kind, rank, fns, meters[kind], cpu, phases)
        h.log(
            f"{NAME}: {kind}: {info[kind]['params']:,} parameters in {info[kind]['tensors']} "
            f"tensors, batch {args.batch}, {args.block} iterations per block"
        )

    def after_warmup() -> None:
        for m in meters.values():
            m.reset()
        cpu.reset()
        phases.reset()

    samples = h.interleave(fns, args.steps, args.warmup, progress=h.log, after_warmup=after_warmup)
    samples = h.gather_slowest(samples)
    cpu_all: list[Any] = [None] * size
    dist.all_gather_object(cpu_all, cpu.medians())
    phases_all: list[Any] = [None] * size
    dist.all_gather_object(phases_all, phases.medians())
    checks = parameter_checks(pairs, size)
    if rank == 0:
        h.save_raw(
            {
                "samples": samples,
                "models": info,
                "hvdprof_per_block": {k: m.per_call() for k, m in meters.items()},
                "cpu_ms_per_iteration": {f"rank {r}": c for r, c in enumerate(cpu_all)},
                "phases_per_iteration": {f"rank {r}": c for r, c in enumerate(phases_all)},
                "checks": checks,
                "torch_threads": torch.get_num_threads(),
            }
        )
    h.finish_worker()


def add_model(
    args: Any,
    kind: str,
    rank: int,
    fns: dict[str, Any],
    meter: h.StatsMeter,
    cpu: CpuMeter,
    phases: PhaseMeter,
) -> tuple[tuple[Any, Any], dict[str, Any]]:
    """Three copies of one model from the same weights (hvdprof's DistributedOptimizer,
    DDP, and with ``--local`` no communication), their blocks of training iterations in
    ``fns``; returns ``((hvdprof's model, DDP's), the model's size)``."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    import hvdprof.torch as hvd

    def reduced_bytes() -> int:
        return int(hvd.runtime_stats().get("bytes_reduced", 0))

    factory, _, loss_fn = build(kind, rank, args.batch, args.image)
    torch.manual_seed(42)
    base = factory()
    model_h, model_d, model_l, model_g = factory(), factory(), factory(), factory()
    for m in (model_h, model_d, model_l, model_g):
        m.load_state_dict(base.state_dict())
    params = list(base.parameters())
    info = {
        "params": sum(p.numel() for p in params),
        "tensors": len(params),
        "median_tensor_bytes": int(statistics.median(p.numel() * p.element_size() for p in params)),
    }
    opt_h = hvd.DistributedOptimizer(
        torch.optim.SGD(model_h.parameters(), lr=args.lr),
        named_parameters=[(f"{kind}.{n}", p) for n, p in model_h.named_parameters()],
    )
    hvd.broadcast_parameters(
        {f"{kind}.{k}": v for k, v in model_h.state_dict().items()}, root_rank=0
    )
    hvd.broadcast_optimizer_state(opt_h, root_rank=0)
    # one allreduce per gradient (Horovod's way, HVDPROF_BUCKET_BYTES=0): every parameter
    # a group of its own, through the public API
    opt_g = hvd.DistributedOptimizer(
        torch.optim.SGD(model_g.parameters(), lr=args.lr),
        named_parameters=[(f"{kind}.g.{n}", p) for n, p in model_g.named_parameters()],
        groups=[[p] for p in model_g.parameters()],
    )
    ddp = DDP(model_d)
    opt_d = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    opt_l = torch.optim.SGD(model_l.parameters(), lr=args.lr)

    def train(model: Any, opt: Any, name: str, loss_fn: Any = loss_fn) -> None:
        clock = time.perf_counter
        counted = "/hvdprof" in name
        for _ in range(args.block):
            t0 = clock()
            opt.zero_grad()
            loss = loss_fn(model)
            t1 = clock()
            b0 = reduced_bytes() if counted else 0
            loss.backward()
            t2 = clock()
            b1 = reduced_bytes() if counted else 0
            opt.step()
            t3 = clock()
            b2 = reduced_bytes() if counted else 0
            phases.add(name, t1 - t0, t2 - t1, t3 - t2, (b1 - b0) / (b2 - b0) if b2 > b0 else 0.0)

    for variant, model, opt in (
        ("hvdprof", model_h, opt_h),
        ("ddp", ddp, opt_d),
        ("local", model_l, opt_l),
        ("hvdprof_per_gradient", model_g, opt_g),
    ):
        if (variant == "local" and not args.local) or (
            variant == "hvdprof_per_gradient" and not args.per_gradient
        ):
            continue
        name = f"{kind}/{variant}"
        fn = lambda m=model, o=opt, n=name, t=train: t(m, o, n)  # noqa: E731
        fns[name] = cpu.wrap(name, meter.wrap(fn) if variant.startswith("hvdprof") else fn)
    return (model_h, model_d), info


def parameter_checks(pairs: dict[str, tuple[Any, Any]], size: int) -> dict[str, Any]:
    """Sanity: each model is identical on every rank, and the two copies stayed close
    (same data, same averaged gradients, same number of SGD steps)."""
    import torch
    import torch.distributed as dist

    checks = {}
    for kind, (model_h, model_d) in pairs.items():
        with torch.no_grad():
            vec_h = torch.cat([p.reshape(-1) for p in model_h.parameters()])
            vec_d = torch.cat([p.reshape(-1) for p in model_d.parameters()])
            sums = [float(vec_h.double().sum()), float(vec_d.double().sum())]
            everyone: list[Any] = [None] * size
            dist.all_gather_object(everyone, sums)
            checks[kind] = {
                "ranks_agree": all(e == everyone[0] for e in everyone),
                "max_abs_param_diff_hvdprof_vs_ddp": float((vec_h - vec_d).abs().max()),
            }
    return checks


MODEL_DESCRIPTIONS = {
    "conv": f"conv3x3+BN+ReLU: stem {CHANNELS[0]} s2, stages {list(CHANNELS)} x2 (stride 2 "
    "from the 2nd), avgpool, linear 1000; input 3 x IMAGE x IMAGE",
    "transformer": f"embedding {TF_VOCAB} x {TF_DIM} + learned positions, {TF_LAYERS} pre-norm "
    f"TransformerEncoderLayer(d={TF_DIM}, heads={TF_HEADS}, ffn={TF_FFN}, dropout 0), "
    f"LayerNorm, linear {TF_VOCAB}; {TF_SEQ} tokens per sample",
}


def options() -> Any:
    p = h.parser(__doc__.splitlines()[0], steps=16, warmup=1)
    p.add_argument(
        "--block", type=int, default=5, help="iterations per interleaved block (default 5)"
    )
    p.add_argument("--batch", type=int, default=32, help="batch size per rank (default 32)")
    p.add_argument("--image", type=int, default=64, help="conv net image side (default 64)")
    p.add_argument("--lr", type=float, default=0.01, help="SGD learning rate (default 0.01)")
    p.add_argument(
        "--models",
        default="conv,transformer",
        help="comma-separated models to run: conv, transformer (default both)",
    )
    p.add_argument("--local", action="store_true", help="also time a no-communication copy")
    p.add_argument(
        "--per-gradient",
        action="store_true",
        help="also time hvdprof with one allreduce per gradient (HVDPROF_BUCKET_BYTES=0)",
    )
    p.add_argument(
        "--load",
        action="store_true",
        help="one spin loop per core beside the job (results in synthetic_training.loaded.json)",
    )
    return p


def main() -> None:
    p = options()
    args = p.parse_args()
    models = [m for m in args.models.split(",") if m]
    unknown = sorted(set(models) - set(MODEL_DESCRIPTIONS))
    if unknown or not models:
        p.error(f"--models: unknown model(s) {unknown}; choose from {sorted(MODEL_DESCRIPTIONS)}")
    if args.threads < 0:
        p.error("--threads must be 0 (the launcher's default) or a positive count")
    if args.worker:
        worker(args)
        return
    if args.quick:
        args.steps, args.warmup, args.block, args.batch = 2, 1, 2, 16
    timeout = args.timeout or (180 if args.quick else 1500)
    argv = [
        "--np", str(args.np), "--steps", str(args.steps), "--warmup", str(args.warmup),
        "--threads", str(args.threads), "--block", str(args.block), "--batch", str(args.batch),
        "--image", str(args.image), "--lr", str(args.lr), "--models", ",".join(models),
    ] + (["--local"] if args.local else []) + (
        ["--per-gradient"] if args.per_gradient else []
    )  # fmt: skip
    with h.spin_loops(args.load):
        data = h.run_job(__file__, argv, args.np, timeout=timeout)
    samples = data["samples"]
    summary = h.summarise(samples)
    per_block = args.batch * args.np * args.block
    rate = {v: round(per_block / (s["median_ms"] / 1e3), 2) for v, s in summary.items()}
    ratios: dict[str, Any] = {}
    for kind in models:
        unit = "img/sec" if kind == "conv" else "samples/sec"
        # samples/sec hvdprof / ddp is the inverse of the time ratio.
        t = h.ratio(samples, f"{kind}/ddp", f"{kind}/hvdprof")
        goal = GOAL_VS_DDP.get((kind, args.np), 1.0)
        ratios[f"{kind}: {unit} hvdprof / ddp"] = {
            **t,
            "goal": f">= {goal}",
            "met": t["of_medians"] >= goal,
        }
        if args.per_gradient:
            ratios[f"{kind}: hvdprof buckets / one allreduce per gradient"] = h.ratio(
                samples, f"{kind}/hvdprof_per_gradient", f"{kind}/hvdprof"
            )
        if args.local:
            ratios[f"{kind}: hvdprof / local (scaling efficiency)"] = h.ratio(
                samples, f"{kind}/local", f"{kind}/hvdprof"
            )
            ratios[f"{kind}: ddp / local (scaling efficiency)"] = h.ratio(
                samples, f"{kind}/local", f"{kind}/ddp"
            )
    bad = [k for k, c in data["checks"].items() if not c["ranks_agree"]]
    if bad:
        raise SystemExit(
            f"the ranks' parameters differ after training ({bad}): a synchronization bug"
        )
    print_tables(args, data, summary, rate, ratios, models)
    path = h.write_results(
        f"{NAME}.loaded" if args.load else NAME,
        {
            "settings": {
                "np": args.np,
                "load": "one spin loop per core" if args.load else "quiet",
                "blocks": args.steps,
                "warmup_blocks": args.warmup,
                "iterations_per_block": args.block,
                "quick": args.quick,
                "torch_threads_option": args.threads,
                "torch_threads_per_rank": data["torch_threads"],
                "batch_per_rank": args.batch,
                "image": [3, args.image, args.image],
                "models": {
                    k: {**data["models"][k], "description": MODEL_DESCRIPTIONS[k]} for k in models
                },
                "optimizer": f"SGD lr={args.lr}",
                "hvdprof": "DistributedOptimizer (op=Average) + broadcast_parameters/optimizer_state",
                "ddp": "DistributedDataParallel defaults on the default gloo group",
                "hvdprof_env": h.knob_env(),
                "timing": "per block: barrier, then wall time; slowest rank per block; medians",
                "cpu": "per block and thread role, CPU ms per iteration (schedstat); medians",
            },
            "variants": {v: {**summary[v], "samples_per_sec": rate[v]} for v in summary},
            "ratios": ratios,
            "cpu_ms_per_iteration": data["cpu_ms_per_iteration"],
            "phases_per_iteration": data["phases_per_iteration"],
            "hvdprof_per_block": data["hvdprof_per_block"],
            "checks": data["checks"],
            "job_wall_s": data["wall_s"],
        },
        args.output,
        args.quick,
    )
    print(f"\nwrote {path}")


def print_tables(
    args: Any,
    data: dict[str, Any],
    summary: dict[str, Any],
    rate: dict[str, float],
    ratios: dict[str, Any],
    models: list[str],
) -> None:
    """Time and CPU per variant, the phases of an iteration, the ratios, the checks."""
    print()
    print(
        f"{NAME}: {args.np} ranks, {data['torch_threads']} torch thread(s) per rank, batch "
        f"{args.batch}/rank, SGD; {args.steps} interleaved blocks of {args.block} iterations "
        f"after {args.warmup} warmup block(s)"
    )
    cpu0 = data["cpu_ms_per_iteration"].get("rank 0", {})
    rows = []
    for v in summary:
        c = cpu0.get(v, {})
        rows.append(
            (
                v,
                f"{summary[v]['median_ms'] / args.block:.1f}",
                f"{rate[v]:.1f}",
                summary[v]["n"],
                *(f"{c[k]:.1f}" if k in c else "-" for k in ("main", "cycle", "other")),
            )
        )
    print(
        h.table(
            rows,
            (
                "variant",
                "ms/iteration",
                "samples/sec (all ranks)",
                "blocks",
                "CPU ms/it main",
                "cycle",
                "other",
            ),
        )
    )
    print("(CPU: rank 0's threads, median over blocks; the cycle thread idles during ddp)")
    phases0 = data["phases_per_iteration"].get("rank 0", {})
    print()
    print(
        h.table(
            [
                (
                    v,
                    f"{p['forward_ms']:.1f}",
                    f"{p['backward_ms']:.1f}",
                    f"{p['step_ms']:.1f}",
                    f"{p['overlap']:.0%}" if v.endswith("/hvdprof") else "-",
                )
                for v, p in phases0.items()
            ],
            ("variant", "forward ms", "backward ms", "step() ms", "bytes done in backward"),
        )
    )
    print(
        "(rank 0, median per iteration: DDP waits for its last bucket inside backward, "
        "hvdprof in step())"
    )
    print()
    print(h.ratio_table(ratios))
    for kind in models:
        c = data["checks"][kind]
        print(
            f"{kind}: hvdprof per block {data['hvdprof_per_block'][kind]}; max |param hvdprof - "
            f"param ddp| {c['max_abs_param_diff_hvdprof_vs_ddp']:.3g}; ranks agree "
            f"{c['ranks_agree']}"
        )


if __name__ == "__main__":
    sys.exit(main())
