"""What an idle job costs the ranks' cores: CPU per second of hvdprof's cycle thread and of
the whole rank while every rank is between steps (an evaluation, a data stall, a long
forward pass), and how many cycles it runs.

Idle for 20 ms, the ranks sleep on their control sockets until one has work (see "the
cycle" in docs/how-it-works.md). Three variants, each its own launch (the setting is read
at start-up), taking turns over ``--steps`` rounds:

* ``sleep``: the defaults a user gets;
* ``tick_10ms``: ``HVDPROF_IDLE_SLEEP_MAX_SECONDS=0.01``, every sleep cut short after
  10 ms: the cadence of the old idle back-off, which cycled every 10 ms (each wake-up
  here also costs a round of tokens, so it is a little dearer than that back-off was);
* ``timeline``: the defaults with ``HVDPROF_TIMELINE`` set (a fresh directory per run):
  what recording costs a rank that has nothing to record (its flusher thread sleeps
  untimed once no record comes; it woke twenty times a second before).

Each rank does one allreduce, settles for a second, then measures ``--seconds`` of idle:
its cycle thread's CPU (``/proc/self/task/<tid>/schedstat``), its process's CPU, and
its cycles. Reported per rank, medians over rounds; the ratios are sleep / tick and
timeline / sleep.

    python benchmarks/idle_cost.py [--np 2] [--steps 3] [--seconds 5] [--load] [--quick]
"""

from __future__ import annotations

import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _harness as h

NAME = "idle_cost"
VARIANTS = {
    "sleep": {},
    "tick_10ms": {"HVDPROF_IDLE_SLEEP_MAX_SECONDS": "0.01"},
    "timeline": {"HVDPROF_TIMELINE": "(a fresh directory per run)"},
}


def thread_cpu_s(native_id: int) -> float:
    """A thread's CPU time (schedstat: on-CPU nanoseconds), in seconds."""
    text = Path(f"/proc/self/task/{native_id}/schedstat").read_text()
    return int(text.split()[0]) / 1e9


def worker(args: Any) -> None:
    import torch

    import hvdprof.torch as hvd
    from hvdprof.runtime import runtime as rt

    hvd.init()
    hvd.allreduce(torch.ones(4), name="warm")
    time.sleep(1.0)  # settle: every rank idle for longer than the 20 ms before a sleep
    cycle_thread = rt.get().cycle.thread
    assert cycle_thread.native_id is not None
    stats0, cpu0 = hvd.runtime_stats(), thread_cpu_s(cycle_thread.native_id)
    proc0, t0 = time.process_time(), time.monotonic()
    time.sleep(args.seconds)
    elapsed = time.monotonic() - t0
    cycle_cpu = thread_cpu_s(cycle_thread.native_id) - cpu0
    process_cpu = time.process_time() - proc0
    cycles = hvd.runtime_stats()["cycles"] - stats0["cycles"]
    mine = {
        "cycle_thread_ms_per_s": 1e3 * cycle_cpu / elapsed,
        "process_ms_per_s": 1e3 * process_cpu / elapsed,
        "cycles_per_s": cycles / elapsed,
    }
    everyone = hvd.allgather_object(mine)
    if hvd.rank() == 0:
        h.save_raw({"ranks": everyone})
    hvd.shutdown()


def run_rounds(args: Any) -> dict[str, list[list[dict[str, float]]]]:
    """Per variant, per round: every rank's figures."""
    rng = random.Random(7)
    out: dict[str, list[list[dict[str, float]]]] = {v: [] for v in VARIANTS}
    argv = ["--seconds", str(args.seconds)]
    for rnd in range(args.steps):
        order = list(VARIANTS)
        rng.shuffle(order)
        for variant in order:
            print(f"round {rnd + 1}/{args.steps}: {variant}", flush=True)
            env = dict(VARIANTS[variant])
            scratch = None
            if "HVDPROF_TIMELINE" in env:
                scratch = tempfile.mkdtemp(prefix="hvdprof-idle-cost-")
                env["HVDPROF_TIMELINE"] = scratch
            try:
                data = h.run_job(__file__, argv, args.np, env=env, timeout=args.seconds + 120)
            finally:
                if scratch is not None:
                    shutil.rmtree(scratch, ignore_errors=True)
            out[variant].append(data["ranks"])
    return out


def summarise(rounds: dict[str, list[list[dict[str, float]]]]) -> dict[str, Any]:
    """Per variant and rank, the median of each figure over the rounds."""
    summary: dict[str, Any] = {}
    for variant, per_round in rounds.items():
        ranks = len(per_round[0])
        summary[variant] = [
            {
                key: round(statistics.median(r[rank][key] for r in per_round), 3)
                for key in per_round[0][rank]
            }
            for rank in range(ranks)
        ]
    return summary


def main() -> None:
    p = h.parser(__doc__.splitlines()[0], steps=3, warmup=0)
    p.add_argument("--seconds", type=float, default=5.0, help="idle seconds measured (5)")
    p.add_argument("--load", action="store_true", help="one spin loop per core beside the job")
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    if args.quick:
        args.steps, args.seconds = 1, 1.0
    with h.spin_loops(args.load):
        rounds = run_rounds(args)
    summary = summarise(rounds)
    header = ["variant", "rank", "cycle thread ms/s", "process ms/s", "cycles/s"]
    rows = [
        [v, r, f"{s['cycle_thread_ms_per_s']:.2f}", f"{s['process_ms_per_s']:.2f}",
         f"{s['cycles_per_s']:.1f}"]
        for v, ranks in summary.items()
        for r, s in enumerate(ranks)
    ]  # fmt: skip
    print()
    print(h.table(rows, header))
    ratios: dict[str, Any] = {}
    for key in ("cycle_thread_ms_per_s", "process_ms_per_s"):
        sleep = max(s[key] for s in summary["sleep"])
        tick = max(s[key] for s in summary["tick_10ms"])
        ratios[f"idle {key.replace('_', ' ')}: sleep / tick_10ms (busiest rank)"] = {
            "of_medians": round(sleep / tick, 4) if tick else None,
            "sleep": sleep,
            "tick_10ms": tick,
        }
    key = "process_ms_per_s"
    on = max(s[key] for s in summary["timeline"])
    off = max(s[key] for s in summary["sleep"])
    ratios["idle process ms per s: timeline / sleep (busiest rank)"] = {
        "of_medians": round(on / off, 4) if off else None,
        "timeline": on,
        "sleep": off,
    }
    print()
    for name, r in ratios.items():
        a, b = (v for k, v in r.items() if k != "of_medians")
        print(f"{name}: {r['of_medians']} ({a:.2f} vs {b:.2f})")
    name = f"{NAME}.loaded" if args.load else NAME
    path = h.write_results(
        name,
        {
            "settings": {
                "np": args.np,
                "rounds": args.steps,
                "idle_seconds": args.seconds,
                "load": "one spin loop per core" if args.load else "none",
                "variants": {v: env or "defaults" for v, env in VARIANTS.items()},
            },
            "per_rank": summary,
            "rounds": rounds,
            "ratios": ratios,
        },
        args.output,
        args.quick,
    )
    print(f"\nwrote {path}")


if __name__ == "__main__":
    sys.exit(main())
