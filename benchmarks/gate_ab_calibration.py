"""Calibrate ``hvdprof ab``: its false failures, catches, intervals, named causes and wall
time, on real gates of the demo job and of a larger job (issue 50's protocol).

    python benchmarks/gate_calibration.py --ab [--rounds 20] [--jobs demo,large] [--load]

Each round runs one whole ``hvdprof ab`` gate (default budget, ``--fail-on 5%``) per
variant, the variants in a shuffled order:

* ``same``: the unchanged job against itself;
* ``all10``: every rank's backward slower by 10% of the job's step (a busy wait in the
  first layer's gradient, ``gate_worker.py``), the step measured first from two runs;
* ``all5``: every rank 5% slower, judged at ``--small-margin`` (default 1%: at a 5%
  margin a 5% slowdown is the margin itself, caught at most half the time by design);
* ``one10``: rank 1 alone 10% slower.

Jobs: ``demo`` (``hvdprof.demo``, batch 64) and ``large`` (the same model at batch 1024:
16x the compute per step). ``--load``: spin loops that start and stop while the gates
run (every 5-40 s, a random number from 0 to one per core, as a neighbour's jobs would),
so the machine changes speed between and within blocks.

Goals (issue 50): ``same`` fails at most 1 of 20; ``all10`` caught at least 19 of 20;
``all5`` caught at least 15 of 20 and its interval covers the injected slowdown in 18;
``one10`` caught 19 of 20 with the cause rank 1's compute in 18; a demo gate's wall time
at most 5 minutes. Results: ``benchmarks/results/gate_ab_calibration[.loaded].json``.
The full protocol takes hours of a quiet machine: 2 jobs x 4 variants x 20 rounds of up
to 4.5 minutes each, twice (quiet and ``--load``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness

WORKER = Path(__file__).resolve().parent / "gate_worker.py"
PY = sys.executable
VARIANTS = ("same", "all10", "all5", "one10")
JOBS = {"demo": [], "large": ["--batch-size", "1024"]}


def job_command(job: str, steps: int, slow_ms: float = 0.0, slow_rank: int = -1) -> str:
    """The shell command line of one run of ``job`` (2 ranks), as a CI job would give it."""
    demo_args = " ".join([*JOBS[job], "--steps", str(steps)])
    return (
        f"{PY} -m hvdprof run -np 2 --timeout 600 -- {PY} {WORKER} "
        f"--slow-ms {slow_ms} --slow-rank {slow_rank} -- {demo_args}"
    )


class ChangingLoad:
    """Spin loops that start and stop at random (a neighbour's jobs): every 5-40 s the
    number running changes to another from 0 to one per core."""

    def __init__(self, on: bool, seed: int) -> None:
        self.on, self.rng = on, random.Random(seed)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.stop = threading.Event()
        self.changes: list[tuple[float, int]] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ChangingLoad:
        if self.on:
            self.thread.start()
        return self

    def _set(self, count: int) -> None:
        while len(self.procs) > count:
            p = self.procs.pop()
            p.kill()
            p.wait()
        while len(self.procs) < count:
            self.procs.append(subprocess.Popen([PY, "-c", "while True: pass"]))
        self.changes.append((time.time(), count))

    def _run(self) -> None:
        cores = os.cpu_count() or 1
        while not self.stop.is_set():
            choices = [n for n in range(cores + 1) if n != len(self.procs)]
            self._set(self.rng.choice(choices))
            self.stop.wait(self.rng.uniform(5.0, 40.0))

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.on:
            self.thread.join()
        self._set(0)


def probe_step_ms(job: str, steps: int, base: Path) -> float:
    """The job's step time, from two unchanged runs (as a user sizes a slowdown)."""
    from hvdprof.analysis import load_run
    from hvdprof.analysis.steps import typical_step_ms
    from hvdprof.config import name_of

    found = []
    for i in range(2):
        out = base / f"probe-{job}-{i}"
        env = {**os.environ, name_of("timeline_dir"): str(out)}
        subprocess.run(job_command(job, steps), shell=True, env=env, check=True,
                       capture_output=True, timeout=900)  # fmt: skip
        found.append(typical_step_ms(load_run(str(out), cache=False)))
    return statistics.median(found)


def run_gate(base: Path, name: str, baseline: str, candidate: str, margin: str,
             extra: list[str]) -> dict[str, Any]:  # fmt: skip
    """One ``hvdprof ab`` gate; its JSON result, exit code and wall time."""
    result = base / f"{name}.json"
    started = time.monotonic()
    done = subprocess.run(
        [PY, "-m", "hvdprof", "ab", "--baseline", baseline, "--candidate", candidate,
         "--fail-on", margin, "--out", str(base / name), "--json", str(result), *extra],
        capture_output=True, text=True, timeout=3600,
    )  # fmt: skip
    wall = time.monotonic() - started
    if done.returncode not in (0, 3) or not result.exists():
        raise RuntimeError(f"gate {name} ended {done.returncode}:\n{done.stdout}\n{done.stderr}")
    data = json.loads(result.read_text())
    j = data["judgement"] or {}
    return {
        "exit": done.returncode,
        "failed": data["failed"],
        "margin": margin,
        "estimate": j.get("estimate"),
        "low": j.get("low"),
        "high": j.get("high"),
        "blocks": j.get("blocks"),
        "stopped": data["stopped"],
        "cause": (data["cause"] or {}).get("key"),
        "wall_s": round(wall, 1),
        "verdict": data["verdict"],
    }


def one_round(base: Path, job: str, rnd: int, step_ms: float, args: Any, rng: random.Random) -> dict[str, Any]:  # fmt: skip
    plain = job_command(job, args.steps)
    variants = {
        "same": (plain, args.margin),
        "all10": (job_command(job, args.steps, round(0.10 * step_ms, 3)), args.margin),
        "all5": (job_command(job, args.steps, round(0.05 * step_ms, 3)), args.small_margin),
        "one10": (job_command(job, args.steps, round(0.10 * step_ms, 3), 1), args.margin),
    }
    order = list(args.variants)
    rng.shuffle(order)
    row: dict[str, Any] = {"job": job, "round": rnd, "order": order}
    for v in order:
        candidate, margin = variants[v]
        extra = ["--seed", str(rnd), *args.ab_args]
        row[v] = run_gate(base, f"{job}-r{rnd}-{v}", plain, candidate, margin, extra)
        _harness.log(f"{job} round {rnd} {v}: {row[v]['verdict']}")
    return row


def table(rows: list[dict[str, Any]], job: str) -> list[list[str]]:
    mine = [r for r in rows if r["job"] == job]
    n = len(mine)

    def count(v: str, test: Any) -> str:
        have = [r[v] for r in mine if v in r]
        return f"{sum(bool(test(x)) for x in have)} of {len(have)}"

    walls = [r[v]["wall_s"] for r in mine for v in VARIANTS if v in r]
    return [
        [job, "identical: failed", count("same", lambda x: x["failed"]), f"<= {max(1, n // 20)}"],
        [job, "every rank 10% slower: caught", count("all10", lambda x: x["failed"]), ">= 95%"],
        [job, "every rank 5% slower: caught", count("all5", lambda x: x["failed"]), ">= 75%"],
        [
            job,
            "... interval covers 5%",
            count(
                "all5", lambda x: x["low"] is not None and x["low"] <= 0.05 <= (x["high"] or 1e9)
            ),
            ">= 90%",
        ],
        [job, "rank 1 10% slower: caught", count("one10", lambda x: x["failed"]), ">= 95%"],
        [
            job,
            "... cause rank 1's compute",
            count("one10", lambda x: x["cause"] == "rank 1: compute"),
            ">= 90%",
        ],
        [
            job,
            "gate wall time (max, median)",
            f"{max(walls, default=0):.0f} s, {statistics.median(walls) if walls else 0:.0f} s",
            "<= 300 s",
        ],
    ]


def main(argv: list[str], quick: bool, load: bool, output: Path | None) -> None:
    p = argparse.ArgumentParser(prog="gate_calibration.py --ab")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--jobs", default="demo,large")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--steps", type=int, default=100, help="steps per run (100)")
    p.add_argument("--margin", default="5%")
    p.add_argument("--small-margin", default="1%", help="the margin the 5%% slowdown is judged at")
    p.add_argument("--ab-args", default="", help="more `hvdprof ab` options, one string")
    args = p.parse_args(argv)
    args.variants = [v for v in args.variants.split(",") if v]
    args.ab_args = args.ab_args.split()
    jobs = [j for j in args.jobs.split(",") if j]
    if quick:  # a smoke run: one short gate per variant of the demo job
        args.rounds, args.steps, jobs = 1, 20, ["demo"]
        args.variants = ["same", "one10"]
        args.ab_args += ["--min-blocks", "2", "--max-blocks", "2", "--warmup", "0"]
    rng = random.Random(50)
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    probes: dict[str, float] = {}
    with (
        tempfile.TemporaryDirectory(prefix="hvdprof-ab-cal-") as tmp,
        ChangingLoad(load, 50) as spin,
    ):
        base = Path(tmp)
        for job in jobs:
            probes[job] = probe_step_ms(job, args.steps, base)
            _harness.log(f"{job}: step {probes[job]:.3f} ms")
            for rnd in range(args.rounds):
                rows.append(one_round(base, job, rnd, probes[job], args, rng))
        changes = len(spin.changes)
    header = ["job", "measure", "result", "goal"]
    rows_table = [line for job in jobs for line in table(rows, job)]
    print(_harness.table(rows_table, header))
    path = _harness.write_results(
        "gate_ab_calibration" + (".loaded" if load else ""),
        {
            "rounds": args.rounds,
            "jobs": jobs,
            "steps": args.steps,
            "margin": args.margin,
            "small_margin": args.small_margin,
            "ab_args": args.ab_args,
            "probe_step_ms": probes,
            "load": "changing" if load else "none",
            "load_changes": changes,
            "cores": os.cpu_count(),
            "wall_s": round(time.monotonic() - started, 1),
            "header": header,
            "table": rows_table,
            "variants": {v: [r[v] for r in rows if v in r] for v in VARIANTS},
            "rows": rows,
        },
        output,
        quick,
    )
    print(f"results: {path}")
