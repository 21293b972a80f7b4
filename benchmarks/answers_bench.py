"""Are hvdprof's answers right? The straggler verdict against injected faults, run many times.

Each scenario is a real job: ``hvdprof run -np N --timeline DIR`` of the small training
loop the tests use (``tests/workers/answers_worker.py``: an MLP trained with
``DistributedOptimizer``), where one rank spends ``--delay-ms`` more per step in data
loading, in forward or in backward (a hook on a gradient), from the first step or from a
step mid-run on. Balanced runs (no fault) are the false-alarm check and the baseline:
each repeat runs the balanced job first, then every faulty one, so the step-time change
``delta`` a fault caused is measured against a baseline taken minutes apart at most. The
mid-run scenario's baseline is its own steps before the onset.

Per scenario it reports, over the repeats:

* right rank (%): the verdict named the slow rank (goal >= 95%);
* named on balanced (%): a balanced run named a straggler;
* false alarms (%): ... and the ranks' own measured time (data + forward + backward, each
  rank timing itself) does not show that rank the slowest by 1 ms and a quarter of the
  cost named (goal 0): on a shared 2-core machine one rank of a balanced job can really
  be starved;
* cost within bounds (%): the verdict's cost per step lies in
  ``[0.75 min(delta, d), 1.25 max(delta, d)]`` (goal >= 95%), with ``d`` the injected delay;
* phase right (%): data loading / forward reported as "before the first gradient",
  backward as "backward";
* onset right (%): a mid-run fault's reported first step within one step of the truth;
* d, the median delta and the median cost (ms).

``--tiny`` trains a tiny model (for 8 and 16 ranks on a 2-core machine, heavily
oversubscribed). Results: ``benchmarks/results/answers_bench.<ranks>.json`` (``--output``).

    python benchmarks/answers_bench.py --ranks 2 --repeats 4
    python benchmarks/answers_bench.py --ranks 8 --tiny --repeats 2 --scenarios data,backward
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness  # noqa: E402

from hvdprof.analysis import diff_runs, find_stragglers, load_run  # noqa: E402

WORKER = ROOT / "tests" / "workers" / "answers_worker.py"
#: scenario -> (where the slow rank spends its delay, expected phase)
FAULTS = {
    "data": ("data", "before_first_gradient"),
    "forward": ("forward", "before_first_gradient"),
    "backward": ("backward", "backward"),
    "mid-run": ("data", "before_first_gradient"),
}
TINY = ["--width", "64", "--layers", "4", "--batch", "16"]


def run_job(
    ranks: int, steps: int, out_dir: Path, worker_args: list[str], timeout: float
) -> tuple[Path, list[float], list[float]]:
    """The job's timeline, rank 0's step times and each rank's own time per step (ms)."""
    tl, steps_file = out_dir / "tl", out_dir / "steps.json"
    command = [
        sys.executable, "-m", "hvdprof", "run", "-np", str(ranks), "--timeout", str(timeout),
        "--timeline", str(tl), "--", sys.executable, str(WORKER),
        "--steps", str(steps), "--out", str(steps_file), *worker_args,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("HVDPROF_")}
    env["HVDTEST_DEADLINE_S"] = str(timeout)
    proc = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout + 30, env=env, cwd=ROOT
    )
    if proc.returncode != 0 or not steps_file.exists():
        raise SystemExit(
            f"job failed ({proc.returncode}): {proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        )
    own = []
    for r in range(ranks):
        phases = json.loads(Path(f"{steps_file}.rank{r}").read_text())["phases_ms"][1:]
        own.append(statistics.median(sum(x[:3]) for x in phases))  # data+forward+backward
    return tl, json.loads(steps_file.read_text())["step_ms"], own


def judge(
    scenario: str,
    tl: Path,
    step_ms: list[float],
    own_ms: list[float],
    baseline: tuple[Path, list[float], list[float]] | None,
    slow: int,
    delay: float,
    onset: int,
) -> dict[str, Any]:
    run = load_run(tl, cache=False)
    s = find_stragglers(run)
    row: dict[str, Any] = {
        "scenario": scenario,
        "straggler": s.straggler,
        "verdict": s.verdict,
        "phase": s.phase,
        "onset_step": s.onset_step,
    }
    row["own_ms"] = own_ms
    if scenario == "balanced":
        # no fault injected; a rank named is a false alarm unless the ranks' measured own
        # time (data + forward + backward) shows it the slowest, by a material part of
        # the cost (1 ms and a quarter of it)
        row["named"] = s.straggler is not None
        row["false_alarm"] = False
        if s.straggler is not None:
            cost = next(r.cost_per_step_ms for r in s.ranks if r.rank == s.straggler)
            others = [x for r, x in enumerate(own_ms) if r != s.straggler]
            slower = own_ms[s.straggler] - statistics.median(others)
            slowest = own_ms[s.straggler] == max(own_ms)
            row["false_alarm"] = not slowest or slower < max(1.0, 0.25 * cost)
        return row
    top = next(r for r in s.ranks if r.rank == slow)
    row["cost_ms"] = top.cost_per_step_ms
    if scenario == "mid-run":
        delta = statistics.mean(step_ms[onset + 1 :]) - statistics.mean(step_ms[1 : onset - 1])
        row["onset_right"] = s.onset_step is not None and abs(s.onset_step - onset) <= 1
    else:
        assert baseline is not None
        delta = statistics.mean(step_ms[1:]) - statistics.mean(baseline[1][1:])
        d = diff_runs(load_run(baseline[0], cache=False), run)
        row["diff_cause"] = d.cause.key if d.cause else None
        row["diff_right"] = d.cause is not None and d.cause.key == f"rank {slow}: compute"
    row["delta_ms"] = delta
    lo, hi = 0.75 * min(delta, delay), 1.25 * max(delta, delay)
    row["right_rank"] = s.straggler == slow
    row["cost_within"] = s.straggler == slow and lo <= top.cost_per_step_ms <= hi
    row["phase_right"] = s.phase == FAULTS[scenario][1]
    return row


def pct(rows: list[dict[str, Any]], key: str) -> str:
    values = [bool(r[key]) for r in rows if key in r]
    return f"{100.0 * sum(values) / len(values):.0f}" if values else "-"


def med(rows: list[dict[str, Any]], key: str) -> str:
    values = [r[key] for r in rows if r.get(key) is not None]
    return f"{statistics.median(values):.1f}" if values else "-"


def summary_rows(rows: list[dict[str, Any]], ranks: int, delay: float) -> list[list[str]]:
    out = []
    for scenario in ("balanced", *FAULTS):
        mine = [r for r in rows if r["scenario"] == scenario]
        if not mine:
            continue
        out.append(
            [
                f"{scenario} ({ranks} ranks)",
                str(len(mine)),
                pct(mine, "right_rank"),
                pct(mine, "named"),
                pct(mine, "false_alarm"),
                pct(mine, "cost_within"),
                pct(mine, "phase_right"),
                pct(mine, "onset_right"),
                pct(mine, "diff_right"),
                "0" if scenario == "balanced" else f"{delay:g}",
                med(mine, "delta_ms"),
                med(mine, "cost_ms"),
            ]
        )
    return out


HEADER = [
    "scenario",
    "runs",
    "right rank % (>=95)",
    "named on balanced %",
    "false alarms % (0)",
    "cost in bounds % (>=95)",
    "phase right %",
    "onset right %",
    "diff cause right %",
    "d (ms)",
    "delta (ms)",
    "cost (ms)",
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--delay-ms", type=float, default=60.0)
    p.add_argument("--scenarios", default="data,forward,backward,mid-run")
    p.add_argument("--tiny", action="store_true", help="a tiny model (8 or 16 ranks)")
    p.add_argument("--quick", action="store_true", help="one repeat, data only")
    p.add_argument("--timeout", type=float, default=240.0, help="per job (s)")
    p.add_argument("--output", type=Path, default=None)
    args = p.parse_args()
    scenarios = ["data"] if args.quick else [x for x in args.scenarios.split(",") if x]
    repeats = 1 if args.quick else args.repeats
    slow = args.ranks - 1
    onset = args.steps // 3
    model = TINY if args.tiny else []
    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hvdprof-answers-") as tmp:
        for rep in range(repeats):
            base = Path(tmp) / f"r{rep}"
            baseline = run_job(args.ranks, args.steps, base / "balanced", model, args.timeout)
            rows.append(judge("balanced", *baseline, None, slow, args.delay_ms, onset))
            _harness.log(f"repeat {rep} balanced: {rows[-1]['verdict']}")
            for scenario in scenarios:
                where = FAULTS[scenario][0]
                steps = args.steps + (args.steps // 3 if scenario == "mid-run" else 0)
                fault = [
                    "--slow-rank", str(slow), "--delay-ms", str(args.delay_ms),
                    "--where", where, "--onset", str(onset if scenario == "mid-run" else 0),
                ]  # fmt: skip
                tl, step_ms, own = run_job(
                    args.ranks, steps, base / scenario, model + fault, args.timeout
                )
                rows.append(judge(scenario, tl, step_ms, own, baseline, slow, args.delay_ms, onset))
                _harness.log(f"repeat {rep} {scenario}: {rows[-1]['verdict']}")
    table = summary_rows(rows, args.ranks, args.delay_ms)
    print(_harness.table(table, HEADER))
    name = f"answers_bench.np{args.ranks}" + (".tiny" if args.tiny else "")
    path = _harness.write_results(
        name,
        {
            "ranks": args.ranks,
            "repeats": repeats,
            "steps": args.steps,
            "delay_ms": args.delay_ms,
            "tiny": args.tiny,
            "wall_s": round(time.monotonic() - started, 1),
            "header": HEADER,
            "table": table,
            "runs": rows,
            "variants": {s: [r for r in rows if r["scenario"] == s] for s in ("balanced", *FAULTS)},
        },
        args.output,
        args.quick,
    )
    print(f"results: {path}")


if __name__ == "__main__":
    main()
