"""Horovod's synthetic benchmark with and without ``--autotune``, interleaved (issue 52).

Runs ``benchmarks/pytorch_synthetic_benchmark.py`` (hvdprof's equivalent of Horovod's
``examples/pytorch/pytorch_synthetic_benchmark.py``: same flags, same report) through
``hvdprof run``, untuned and with its ``--autotune`` flag, in ``--rounds`` rounds whose
order alternates (untuned first in odd rounds), so that the machine's drift falls on both
alike. Per round, the ratio tuned / untuned of:

* the benchmark's own figure, ``Img/sec per CPU`` (the mean over its iterations, tuning
  included): the goal, >= 1.0 as the median of the rounds;
* the median img/sec of the iterations after the tuner's round ended (read from its
  log's decision row), where tuning no longer costs anything (context).

Also kept: each tuned run's one line, its decision, and the throughput while tuning it
reported live (the log's last ``while_tuning_ratio``).

    python benchmarks/synthetic_autotune.py [--np 2] [--rounds 3] [--quick] [--load]

Writes ``benchmarks/results/synthetic_autotune.json`` (``.loaded`` with ``--load``,
``.quick`` with ``--quick``).
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _harness as h

NAME = "synthetic_autotune"
HERE = Path(__file__).resolve().parent
BENCHMARK = HERE / "pytorch_synthetic_benchmark.py"
ITER = re.compile(r"Iter #(\d+): ([0-9.]+) img/sec per")
MEAN = re.compile(r"Img/sec per \w+: ([0-9.]+) \+-([0-9.]+)")
GOAL = 1.0


def options() -> Any:
    p = h.parser(__doc__.splitlines()[0], steps=0, warmup=0)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--load", action="store_true", help="one spin loop per core meanwhile")
    p.add_argument("--model", default="small_resnet")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--num-warmup-batches", type=int, default=5)
    p.add_argument("--num-batches-per-iter", type=int, default=10)
    p.add_argument("--num-iters", type=int, default=60)
    return p.parse_args()


def bench_argv(args: Any) -> list[str]:
    return [
        "--model", args.model, "--batch-size", str(args.batch_size),
        "--image-size", str(args.image_size),
        "--num-warmup-batches", str(args.num_warmup_batches),
        "--num-batches-per-iter", str(args.num_batches_per_iter),
        "--num-iters", str(args.num_iters),
    ]  # fmt: skip


def run_once(args: Any, tuned: bool, timeout: float) -> dict[str, Any]:
    """One launch; its iterations' img/sec, its mean, and (tuned) what the tuner did."""
    from hvdprof.autotune.log import PHASE_DECISION, PHASE_TUNE, read_autotune_log

    root = HERE.parent
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
    with tempfile.TemporaryDirectory(prefix="hvdprof-synthetic-autotune-") as tmp:
        log = Path(tmp) / "autotune.csv"
        flags = ["--autotune", "--autotune-log-file", str(log)] if tuned else []
        command = [
            sys.executable, "-m", "hvdprof", "run", "-np", str(args.np),
            "--timeout", str(int(timeout)), "--", sys.executable, str(BENCHMARK),
            *bench_argv(args), *flags,
        ]  # fmt: skip
        started = time.monotonic()
        proc = subprocess.run(
            command, capture_output=True, text=True, env=env, timeout=timeout + 60,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        text = proc.stdout + proc.stderr
        if proc.returncode != 0:
            raise SystemExit(f"{NAME}: the benchmark failed ({proc.returncode}):\n{text[-3000:]}")
        rows = read_autotune_log(log) if tuned and log.exists() else []
    iters = [float(m[2]) for m in ITER.finditer(text)]
    mean = MEAN.search(text)
    out: dict[str, Any] = {
        "img_sec_iters": iters,
        "img_sec_mean": float(mean[1]) if mean else statistics.mean(iters),
        "wall_s": round(time.monotonic() - started, 1),
    }
    if tuned:
        decisions = [r for r in rows if r.phase == PHASE_DECISION]
        tuning = [r for r in rows if r.phase == PHASE_TUNE and r.while_tuning_ratio is not None]
        out["lines"] = [ln[ln.index("hvdprof autotune: ") :] for ln in text.splitlines()
                        if "hvdprof autotune: " in ln]  # fmt: skip
        out["decision"] = (
            None
            if not decisions
            else {
                "params": [
                    decisions[0].params.fusion_threshold_bytes,
                    decisions[0].params.cycle_time_ms,
                    decisions[0].params.cache_enabled,
                ],
                "role": decisions[0].role,
                "step": decisions[0].last_step,
            }
        )
        out["while_tuning_ratio_reported"] = tuning[-1].while_tuning_ratio if tuning else None
        out["windows"] = len([r for r in rows if r.phase == PHASE_TUNE])
    return out


def after_tuning(run: dict[str, Any], decided_step: int | None, args: Any) -> list[float]:
    """The iterations that began after the round's decision (all when none was logged:
    then the tail is not separated from tuning, and says so by being the whole run)."""
    iters = run["img_sec_iters"]
    if decided_step is None:
        return iters
    first = (decided_step - args.num_warmup_batches) // args.num_batches_per_iter + 1
    return iters[max(0, first) :] or iters[-1:]


def main() -> None:
    args = options()
    if args.quick:
        args.rounds, args.num_iters, args.num_batches_per_iter = 1, 8, 5
    timeout = args.timeout or (240 if args.quick else 900)
    started = time.monotonic()
    runs: dict[str, list[dict[str, Any]]] = {"untuned": [], "autotune": []}
    with h.spin_loops(args.load):
        for rnd in range(args.rounds):
            order = ("untuned", "autotune") if rnd % 2 == 0 else ("autotune", "untuned")
            for variant in order:
                print(f"{NAME}: round {rnd + 1}/{args.rounds}, {variant}", flush=True)
                runs[variant].append(run_once(args, variant == "autotune", timeout))
    pairs = list(zip(runs["autotune"], runs["untuned"], strict=True))
    whole = [t["img_sec_mean"] / u["img_sec_mean"] for t, u in pairs]
    tail = []
    for t, u in pairs:
        step = (t.get("decision") or {}).get("step")
        tail.append(
            statistics.median(after_tuning(t, step, args))
            / statistics.median(after_tuning(u, step, args))
        )
    reported = [t["while_tuning_ratio_reported"] for t in runs["autotune"]]
    ratios: dict[str, Any] = {
        "autotune / untuned, Img/sec per CPU (the benchmark's figure; median of rounds)": {
            "of_medians": round(statistics.median(whole), 4), "goal": f">= {GOAL}",
            "met": statistics.median(whole) >= GOAL,
        },
        "autotune / untuned, img/sec after the round's decision (median of rounds)": {
            "of_medians": round(statistics.median(tail), 4), "goal": "(context)", "met": True,
        },
    }  # fmt: skip
    if all(r is not None for r in reported):
        ratios["throughput while tuning / default, as the tuner reported it (min of runs)"] = {
            "of_medians": round(min(reported), 4), "goal": "(context)", "met": True,
        }  # fmt: skip
    print(h.ratio_table(ratios))
    for t in runs["autotune"]:
        print("  tuner said:", t["lines"][0] if t.get("lines") else "(nothing)")
    path = h.write_results(
        f"{NAME}.loaded" if args.load else NAME,
        {
            "settings": {
                "np": args.np, "rounds": args.rounds, "model": args.model,
                "batch_size": args.batch_size, "image_size": args.image_size,
                "num_warmup_batches": args.num_warmup_batches,
                "num_batches_per_iter": args.num_batches_per_iter,
                "num_iters": args.num_iters, "threads": "hvdprof run's default",
                "load": "one spin loop per core" if args.load else "quiet",
                "order": "alternating by round, untuned first in round 1",
            },
            "ratios": ratios,
            "per_round": {
                "whole": [round(x, 4) for x in whole],
                "after_decision": [round(x, 4) for x in tail],
            },
            "runs": runs,
            "total_wall_s": round(time.monotonic() - started, 1),
        },
        args.output,
        args.quick,
    )  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
