"""The control plane's cost per cycle from 2 to 64 ranks, fitted and extrapolated to 1,024.

Each job runs N ranks of one engine and interleaves two steps of K small allreduces:

* ``hit``: the same K names every step (steady state: every name is in the response
  cache, each cycle is one allgather of a header and K bits on the TCP star);
* ``miss``: K new names every step (the cache is exactly K entries wide and full with the
  ``hit`` names, so each new name goes to the coordinator and none is cached: the bit
  vector keeps the same width in both variants).

Measured per step on every rank from hvdprof's counters (``runtime_stats``): cycles, the
cycle thread's CPU by stage (negotiate, perform, account), and the negotiate stage's wall
time (from a cycle observer: ``t_negotiated - t_start``). The wall minus the CPU of the
negotiate stage is waiting: for peers, and on this 2-core machine, for a core. With more
ranks than cores the machine is oversubscribed: wall times then measure the scheduler as
much as hvdprof, and only the CPU columns carry over to a machine with a core per rank.

Each job also accounts for the whole machine over its timed phase
(``scale_accounting.py``: the ranks' threads by clock, the other processes, interrupts,
idle and steal from the kernel's counters, and the residue nothing accounts for): the
step's cost term by term on a machine with fewer cores than ranks.

Allreduces go to the engine (``HVDPROF_SMALL_ALLREDUCE_BYTES=0``), so the perform stage
is the engine's. ``--fanouts 0,8`` runs each rank count once per topology of the control
messages (``HVDPROF_CONTROL_FANOUT``: 0 the star, k a tree), the jobs alternating, and
prints the tree against the star at each rank count. Points say which reply they ran
with: ``full`` (the whole matrix to every rank, the runtime before the reduced reply:
the points the model is fitted on) or ``reduced``. The model (``scale_model.py``) is fitted on some rank counts and checked
on the others; ``--simulate`` adds rank counts too large for processes here
(``scale_sim.py``: threads speaking the control channel's wire protocol).

    python benchmarks/scale_bench.py --ranks 2,4,8 --engines shm,gloo [--tensors 16]
    python benchmarks/scale_bench.py --ranks 16,64 --fanouts 0,8 --rounds 2
    python benchmarks/scale_bench.py --fit-only        # refit the points in the JSON
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import _harness as h
import scale_accounting as acct
import scale_model as m

NAME = "scale_bench"
VARIANTS = ("hit", "miss")
STAT_KEYS = (
    "cycles",
    "slow_path_cycles",
    "cache_hits",
    "coordinator_responses",
    "cycle_cpu_negotiate_us",
    "cycle_cpu_perform_us",
    "cycle_cpu_account_us",
)
#: rank counts the model is fitted on; the others are held out
FIT_RANKS = (2, 4, 8, 16)


class NegotiateClock:
    """A cycle observer: after each cycle, this rank's counters and the negotiate stage's
    wall time summed so far (no per-op detail).

    Read here rather than through ``runtime_stats`` between steps: a step's last op
    completes before its cycle ends, so a snapshot taken when ``synchronize`` returns would
    give the next step part of this one's cycle. Snapshots taken at the end of a cycle, on
    the cycle thread, never split one (the account stage's CPU lags by one cycle).
    """

    detailed = False
    per_cycle = True

    def __init__(self, loop: Any) -> None:
        self.loop = loop
        self.wall_ns = 0
        self.snapshot = self._take()

    def _take(self) -> dict[str, float]:
        c = self.loop.counters
        snap = {k: float(c[k]) for k in STAT_KEYS if k in c}
        for stage, ns in self.loop.cpu_ns.items():
            snap[f"cycle_cpu_{stage}_us"] = ns / 1000
        snap["ops_completed"] = float(c["ops_completed"])
        snap["negotiate_wall_us"] = self.wall_ns / 1000
        return snap

    def on_cycle(self, record: Any) -> None:
        self.wall_ns += record.t_negotiated - record.t_start
        self.snapshot = self._take()  # one reference swap: safe to read from another thread

    def close(self) -> None:
        pass


def _meter(fn: Any, clock: NegotiateClock, ops: int, totals: dict[str, float]) -> Any:
    """``fn`` with this rank's counters summed over its calls into ``totals``: from the
    last cycle ended before the call to the cycle that completed its ``ops`` ops."""

    def measured() -> None:
        before = clock.snapshot
        cpu0 = time.thread_time_ns()
        fn()
        user_us = (time.thread_time_ns() - cpu0) / 1000  # the training thread: submit, wait
        target = before["ops_completed"] + ops
        deadline = time.monotonic() + 60
        while clock.snapshot["ops_completed"] < target and time.monotonic() < deadline:
            time.sleep(0.0002)
        after = clock.snapshot
        for k, v in after.items():
            totals[k] = totals.get(k, 0.0) + v - before[k]
        totals["user_thread_cpu_us"] = totals.get("user_thread_cpu_us", 0.0) + user_us
        totals["calls"] = totals.get("calls", 0) + 1

    return measured


def worker(args: Any) -> None:
    import torch
    import torch.distributed as dist

    import hvdprof.torch as hvd
    from hvdprof.runtime import runtime

    hvd.init()
    h.init_baseline_group()
    rank, size = hvd.rank(), hvd.size()
    k = args.tensors
    tensors = [torch.ones(args.numel) for _ in range(k)]
    step = [0]

    def run(names: list[str]) -> None:
        handles = [
            hvd.allreduce_async_(t, name=n, op=hvd.Sum) for t, n in zip(tensors, names, strict=True)
        ]
        for handle in handles:
            hvd.synchronize(handle)

    hit_names = [f"hit.{i}" for i in range(k)]

    def run_hit() -> None:
        run(hit_names)

    def run_miss() -> None:
        step[0] += 1
        run([f"miss.{step[0]}.{i}" for i in range(k)])

    run_hit()  # the cache (K entries) now holds the hit names; no miss name fits
    if not torch.allclose(tensors[0], torch.full_like(tensors[0], float(size))):
        raise SystemExit(f"rank {rank}: the allreduce produced a wrong sum")
    clock = NegotiateClock(runtime.get().cycle)
    runtime.get().cycle.observers.append(clock)
    totals: dict[str, dict[str, float]] = {v: {} for v in VARIANTS}
    fns = {
        "hit": _meter(run_hit, clock, k, totals["hit"]),
        "miss": _meter(run_miss, clock, k, totals["miss"]),
    }
    cycle = runtime.get().cycle
    phase: dict[str, Any] = {}

    def start_timed() -> None:
        for t in totals.values():
            t.clear()
        h.barrier()  # every rank's snapshot at the same instant, give or take a barrier
        phase["start"] = acct.snapshot(cycle, rank == 0)

    samples = h.interleave(fns, args.steps, args.warmup, progress=h.log, after_warmup=start_timed)
    h.barrier()
    phase["end"] = acct.snapshot(cycle, rank == 0)
    samples = h.gather_slowest(samples)
    everyone: list[Any] = [None] * size
    dist.all_gather_object(everyone, (totals, phase["start"], phase["end"]))
    if rank == 0:
        h.save_raw(
            {
                "samples": samples,
                "per_rank": [t for t, _, _ in everyone],
                "accounting": acct.account(
                    [s for _, s, _ in everyone],
                    [e for _, _, e in everyone],
                    os.cpu_count() or 1,
                    args.steps * len(VARIANTS),
                ),
                "backend": h.hvdprof_backend(),
                "cache_width": cycle.cache.width,
            }
        )
    h.finish_worker()


# ------------------------------------------------------------------ launcher side


def _per_step(t: dict[str, float]) -> dict[str, float]:
    calls = max(t.get("calls", 0), 1)
    return {k: v / calls for k, v in t.items() if k not in ("calls", "ops_completed")}


def point(data: dict[str, Any], variant: str, args: Any, ranks: int, engine: str) -> dict[str, Any]:
    """One (engine, ranks, mode) point: per step and per cycle, rank 0 and the workers'
    median (CPU and wall of the negotiate stage, and waiting = wall - CPU)."""
    per_rank = [_per_step(r[variant]) for r in data["per_rank"]]
    r0, others = per_rank[0], per_rank[1:] or per_rank
    worker = {k: statistics.median(o[k] for o in others) for k in r0}
    cycles = r0["cycles"]
    step_ms = statistics.median(dt for _, dt in data["samples"][variant]) * 1e3
    names = r0["coordinator_responses"]
    out: dict[str, Any] = {
        "engine": engine,
        "ranks": ranks,
        "mode": variant,
        "tensors": args.tensors,
        "width": data["cache_width"],
        "step_ms": round(step_ms, 3),
        "cycles": round(cycles, 2),
        "slow_cycles": round(r0["slow_path_cycles"], 2),
        "names": round(names, 2),
        "cache_hits": round(r0["cache_hits"], 2),
    }
    # The whole job's CPU per step (every rank, by stage), to explain the step's wall time
    # on a machine with fewer cores than ranks: at best, that CPU over the cores.
    stages = {
        "negotiate": "cycle_cpu_negotiate_us",
        "perform": "cycle_cpu_perform_us",
        "account": "cycle_cpu_account_us",
        "user_thread": "user_thread_cpu_us",
    }
    for stage, key in stages.items():
        out[f"all_ranks_{stage}_cpu_ms"] = round(sum(r[key] for r in per_rank) / 1000, 3)
    total_ms = sum(out[f"all_ranks_{s}_cpu_ms"] for s in stages)
    out["all_ranks_cpu_ms"] = round(total_ms, 3)
    out["cpu_over_cores_ms"] = round(total_ms / min(os.cpu_count() or 1, ranks), 3)
    out["rank0_user_thread_cpu_us"] = round(r0["user_thread_cpu_us"], 1)
    for role, d in (("rank0", r0), ("worker", worker)):
        cpu, wall = d["cycle_cpu_negotiate_us"], d["negotiate_wall_us"]
        out[f"{role}_negotiate_cpu_us"] = round(cpu, 1)  # per step
        out[f"{role}_negotiate_wall_us"] = round(wall, 1)
        out[f"{role}_perform_cpu_us"] = round(d["cycle_cpu_perform_us"], 1)
        out[f"{role}_account_cpu_us"] = round(d["cycle_cpu_account_us"], 1)
        c = max(d["cycles"], 1)
        out[f"{role}_cpu_per_cycle_us"] = round(cpu / c, 1)
        out[f"{role}_wall_per_cycle_us"] = round(wall / c, 1)
        out[f"{role}_wait_per_cycle_us"] = round((wall - cpu) / c, 1)
    return out


def measure(args: Any, ranks: int, engine: str, fanout: int = 0) -> list[dict[str, Any]]:
    argv = [
        "--steps", str(args.steps), "--warmup", str(args.warmup),
        "--tensors", str(args.tensors), "--numel", str(args.numel),
    ]  # fmt: skip
    env = {
        "HVDPROF_BACKEND": engine,
        "HVDPROF_CACHE_CAPACITY": str(args.tensors),
        "HVDPROF_SMALL_ALLREDUCE_BYTES": "0",
        "HVDPROF_CONTROL_FANOUT": str(fanout),
    }
    started = time.monotonic()
    data = h.run_job(__file__, argv, ranks, env=env, timeout=args.timeout or 480)
    pts = [point(data, v, args, ranks, engine) for v in VARIANTS]
    for p in pts:
        # the timed phase's machine time by term (hit and miss steps together)
        p["accounting"] = data.get("accounting") or {}
        p["backend_seen"] = data["backend"]
        p["job_wall_s"] = round(time.monotonic() - started, 1)
        p["load"] = args.load
        p["fanout"] = fanout
        p["reply"] = "reduced"
        p["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return pts


def topology(q: dict[str, Any]) -> str:
    """``full`` (the star before the reduced reply), ``star`` or ``treeK``."""
    if q.get("reply", "full") == "full":
        return "full"
    return f"tree{q['fanout']}" if q.get("fanout") else "star"


def point_key(q: dict[str, Any]) -> tuple[Any, ...]:
    return (q["engine"], q["ranks"], q["mode"], q.get("load", False), topology(q))


def merge_rounds(pts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One point per key: the median of each number over the rounds that measured it."""
    by_key: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for q in pts:
        by_key.setdefault(point_key(q), []).append(q)
    out = []
    for group in by_key.values():
        merged = dict(group[-1])
        for k, v in group[-1].items():
            if isinstance(v, float) and not isinstance(v, bool):
                merged[k] = round(statistics.median(g[k] for g in group), 3)
        merged["rounds"] = len(group)
        out.append(merged)
    return out


def compare_topologies(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (engine, ranks, mode, load) measured in more than one topology: each against
    the star's reduced reply (and the full reply where it was measured)."""
    groups: dict[tuple[Any, ...], dict[str, dict[str, Any]]] = {}
    for q in points:
        groups.setdefault(point_key(q)[:4], {})[topology(q)] = q
    rows = []
    for (engine, ranks, mode, load), by in sorted(groups.items()):
        base = by.get("star")
        if base is None or len(by) < 2:
            continue
        for name, q in sorted(by.items()):
            rows.append(
                {
                    "engine": engine,
                    "ranks": ranks,
                    "mode": mode,
                    "load": load,
                    "topology": name,
                    "rank0_cpu_per_cycle_us": q["rank0_cpu_per_cycle_us"],
                    "worker_cpu_per_cycle_us": q["worker_cpu_per_cycle_us"],
                    "rank0_wall_per_cycle_us": q["rank0_wall_per_cycle_us"],
                    "step_ms": q["step_ms"],
                    "rank0_cpu_vs_star": round(
                        q["rank0_cpu_per_cycle_us"] / base["rank0_cpu_per_cycle_us"], 3
                    ),
                    "step_vs_star": round(q["step_ms"] / base["step_ms"], 3),
                    "job_negotiate_cpu_vs_star": round(
                        q["all_ranks_negotiate_cpu_ms"] / base["all_ranks_negotiate_cpu_ms"], 3
                    ),
                }
            )
    return rows


def per_cycle_view(q: dict[str, Any]) -> dict[str, Any]:
    """One point per cycle: rank 0's and a worker's negotiate CPU and wall (us)."""
    return {
        "step_ms": q["step_ms"],
        "cycles_per_step": q["cycles"],
        "rank0_negotiate_cpu_us": q["rank0_cpu_per_cycle_us"],
        "rank0_negotiate_wall_us": q["rank0_wall_per_cycle_us"],
        "worker_negotiate_cpu_us": q["worker_cpu_per_cycle_us"],
        "worker_negotiate_wall_us": q["worker_wall_per_cycle_us"],
    }


def fit_report(
    points: list[dict[str, Any]], sims: list[dict[str, Any]], engine: str | None = None
) -> dict[str, Any]:
    """Fit on ``FIT_RANKS`` (quiet runs) and check on the larger rank counts, which is
    what the model is for: predicting many ranks from few. By default the points of
    every engine are fitted together (on 2 cores a Gloo rank's extra threads make its
    socket calls dearer, a cost the small Gloo points show and shared memory's cannot);
    ``engine`` fits one engine's and checks the others' too. Take the cost per KB from
    the simulation when the measured points carry too few bytes to show it; predict to
    1,024 ranks."""
    quiet = [p for p in points if not p.get("load") and p["ranks"] >= 2]
    fitted = [p for p in quiet if topology(p) == "full"]
    quiet = fitted or [p for p in quiet if topology(p) == "star"]
    sims = [s for s in sims if s.get("topology", "full") == "full"]
    mine = [p for p in quiet if engine is None or p["engine"] == engine] or quiet
    train = [p for p in mine if p["ranks"] in FIT_RANKS]
    held = [p for p in mine if p["ranks"] not in FIT_RANKS]
    if len(train) < len(m.TERMS):  # (a quick run): fit on every point, nothing held out
        train, held = mine, []
    held += [p for p in quiet if p not in mine]
    out: dict[str, Any] = {
        "fit_engine": engine or "all",
        "fit_ranks": sorted({p["ranks"] for p in train}),
        "held_out": sorted({(p["engine"], p["ranks"]) for p in held}),
    }
    kb_sim = m.kb_cost_from_simulation(sims)
    for role in ("rank0", "worker"):
        key = f"{role}_negotiate_cpu_us"
        params = m.fit(train, role, key)
        errors = m.held_out_errors(params, held, role, key)
        worst = max((abs(e["error"]) for e in errors if e["error"] is not None), default=None)
        if role == "rank0" and kb_sim is not None and kb_sim > params["kb"]:
            params = {**params, "kb": kb_sim}  # (held-out errors above: without it)
        out[role] = {
            "params_us": {t: round(v, 4) for t, v in params.items()},
            "kb_from_simulation": role == "rank0" and kb_sim is not None,
            "held_out": errors,
            "worst_held_out_error": worst,
            "predicted_cpu_per_cycle": _predictions(params, role),
        }
    if sims and "rank0" in out:
        out["simulation_shape"] = m.shape_check(out["rank0"]["params_us"], sims)
    if "rank0" in out:
        out["predicted_topologies"] = _topology_predictions(out["rank0"]["params_us"])
    return out


def _topology_predictions(params: dict[str, float]) -> dict[str, dict[str, Any]]:
    """Per rank count: rank 0's CPU per cycle (us, a core per rank) with the full reply,
    the reduced one, and trees of fan-out 8 and 32 (and their busiest relaying rank)."""
    out: dict[str, dict[str, Any]] = {}
    for n in (16, 64, 128, 256, 512, 1024):
        row: dict[str, Any] = {}
        for mode, slow in (("hit", False), ("miss", True)):
            row[f"full_{mode}_us"] = round(m.per_cycle(params, "rank0", n, 16, slow), 1)
            for k in (0, 8, 32):
                name = f"tree{k}" if k else "star"
                for role, us in m.topology_cycle(params, n, 16, slow, k).items():
                    row[f"{name}_{mode}_{role}_us"] = round(us, 1)
        out[str(n)] = row
    return out


def _predictions(params: dict[str, float], role: str) -> dict[str, dict[str, float]]:
    """Per rank count: one cache-hit cycle and one slow-path cycle of 16 names, on a core
    per rank; a hit cycle with 200 cached names; a hit cycle on this 2-core machine."""
    return {
        str(n): {
            "hit_cycle_us": round(m.per_cycle(params, role, n, 16, False), 1),
            "miss_cycle_us_16_names": round(m.per_cycle(params, role, n, 16, True), 1),
            "hit_cycle_us_200_wide": round(m.per_cycle(params, role, n, 200, False), 1),
            "hit_cycle_us_here": round(m.per_cycle(params, role, n, 16, False, m.CORES), 1),
        }
        for n in (2, 8, 16, 64, 128, 256, 512, 1024)
    }


def print_tables(points: list[dict[str, Any]], model: dict[str, Any]) -> None:
    rows = [
        (
            f"{p['engine']}/{topology(p)}" + (" +load" if p.get("load") else ""),
            p["ranks"], p["mode"],
            f"{p['step_ms']:.1f}", p["cycles"],
            p["slow_cycles"], p["rank0_cpu_per_cycle_us"], p["rank0_wait_per_cycle_us"],
            p["worker_cpu_per_cycle_us"], p["worker_wait_per_cycle_us"],
            f"{p['cpu_over_cores_ms']:.1f}",
        )
        for p in sorted(
            points,
            key=lambda p: (p["engine"], bool(p.get("load")), topology(p), p["ranks"], p["mode"]),
        )
    ]  # fmt: skip
    header = (
        "engine/topology", "ranks", "mode", "step ms", "cycles/step", "slow/step",
        "r0 cpu us/cyc", "r0 wait us/cyc", "wk cpu us/cyc", "wk wait us/cyc",
        "job cpu/cores ms",
    )  # fmt: skip
    print(h.table(rows, header))
    for role in ("rank0", "worker"):
        if role not in model:
            continue
        r = model[role]
        print(f"\nmodel ({role}, negotiate CPU per step): {r['params_us']} us per count")
        print(f"  worst held-out error: {r['worst_held_out_error']}")
        for e in r["held_out"]:
            print(f"  held out {e}")
        for n, pred in r["predicted_cpu_per_cycle"].items():
            print(f"  {n:>5} ranks: {pred}")


def load_points(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return json.loads(path.read_text()).get("points", [])


def main() -> None:
    p = h.parser(__doc__.splitlines()[0], steps=20, warmup=3)
    p.add_argument(
        "--ranks", default="2,4,8,16,32,64", help='rank counts (default 2..64; "": none)'
    )
    p.add_argument("--engines", default="shm", help="engines: shm,gloo (default shm)")
    p.add_argument("--tensors", type=int, default=16, help="allreduces per step (default 16)")
    p.add_argument("--numel", type=int, default=64, help="float32 per tensor (default 64)")
    p.add_argument("--load", action="store_true", help="one spin loop per core beside the jobs")
    p.add_argument(
        "--fanouts",
        default="0",
        help="HVDPROF_CONTROL_FANOUT values, jobs alternating (default 0: the star; 0,8: "
        "the star and a tree of fan-out 8)",
    )
    p.add_argument("--rounds", type=int, default=1, help="jobs per rank count and fan-out")
    p.add_argument("--sim-fanout", type=int, default=8, help="the simulated tree's fan-out")
    p.add_argument("--fresh", action="store_true", help="drop the points already in the JSON")
    p.add_argument("--fit-only", action="store_true", help="refit the JSON's points, run nothing")
    p.add_argument(
        "--simulate",
        default="",
        help="also simulate these rank counts (scale_sim.py), e.g. 256,1024",
    )
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    if args.quick:
        args.steps, args.warmup = 3, 1
        args.ranks = args.ranks if args.ranks != "2,4,8,16,32,64" else "2,3"
    path = args.output or h.RESULTS_DIR / (f"{NAME}.quick.json" if args.quick else f"{NAME}.json")
    old = [] if args.fresh else load_points(path)
    new: list[dict[str, Any]] = []
    sims: list[dict[str, Any]] = (
        [] if args.fresh or not path.exists() else json.loads(path.read_text()).get("simulated", [])
    )
    if not args.fit_only:
        with h.spin_loops(args.load):
            for engine in args.engines.split(","):
                for n in (int(x) for x in args.ranks.split(",") if x):
                    for r in range(args.rounds):
                        for k in (int(x) for x in args.fanouts.split(",")):
                            h.log(f"{NAME}: {n} ranks, {engine}, fan-out {k}, round {r + 1}")
                            new += measure(args, n, engine, k)
            new = merge_rounds(new)
        if args.simulate:
            import scale_sim

            sims = [s for s in sims if str(s["ranks"]) not in args.simulate.split(",")]
            for n in (int(x) for x in args.simulate.split(",")):
                sims += scale_sim.simulate(
                    n, args.tensors, cycles=20 if not args.quick else 3, fanout=args.sim_fanout
                )
    key = {point_key(q) for q in new}
    points = [q for q in old if point_key(q) not in key]
    points += new
    model = fit_report(points, sims)
    comparison = compare_topologies(points)
    print(
        f"\n{NAME}: {args.tensors} allreduces per step of {args.numel} float32; machine of "
        f"{os.cpu_count()} cores, so above 2 ranks it is OVERSUBSCRIBED: wall and waiting "
        "columns measure the scheduler too; CPU columns are hvdprof's own cost"
    )
    print_tables(points, model)
    for s in sims:
        print(f"simulated: {s}")
    for q in new:
        if q["mode"] == "hit" and q.get("accounting"):
            a = q["accounting"]
            print(
                f"\nmachine time per timed step, {q['ranks']} ranks, {topology(q)} (ms over "
                f"{a['cores']} cores; hit and miss steps): {a['per_step_ms']}; residue "
                f"{a['residue_ms_per_step']} ms ({a['residue_share']:.1%} of the capacity); "
                f"other processes by command: {a['others_by_command_ms']}"
            )
    if comparison:
        print("\ntopologies against the star's reduced reply (measured, per cycle):")
        for c in comparison:
            print(f"  {c}")
    out = h.write_results(
        NAME,
        {
            "settings": {
                "tensors": args.tensors,
                "numel": args.numel,
                "steps": args.steps,
                "warmup": args.warmup,
                "quick": args.quick,
                "oversubscribed_above_ranks": os.cpu_count(),
                "env": "HVDPROF_CACHE_CAPACITY=tensors, HVDPROF_SMALL_ALLREDUCE_BYTES=0, "
                "HVDPROF_BACKEND=engine",
                "timing": "per step: counters' differences on every rank; rank 0 and the "
                "median worker; per cycle = per step / cycles per step",
                "fanouts": args.fanouts,
                "rounds": args.rounds,
            },
            # per cycle, as docs/benchmarks.md shows them; "points" hold the per-step sums
            "variants": {
                f"{q['engine']}/{q['ranks']}/{q['mode']}"
                + ("/loaded" if q.get("load") else "")
                + ("" if topology(q) == "full" else f"/{topology(q)}"): per_cycle_view(q)
                for q in points
            },
            "points": points,
            "model": model,
            "simulated": sims,
            "topologies": comparison,
        },
        path,
        args.quick,
    )
    print(f"\nwrote {out}")


if __name__ == "__main__":
    sys.exit(main())
