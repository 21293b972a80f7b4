"""Calibrate ``hvdprof diff --fail-on``: false failures on identical runs, catches of a
known slowdown, and the rank and phase it names, on real runs of the demo job.

Each round records four fresh runs of ``hvdprof.demo`` (2 ranks, ``--steps`` steps each,
the launcher's defaults, a timeline as a CI job would record it), in a shuffled order:

* ``a`` and ``same``: the unchanged job twice;
* ``all``: every rank's backward pass slower by ``--slowdown`` of the job's step time
  (measured first, from two unchanged runs);
* ``one``: the same slowdown in rank 1's backward only.

and compares them as a CI job would: ``hvdprof analyze a --summary a.json``, then
``hvdprof diff a.json X --fail-on 5% --json`` for X in ``same``, ``all``, ``one``. It also
diffs each against ``a``'s trace and checks that the verdict and the gate are the same as
against the summary. ``--load`` runs one spin loop per core beside everything.

Goals (issue 40): ``same`` fails in at most 1 of 20 rounds; ``all`` is caught in at least
19 of 20; ``one`` is caught and the diff names rank 1's compute. The summary is at most 1%
of the traces' size. Results: ``benchmarks/results/gate_calibration[.loaded].json``.

    python benchmarks/gate_calibration.py [--rounds 20] [--steps 150] [--load]

``--ab`` calibrates ``hvdprof ab`` (baseline and candidate interleaved in one job)
instead: see ``benchmarks/gate_ab_calibration.py``.
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
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness  # noqa: E402

WORKER = Path(__file__).resolve().parent / "gate_worker.py"
HVDPROF = [sys.executable, "-m", "hvdprof"]
VARIANTS = ("a", "same", "all", "one")


def record(out: Path, steps: int, slow_ms: float, slow_rank: int, timeout: float) -> float:
    """One run of the demo job with its timeline in ``out``; returns its wall time (s)."""
    command = [
        *HVDPROF, "run", "-np", "2", "--timeout", str(timeout), "--timeline", str(out), "--",
        sys.executable, str(WORKER), "--slow-ms", str(slow_ms), "--slow-rank", str(slow_rank),
        "--", "--steps", str(steps),
    ]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout + 60)
    if done.returncode != 0:
        raise RuntimeError(f"run failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return time.monotonic() - started


def diff(a: str, b: str, rule: str) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(
        [*HVDPROF, "diff", a, b, "--fail-on", rule, "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode not in (0, 1, 3):
        raise RuntimeError(f"diff failed ({done.returncode}): {done.stderr}")
    return done.returncode, json.loads(done.stdout)


def summarize(run_dir: Path, out: Path) -> int:
    done = subprocess.run(
        [*HVDPROF, "analyze", str(run_dir), "--json", "--summary", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode not in (0, 1):
        raise RuntimeError(f"analyze failed ({done.returncode}): {done.stderr}")
    return out.stat().st_size


def trace_bytes(run_dir: Path) -> int:
    return sum(p.stat().st_size for p in run_dir.glob("rank.*.json*"))


def step_ms(run_dir: Path) -> float:
    from hvdprof.analysis import load_run
    from hvdprof.analysis.steps import typical_step_ms

    return typical_step_ms(load_run(str(run_dir), cache=False))


def _options() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--slowdown", type=float, default=0.10, help="of the step time (0.10)")
    p.add_argument("--rule", default="5%", help="the --fail-on rule tested (5%%)")
    p.add_argument("--load", action="store_true", help="one spin loop per core beside it all")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--output", type=Path, default=None)
    p.add_argument("--quick", action="store_true", help="2 rounds of 40 steps (a smoke run)")
    p.add_argument(
        "--ab",
        action="store_true",
        help="calibrate `hvdprof ab` instead (issue 50's protocol; see gate_ab_calibration.py)",
    )
    return p


def _ab_main(argv: list[str]) -> None:
    """``--ab``: only the options both calibrations share are read here; the rest
    (``--rounds``, ``--steps``, ``--max-minutes`` ...) are gate_ab_calibration's own."""
    import gate_ab_calibration

    shared = argparse.ArgumentParser(add_help=False)
    shared.add_argument("--ab", action="store_true")
    shared.add_argument("--quick", action="store_true")
    shared.add_argument("--load", action="store_true")
    shared.add_argument("--output", type=Path, default=None)
    args, rest = shared.parse_known_args(argv)
    gate_ab_calibration.main(rest, quick=args.quick, load=args.load, output=args.output)


def main() -> None:
    if "--ab" in sys.argv[1:]:
        _ab_main(sys.argv[1:])
        return
    p = _options()
    args, rest = p.parse_known_args()
    if rest:
        p.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.quick:
        args.rounds, args.steps = 2, 40
    rng = random.Random(40)
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="hvdprof-gate-") as tmp, _harness.spin_loops(args.load):
        base = Path(tmp)
        # the job's step time, from two unchanged runs (as a user sizes a margin)
        probes = []
        for i in range(2):
            record(base / f"probe{i}", args.steps, 0.0, -1, args.timeout)
            probes.append(step_ms(base / f"probe{i}"))
        slow_ms = round(args.slowdown * statistics.median(probes), 3)
        _harness.log(f"step {statistics.median(probes):.3f} ms: slowdown {slow_ms} ms")
        for rnd in range(args.rounds):
            row = _round(args, base, rnd, slow_ms, rng)
            rows.append(row)
            _harness.log(
                f"round {rnd}: "
                + "; ".join(
                    f"{v} {'FAIL' if row[v]['failed'] else 'pass'} {row[v]['change']:+.1%}"
                    f" (>= {row[v]['low']:+.1%}) cause {row[v]['cause']}"
                    for v in ("same", "all", "one")
                )
            )
    n = len(rows)
    header, table = _goal_table(rows)
    print(_harness.table(table, header))
    changes = {v: [r[v]["change"] for r in rows] for v in ("same", "all", "one")}
    name = "gate_calibration" + (".loaded" if args.load else "")
    path = _harness.write_results(
        name,
        {
            "rounds": n,
            "steps": args.steps,
            "rule": args.rule,
            "slowdown": args.slowdown,
            "slow_ms": slow_ms,
            "probe_step_ms": probes,
            "load": args.load,
            "cores": os.cpu_count(),
            "wall_s": round(time.monotonic() - started, 1),
            "header": header,
            "table": table,
            "median_change": {v: statistics.median(c) for v, c in changes.items()},
            "variants": {v: [r[v] for r in rows] for v in ("same", "all", "one")},
            "rows": rows,
        },
        args.output,
        args.quick,
    )
    print(f"results: {path}")


def _round(
    args: argparse.Namespace, base: Path, rnd: int, slow_ms: float, rng: random.Random
) -> dict[str, Any]:
    """One round: every variant recorded (in a shuffled order), then each gated against
    the reference's summary and against its traces."""
    order = list(VARIANTS)
    rng.shuffle(order)
    dirs = {v: base / f"r{rnd}-{v}" for v in VARIANTS}
    for v in order:
        inject = {"a": (0.0, -1), "same": (0.0, -1), "all": (slow_ms, -1)}
        ms, rank = inject.get(v, (slow_ms, 1))
        record(dirs[v], args.steps, ms, rank, args.timeout)
    summary = base / f"r{rnd}-a.summary.json"
    size = summarize(dirs["a"], summary)
    row: dict[str, Any] = {
        "round": rnd,
        "order": order,
        "summary_bytes": size,
        "trace_bytes": trace_bytes(dirs["a"]),
    }
    for v in ("same", "all", "one"):
        code, data = diff(str(summary), str(dirs[v]), args.rule)
        code_t, data_t = diff(str(dirs["a"]), str(dirs[v]), args.rule)
        gate = data["gate"][0]
        check = gate["checks"][0] if gate["checks"] else {}
        cause = data.get("cause") or {}
        row[v] = {
            "failed": gate["failed"],
            "exit": code,
            "change": check.get("change"),
            "low": check.get("low"),
            "high": check.get("high"),
            "a_ms": check.get("a_ms"),
            "b_ms": check.get("b_ms"),
            "cause": cause.get("key"),
            "cause_ms": cause.get("delta_ms"),
            "message": gate["message"],
            "same_against_trace": code == code_t
            and data["verdict"] == data_t["verdict"]
            and data["gate"] == data_t["gate"],
        }
    return row


def _goal_table(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """``(header, rows)`` of the results against the goals."""
    n = len(rows)
    false_fail = sum(r["same"]["failed"] for r in rows)
    caught_all = sum(r["all"]["failed"] for r in rows)
    caught_one = sum(r["one"]["failed"] for r in rows)
    named_one = sum(r["one"]["cause"] == "rank 1: compute" for r in rows)
    named_all = sum((r["all"]["cause"] or "").endswith(": compute") for r in rows)
    identical = sum(r[v]["same_against_trace"] for r in rows for v in ("same", "all", "one"))
    share = max(r["summary_bytes"] / r["trace_bytes"] for r in rows)
    header = ["measure", "result", "goal"]
    table = [
        ["identical runs failed", f"{false_fail} of {n}", f"<= {max(1, n // 20)} of {n}"],
        ["10% slower (every rank) caught", f"{caught_all} of {n}", f">= {n - max(1, n // 20)}"],
        ["... cause named a rank's compute", f"{named_all} of {n}", "-"],
        ["10% slower (rank 1 backward) caught", f"{caught_one} of {n}", "-"],
        ["... cause named rank 1's compute", f"{named_one} of {n}", f"{n} of {n}"],
        ["summary verdict = trace verdict", f"{identical} of {3 * n}", "all"],
        ["summary / traces (largest)", f"{share:.2%}", "<= 1%"],
    ]
    return header, table


if __name__ == "__main__":
    main()
