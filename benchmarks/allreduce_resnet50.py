"""Allreduce of ResNet-50's gradient list: hvdprof against torch.distributed (Gloo).

161 tensors, 25,557,032 float32 (102 MB), summed over the ranks, one "step" per variant:

* ``flat``: one ``dist.all_reduce`` of a preallocated flat tensor of the same bytes;
* ``flat_cat``: ``dist.all_reduce(torch.cat(grads))``, the naive flat of ANCHORS.md
  (a fresh concatenation every step, never copied back), for context only;
* ``per_tensor_async``: ``dist.all_reduce(t, async_op=True)`` for every tensor, then wait;
* ``hand_buckets``: DDP's bucket sizes packed by this script (not DDP): buckets in reverse
  (backward) order, 1 MB for the first and 25 MB for the rest, each packed with
  ``torch.cat`` into its bucket buffer, reduced asynchronously as soon as it is packed,
  then, once all are done, copied back into the gradients: communication alone, like the
  rows above;
* ``hvdprof``: ``hvd.allreduce_async_(t, name=..., op=hvd.Sum)`` for every tensor, then
  ``hvd.synchronize`` on every handle;
* ``hvdprof_flat``: ``hvd.allreduce_`` of the preallocated flat tensor: hvdprof's own
  engine with nothing to fuse, so ``hvdprof / hvdprof_flat`` is the cost of fusion alone
  (``hvdprof / flat`` also includes the engine: on one host hvdprof reduces through
  shared memory, where ``flat`` goes through Gloo's TCP loopback).

And a training step's backward, the same in each of three (a module holding parameters of
ResNet-50's shapes, ``loss = (rank + 1) * sum(p.sum())``, ``zero_grad``, forward,
backward): the gradients averaged as a user gets them from each library:

* ``ddp``: the module wrapped in real ``torch.nn.parallel.DistributedDataParallel``
  (its defaults: 25 MB buckets, reduced from autograd hooks while backward runs);
* ``hvdprof_optimizer``: ``hvd.DistributedOptimizer`` (Horovod's hooks, one
  ``allreduce_async_`` per gradient) and ``synchronize()``;
* ``backward``: no communication, for context (what the step costs without it).

The baselines use the default torch.distributed group; hvdprof uses its own. All nine run
interleaved in the same processes. Then, unless ``--no-sweep``, separate launches vary
HVDPROF_FUSION_THRESHOLD, HVDPROF_MAX_INFLIGHT and HVDPROF_BACKEND, timing ``flat`` and
``hvdprof`` interleaved within each launch (comparisons between launches are not
interleaved; the configs take turns over ``--sweep-repeats`` rounds of launches to
spread the drift).

    python benchmarks/allreduce_resnet50.py [--np 2] [--steps 40] [--quick] [--no-sweep]
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import _harness as h

NAME = "allreduce_resnet50"
EXPECTED_NUMEL = 25_557_032
EXPECTED_TENSORS = 161
BUCKET_BYTES = 25 * 1024 * 1024  # DDP's default bucket_cap_mb
FIRST_BUCKET_BYTES = 1024 * 1024  # DDP's first bucket is small, so the first reduce starts early
VARIANTS = (
    "flat",
    "flat_cat",
    "per_tensor_async",
    "hand_buckets",
    "hvdprof",
    "hvdprof_flat",
    "ddp",
    "hvdprof_optimizer",
    "backward",
)
#: the variants that run a backward pass (their modules are built only when asked for)
BACKWARD_VARIANTS = ("ddp", "hvdprof_optimizer", "backward")
MiB = 1024 * 1024

#: (HVDPROF_FUSION_THRESHOLD, HVDPROF_MAX_INFLIGHT, HVDPROF_BACKEND) for the sweep; the
#: default is 4 MiB, 4, auto (shared memory on one host). In-flight buffers matter to
#: Gloo only: shared-memory reductions finish inside the call.
SWEEP = [
    (4 * MiB, 4, "auto"),
    (16 * MiB, 4, "auto"),
    (64 * MiB, 4, "auto"),
    (4 * MiB, 4, "gloo"),
    (16 * MiB, 4, "gloo"),
    (64 * MiB, 4, "gloo"),
    (16 * MiB, 1, "gloo"),
    (16 * MiB, 8, "gloo"),
]
QUICK_SWEEP = [(64 * MiB, 4, "gloo")]

#: The default-threads case (see ``run_threads``): launched as mpirun or srun would, with
#: no thread variable and no launcher default, so torch starts one thread per core. The
#: variants differ only in intra-op threads, switched between steps in one process, so
#: they are interleaved: the user's thread at 1 (the best setting), the user's thread at
#: torch's default (what a user gets), and that plus the cycle thread uncapped (the
#: runtime before it capped its own team: the cost the cap removes).
THREAD_VARIANTS = ("hvdprof_threads_1", "hvdprof_threads_default", "hvdprof_cycle_uncapped")
THREADS_GOAL = 1.10


def resnet50_param_shapes() -> list[tuple[str, tuple[int, ...]]]:
    """Weights and biases of torchvision's ResNet-50 (v1.5), in ``named_parameters`` order.

    BatchNorm running statistics are buffers, not gradients, so they are not listed.
    """
    shapes: list[tuple[str, tuple[int, ...]]] = []

    def bn(name: str, c: int) -> None:
        shapes.append((f"{name}.weight", (c,)))
        shapes.append((f"{name}.bias", (c,)))

    shapes.append(("conv1.weight", (64, 3, 7, 7)))
    bn("bn1", 64)
    inplanes = 64
    for layer, (planes, blocks) in enumerate(
        zip((64, 128, 256, 512), (3, 4, 6, 3), strict=True), 1
    ):
        for b in range(blocks):
            p = f"layer{layer}.{b}"
            width, out = planes, planes * 4
            shapes.append((f"{p}.conv1.weight", (width, inplanes, 1, 1)))
            bn(f"{p}.bn1", width)
            shapes.append((f"{p}.conv2.weight", (width, width, 3, 3)))
            bn(f"{p}.bn2", width)
            shapes.append((f"{p}.conv3.weight", (out, width, 1, 1)))
            bn(f"{p}.bn3", out)
            if b == 0:
                shapes.append((f"{p}.downsample.0.weight", (out, inplanes, 1, 1)))
                bn(f"{p}.downsample.1", out)
            inplanes = out
    shapes.append(("fc.weight", (1000, 2048)))
    shapes.append(("fc.bias", (1000,)))
    return shapes


def check_shapes(shapes: list[tuple[str, tuple[int, ...]]]) -> int:
    numel = 0
    for _, shape in shapes:
        n = 1
        for d in shape:
            n *= d
        numel += n
    if len(shapes) != EXPECTED_TENSORS or numel != EXPECTED_NUMEL:
        raise AssertionError(
            f"ResNet-50 shapes are wrong: {len(shapes)} tensors, {numel} elements "
            f"(expected {EXPECTED_TENSORS}, {EXPECTED_NUMEL})"
        )
    return numel


# --------------------------------------------------------------------------- worker


class HandBuckets:
    """DDP's bucket sizes packed by hand, minus autograd: pack buckets, reduce each async,
    wait, unpack. Not DDP (the ``ddp`` variant is): communication alone."""

    def __init__(self, grads: list[Any], cap_bytes: int, first_cap_bytes: int) -> None:
        import torch

        groups: list[list[Any]] = []
        current: list[Any] = []
        size = 0
        for g in reversed(grads):  # gradients become ready in reverse order
            current.append(g)
            size += g.numel() * g.element_size()
            if size >= (first_cap_bytes if not groups else cap_bytes):
                groups.append(current)
                current, size = [], 0
        if current:
            groups.append(current)
        self.buckets = [
            (members, torch.empty(sum(g.numel() for g in members), dtype=members[0].dtype))
            for members in groups
        ]

    def step(self) -> None:
        import torch
        import torch.distributed as dist

        works = []
        for members, buf in self.buckets:
            torch.cat([g.view(-1) for g in members], out=buf)
            works.append(dist.all_reduce(buf, async_op=True))
        for (members, buf), work in zip(self.buckets, works, strict=True):
            work.wait()
            for g, chunk in zip(members, buf.split([g.numel() for g in members]), strict=True):
                g.view(-1).copy_(chunk)


def parameters_module(shapes: list[tuple[str, tuple[int, ...]]]) -> Any:
    """A module holding zero parameters of ``shapes`` (in that order) whose forward is the
    sum of all of them: backward then gives every gradient, last parameter first."""
    import torch

    class Parameters(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weights = torch.nn.ParameterList(
                torch.nn.Parameter(torch.zeros(shape)) for _, shape in shapes
            )

        def forward(self) -> Any:
            return sum(p.sum() for p in self.weights)

    return Parameters()


class BackwardSteps:
    """The training-step variants: one module per variant, built only for the variants
    asked for (each is 102 MB of parameters and as much again of gradients); a step is
    ``zero_grad``, forward, backward of ``(rank + 1) * sum(p.sum())``."""

    def __init__(
        self, shapes: list[tuple[str, tuple[int, ...]]], rank: int, which: list[str]
    ) -> None:
        import torch

        import hvdprof.torch as hvd

        self.scale = float(rank + 1)
        self.modules: dict[str, Any] = {}
        self.fns: dict[str, Callable[[], None]] = {}
        for name in which:
            module = parameters_module(shapes)
            self.modules[name] = module
            opt = None
            called = module
            if name == "ddp":  # the real thing, with its defaults, on the default group
                called = torch.nn.parallel.DistributedDataParallel(module)
            elif name == "hvdprof_optimizer":
                opt = hvd.DistributedOptimizer(
                    torch.optim.SGD(module.parameters(), lr=0.0),
                    named_parameters=module.named_parameters(),
                )
            self.fns[name] = self._step(called, module, opt)

    def _step(self, called: Any, module: Any, opt: Any) -> Callable[[], None]:
        def step() -> None:
            module.zero_grad(set_to_none=True)
            (called() * self.scale).backward()
            if opt is not None:
                opt.synchronize()  # what step() waits for (the update itself is not timed)

        return step

    def verify(self, size: int) -> None:
        """Each variant's gradients: the mean of the ranks' (rank + 1), or this rank's own
        without communication (exits if not)."""
        for name, module in self.modules.items():
            self.fns[name]()
            want = self.scale if name == "backward" else (size + 1) / 2
            bad = [n for n, p in module.named_parameters() if not bool((p.grad == want).all())]
            if bad:
                raise SystemExit(f"variant {name}: gradients of {bad[:3]} are not {want}")


class ContextSwitches:
    """Context switches of this rank's process per step, per variant (median).

    The thread variants' wall times drown in a loaded machine's noise, but an OpenMP
    team oversubscribing the cores shows as many more switches per step whatever else
    runs: every parallel region's join waits for a thread that was preempted.
    """

    def __init__(self) -> None:
        self.counts: dict[str, list[int]] = {}

    def reset(self) -> None:
        self.counts.clear()

    def wrap(self, name: str, fn: Any) -> Any:
        import resource

        def counted() -> None:
            before = resource.getrusage(resource.RUSAGE_SELF)
            fn()
            after = resource.getrusage(resource.RUSAGE_SELF)
            switched = after.ru_nvcsw - before.ru_nvcsw + after.ru_nivcsw - before.ru_nivcsw
            self.counts.setdefault(name, []).append(switched)

        return counted

    def medians(self) -> dict[str, float]:
        import statistics

        return {name: statistics.median(c) for name, c in self.counts.items() if c}


def worker(args: Any) -> None:
    import torch
    import torch.distributed as dist

    import hvdprof.torch as hvd

    if args.threads > 0:  # 0: torch's own default (the thread comparison's launches)
        torch.set_num_threads(args.threads)
    hvd.init()
    h.init_baseline_group()
    rank, size = hvd.rank(), hvd.size()
    variants = [v for v in args.variants.split(",") if v]

    shapes = resnet50_param_shapes()
    numel = check_shapes(shapes)
    grads = [torch.zeros(shape) for _, shape in shapes]
    names = [f"grad.{name}" for name, _ in shapes]
    flat = torch.zeros(numel)
    flat_hv = torch.zeros(numel)
    ddp = HandBuckets(grads, BUCKET_BYTES, FIRST_BUCKET_BYTES)
    fns = variant_steps(grads, names, flat, flat_hv, ddp)
    steps = BackwardSteps(shapes, rank, [v for v in variants if v in BACKWARD_VARIANTS])
    fns.update(steps.fns)
    verify_sums(fns, variants, grads, flat, flat_hv, rank, size)
    steps.verify(size)
    h.log(
        f"{NAME}: {len(grads)} tensors, {numel:,} float32, {numel * 4 / 1e6:.1f} MB; "
        f"{len(ddp.buckets)} hand buckets; sums verified for {', '.join(variants)}"
    )

    meter = h.StatsMeter()
    fns["hvdprof"] = meter.wrap(fns["hvdprof"])
    switches = ContextSwitches()
    for name in THREAD_VARIANTS:
        fns[name] = switches.wrap(name, fns[name])

    def after_warmup() -> None:
        meter.reset()
        switches.reset()

    samples = h.interleave(
        {v: fns[v] for v in variants},
        args.steps,
        args.warmup,
        progress=h.log,
        after_warmup=after_warmup,
    )
    samples = h.gather_slowest(samples)
    every_rank: list[Any] = [None] * size
    dist.all_gather_object(every_rank, switches.medians())
    if rank == 0:
        h.save_raw(
            {
                "samples": samples,
                "hvdprof_per_step": meter.per_call(),
                "hand_buckets": [len(m) for m, _ in ddp.buckets],
                "hvdprof_backend": h.hvdprof_backend(),
                "context_switches": every_rank,
            }
        )
    h.finish_worker()


def variant_steps(
    grads: list[Any], names: list[str], flat: Any, flat_hv: Any, ddp: HandBuckets
) -> dict[str, Callable[[], None]]:
    """One step of each variant: reducing every gradient (or the flat buffer) once."""
    import torch
    import torch.distributed as dist

    import hvdprof.torch as hvd

    order = list(range(len(grads)))[::-1]  # the order backward produces gradients

    def run_flat() -> None:
        dist.all_reduce(flat)

    def run_flat_cat() -> None:
        dist.all_reduce(torch.cat([grads[i].view(-1) for i in order]))

    def run_per_tensor() -> None:
        works = [dist.all_reduce(grads[i], async_op=True) for i in order]
        for w in works:
            w.wait()

    def run_hvdprof() -> None:
        handles = [hvd.allreduce_async_(grads[i], name=names[i], op=hvd.Sum) for i in order]
        for handle in handles:
            hvd.synchronize(handle)

    def run_hvdprof_flat() -> None:
        hvd.allreduce_(flat_hv, name="flat", op=hvd.Sum)

    # The thread variants (``--threads 0`` launches): torch's default is what the user's
    # thread has now; the cycle thread capped itself at init.
    from hvdprof.runtime import runtime as hv_runtime
    from hvdprof.runtime.threads import openmp_set_num_threads

    default_threads = torch.get_num_threads()
    cycle_cap = hv_runtime.get().cycle.intra_op_threads
    set_omp = openmp_set_num_threads()
    cycle_now = [cycle_cap]

    def threads_variant(user: int, cycle: int) -> Any:
        def run() -> None:
            torch.set_num_threads(user)  # the user's thread only (and threads started later)
            if cycle_now[0] != cycle and set_omp is not None:  # same order on every rank
                hv_runtime.get().run_collectively(lambda: set_omp(cycle))
                cycle_now[0] = cycle
            run_hvdprof()

        return run

    return {
        "hvdprof_threads_1": threads_variant(1, cycle_cap),
        "hvdprof_threads_default": threads_variant(default_threads, cycle_cap),
        "hvdprof_cycle_uncapped": threads_variant(default_threads, default_threads),
        "hvdprof_flat": run_hvdprof_flat,
        "flat": run_flat,
        "flat_cat": run_flat_cat,
        "per_tensor_async": run_per_tensor,
        "hand_buckets": ddp.step,
        "hvdprof": run_hvdprof,
    }


def verify_sums(
    fns: dict[str, Callable[[], None]],
    variants: list[str],
    grads: list[Any],
    flat: Any,
    flat_hv: Any,
    rank: int,
    size: int,
) -> None:
    """Correctness first: every variant must produce the sum over ranks (exits if not);
    the tensors are zeroed after."""
    import torch

    expected_scale = size * (size + 1) / 2
    for name in variants:
        for i, g in enumerate(grads):
            g.fill_((rank + 1) * (i % 7 + 1))
        flat.fill_(rank + 1)
        flat_hv.fill_(rank + 1)
        fns[name]()
        if name in BACKWARD_VARIANTS:
            continue  # BackwardSteps.verify
        if name == "flat":
            ok = bool(torch.all(flat == expected_scale))
        elif name == "hvdprof_flat":
            ok = bool(torch.all(flat_hv == expected_scale))
        elif name == "flat_cat":
            ok = True  # its output is thrown away, as in the naive pattern it stands for
        else:
            ok = all(
                bool(torch.all(g == expected_scale * (i % 7 + 1))) for i, g in enumerate(grads)
            )
        if not ok:
            raise SystemExit(f"rank {rank}: variant {name} produced a wrong sum")
    for g in grads:
        g.zero_()
    flat.zero_()
    flat_hv.zero_()


# -------------------------------------------------------------------------- launcher


def main() -> None:
    p = h.parser(__doc__.splitlines()[0], steps=40, warmup=5)
    p.add_argument("--variants", default=",".join(VARIANTS), help=argparse_help())
    p.add_argument("--no-sweep", action="store_true", help="skip the threshold/in-flight sweep")
    p.add_argument("--no-threads", action="store_true", help="skip the default-threads comparison")
    p.add_argument(
        "--threads-repeats", type=int, default=2, help="launches of the thread comparison"
    )
    p.add_argument("--sweep-steps", type=int, default=12, help="timed rounds per sweep launch")
    p.add_argument("--sweep-warmup", type=int, default=2, help="untimed rounds per sweep launch")
    p.add_argument(
        "--sweep-repeats", type=int, default=2, help="launches per sweep config (default 2)"
    )
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    if args.quick:
        args.steps, args.warmup, args.sweep_steps, args.sweep_warmup = 4, 1, 3, 1
        args.sweep_repeats = args.threads_repeats = 1
    unknown = set(args.variants.split(",")) - set(VARIANTS) - set(THREAD_VARIANTS)
    if unknown:
        p.error(f"unknown variants {sorted(unknown)}; choose from {', '.join(VARIANTS)}")
    check_shapes(resnet50_param_shapes())
    timeout = args.timeout or (120 if args.quick else 900)
    argv = [
        "--np", str(args.np), "--steps", str(args.steps), "--warmup", str(args.warmup),
        "--threads", str(args.threads), "--variants", args.variants,
    ]  # fmt: skip
    data = h.run_job(__file__, argv, args.np, timeout=timeout)
    samples = data["samples"]
    summary = h.summarise(samples)
    ratios = main_ratios(samples)
    hv_stats = data["hvdprof_per_step"]

    print()
    print(
        f"{NAME}: 161 tensors, 102.2 MB float32, sum, {args.np} ranks; baselines Gloo, "
        f"hvdprof {data['hvdprof_backend']}; "
        f"{args.steps} interleaved rounds after {args.warmup} warmup (median of the slowest rank)"
    )
    print(h.variant_table(summary))
    print()
    print(h.ratio_table(ratios))
    if hv_stats:
        print(f"hvdprof per step: {hv_stats}")
    print(f"hand buckets (tensors per bucket): {data['hand_buckets']}")

    thread_result = {} if args.no_threads else run_threads(args, timeout)
    sweep_rows = [] if args.no_sweep else run_sweep(args, timeout)

    path = h.write_results(
        NAME,
        {
            "settings": {
                "np": args.np,
                "steps": args.steps,
                "warmup": args.warmup,
                "quick": args.quick,
                "torch_threads_per_rank": h.threads_setting(args),
                "tensors": EXPECTED_TENSORS,
                "numel": EXPECTED_NUMEL,
                "dtype": "float32",
                "reduce_op": "sum (hvd.Sum for hvdprof, ReduceOp.SUM for the baselines)",
                "submission_order": "reverse of named_parameters (backward order)",
                "hand_bucket_bytes": BUCKET_BYTES,
                "hand_first_bucket_bytes": FIRST_BUCKET_BYTES,
                "hand_bucket_sizes": data["hand_buckets"],
                "ddp": "torch.nn.parallel.DistributedDataParallel, default options "
                "(bucket_cap_mb 25), default group; the step is zero_grad, forward, backward "
                "of loss = (rank + 1) * sum(p.sum()) over parameters of ResNet-50's shapes",
                "baseline_group": "torch.distributed default group, gloo, default options",
                "hvdprof_env": h.knob_env(),
                "timing": "per step: barrier, then wall time; slowest rank per round; medians",
            },
            "variants": summary,
            "ratios": ratios,
            "hvdprof_backend": data["hvdprof_backend"],
            "hvdprof_per_step": hv_stats,
            "threads": {
                "what": "launches with no thread variable and no launcher default "
                "(HVDPROF_THREADS_DEFAULT=0, as under mpirun/srun), torch's default thread "
                "count; variants switch the user's and the cycle thread's intra-op threads "
                "between steps, interleaved; samples pooled over the launches",
                "goal": f"hvdprof_threads_default / hvdprof_threads_1 <= {THREADS_GOAL}",
                "launches": args.threads_repeats,
                "steps_per_launch": args.sweep_steps,
                **thread_result,
            },
            "sweep": {
                "interleaved": "within each launch only (flat vs hvdprof); not across launches. "
                "Configs take turns over the repeats; samples pooled per config.",
                "repeats": args.sweep_repeats,
                "steps": args.sweep_steps,
                "warmup": args.sweep_warmup,
                "rows": sweep_rows,
            },
            "job_wall_s": data["wall_s"],
        },
        args.output,
        args.quick,
    )
    print(f"\nwrote {path}")


def main_ratios(samples: Any) -> dict[str, Any]:
    """The main launch's ratios: hvdprof against each baseline (goals where there are
    some), the baselines against ``flat``, and the training step's averaging by
    hvdprof's optimizer against real DDP, each over the bare backward."""
    ratios: dict[str, Any] = {}
    if "hvdprof" in samples:
        goals = {
            "flat": ("<= 1.05", 1.05),
            "flat_cat": ("", None),
            "per_tensor_async": ("", None),
            "hand_buckets": ("", None),
            "hvdprof_flat": ("<= 1.05", 1.05),
        }
        for base, (goal, bound) in goals.items():
            if base in samples:
                r = h.ratio(samples, "hvdprof", base)
                r["goal"] = goal
                r["met"] = None if bound is None else r["of_medians"] <= bound
                ratios[f"hvdprof / {base}"] = r
    for base in ("flat_cat", "per_tensor_async", "hand_buckets"):
        if base in samples and "flat" in samples:
            ratios[f"{base} / flat"] = h.ratio(samples, base, "flat")
    # the training step: hvdprof's optimizer against real DDP, each over the bare backward
    for num, den in (
        ("hvdprof_optimizer", "ddp"),
        ("ddp", "backward"),
        ("hvdprof_optimizer", "backward"),
    ):
        if num in samples and den in samples:
            ratios[f"{num} / {den}"] = h.ratio(samples, num, den)
    return ratios


def run_threads(args: Any, timeout: float) -> dict[str, Any]:
    """The default-threads case, so that it cannot hide behind the benchmarks' one thread
    per rank: ``--threads-repeats`` launches without any thread variable or launcher
    default, each timing ``flat`` and THREAD_VARIANTS interleaved; samples pooled.
    """
    import os

    variants = ("flat", *THREAD_VARIANTS)
    print()
    print(
        f"threads: {args.threads_repeats} launch(es) with no thread variable and "
        "HVDPROF_THREADS_DEFAULT=0 (as under mpirun), torch's default thread count; "
        f"{', '.join(variants)} interleaved ({args.sweep_steps} rounds per launch)"
    )
    saved = {
        k: os.environ.pop(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS") if k in os.environ
    }
    pooled: dict[str, list[Any]] = {v: [] for v in variants}
    switches: dict[str, list[float]] = {v: [] for v in THREAD_VARIANTS}
    try:
        for rep in range(args.threads_repeats):
            targv = [
                "--np", str(args.np), "--steps", str(args.sweep_steps),
                "--warmup", str(args.sweep_warmup), "--threads", "0",
                "--variants", ",".join(variants),
            ]  # fmt: skip
            env = {"HVDPROF_THREADS_DEFAULT": "0"}
            tdata = h.run_job(__file__, targv, args.np, env=env, timeout=timeout)
            offset = rep * args.sweep_steps  # keep rounds of different launches apart
            for v in variants:
                pooled[v] += [(r + offset, dt) for r, dt in tdata["samples"][v]]
            for per_rank in tdata["context_switches"]:
                for v, median in per_rank.items():
                    switches[v].append(median)
    finally:
        os.environ.update(saved)
    summary = h.summarise(pooled)
    ratios: dict[str, Any] = {}
    for num, den, bound in (
        ("hvdprof_threads_default", "hvdprof_threads_1", THREADS_GOAL),
        ("hvdprof_cycle_uncapped", "hvdprof_threads_1", None),
        ("hvdprof_threads_1", "flat", None),
    ):
        r = h.ratio(pooled, num, den)
        r["goal"] = "" if bound is None else f"<= {bound}"
        r["met"] = None if bound is None else r["of_medians"] <= bound
        ratios[f"{num} / {den}"] = r
    per_step = {v: round(sum(c) / len(c), 1) for v, c in switches.items() if c}
    print(h.variant_table(summary))
    print()
    print(h.ratio_table(ratios))
    print(
        "context switches per step and rank (median per launch and rank, averaged): "
        + ", ".join(f"{v} {n:g}" for v, n in per_step.items())
    )
    return {"variants": summary, "ratios": ratios, "context_switches_per_step": per_step}


def run_sweep(args: Any, timeout: float) -> list[dict[str, Any]]:
    """Separate launches per (threshold, in-flight) config, each timing flat and hvdprof
    interleaved. With ``--sweep-repeats R`` every config is launched R times, the configs
    taking turns (A B C ... A B C ...), and a config's samples are pooled over its launches.
    """
    configs = QUICK_SWEEP if args.quick else SWEEP
    print()
    print(
        f"sweep: {len(configs)} config(s) x {args.sweep_repeats} separate launch(es), configs "
        f"taking turns; each launch times flat and hvdprof interleaved ({args.sweep_steps} "
        "rounds). hv/flat is measured within launches; hvdprof ms across configs is NOT "
        "interleaved."
    )
    pooled: dict[int, dict[str, Any]] = {
        i: {"samples": {"flat": [], "hvdprof": []}, "launch_ratios": [], "per_step": []}
        for i in range(len(configs))
    }
    for rep in range(args.sweep_repeats):
        for i, (threshold, inflight, backend) in enumerate(configs):
            env = {
                "HVDPROF_FUSION_THRESHOLD": str(threshold),
                "HVDPROF_MAX_INFLIGHT": str(inflight),
                "HVDPROF_BACKEND": backend,
            }
            sargv = [
                "--np", str(args.np), "--steps", str(args.sweep_steps),
                "--warmup", str(args.sweep_warmup), "--threads", str(args.threads),
                "--variants", "flat,hvdprof",
            ]  # fmt: skip
            sdata = h.run_job(__file__, sargv, args.np, env=env, timeout=timeout)
            entry = pooled[i]
            offset = rep * args.sweep_steps  # keep rounds of different launches apart
            for v in ("flat", "hvdprof"):
                entry["samples"][v] += [(r + offset, dt) for r, dt in sdata["samples"][v]]
            entry["launch_ratios"].append(
                h.ratio(sdata["samples"], "hvdprof", "flat")["of_medians"]
            )
            entry["per_step"].append(sdata["hvdprof_per_step"])
    rows = []
    for i, (threshold, inflight, backend) in enumerate(configs):
        entry = pooled[i]
        summary = h.summarise(entry["samples"])
        rows.append(
            {
                "fusion_threshold_bytes": threshold,
                "max_inflight": inflight,
                "backend": backend,
                "launches": args.sweep_repeats,
                "flat_median_ms": summary["flat"]["median_ms"],
                "hvdprof_median_ms": summary["hvdprof"]["median_ms"],
                "hvdprof_over_flat": h.ratio(entry["samples"], "hvdprof", "flat"),
                "hvdprof_over_flat_per_launch": entry["launch_ratios"],
                "hvdprof_per_step": entry["per_step"][-1],
            }
        )
    table_rows = [
        (
            f"{r['fusion_threshold_bytes'] // MiB} MiB",
            r["max_inflight"],
            r["backend"],
            f"{r['flat_median_ms']:.1f}",
            f"{r['hvdprof_median_ms']:.1f}",
            f"{r['hvdprof_over_flat']['of_medians']:.3f}",
            f"{r['hvdprof_over_flat']['paired_median']:.3f}",
            " ".join(f"{x:.2f}" for x in r["hvdprof_over_flat_per_launch"]),
            r["hvdprof_per_step"].get("fused_groups", "-"),
        )
        for r in rows
    ]
    header = (
        "threshold",
        "inflight",
        "backend",
        "flat ms",
        "hvdprof ms",
        "hv/flat",
        "per-round",
        "per launch",
        "groups/step",
    )
    print(h.table(table_rows, header))
    return rows


def argparse_help() -> str:
    return "comma-separated variants to run (default: all): " + ", ".join(VARIANTS)


if __name__ == "__main__":
    sys.exit(main())
