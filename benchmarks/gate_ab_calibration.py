"""Calibrate ``hvdprof ab``: its false failures, catches, intervals, named causes and wall
time, on real gates of the demo job and of a larger job (issue 50's protocol).

    python benchmarks/gate_calibration.py --ab [--rounds 20] [--jobs demo,large] [--load]
        [--max-minutes N] [--since REV] [--merge OTHER.jsonl ...] [--summarize]

Each gate is one whole ``hvdprof ab`` (default budget, ``--fail-on 5%``) of one variant:

* ``same``: the unchanged job against itself;
* ``all10``: every rank's backward slower by 10% of the job's step (extra torch compute in the
  first layer's gradient, ``gate_worker.py``), the step probed first from five runs;
* ``all5``: every rank 5% slower, judged at ``--small-margin`` (default 1%: at a 5%
  margin a 5% slowdown is the margin itself, caught at most half the time by design);
* ``one10``: rank 1 alone 10% slower.

Jobs: ``demo`` (``hvdprof.demo``, batch 64) and ``large`` (the same model at batch 1024:
16x the compute per step). ``--load``: spin loops that start and stop while the gates
run (every 5-40 s, a random number from 0 to one per core, as a neighbour's jobs would),
so the machine changes speed between and within blocks.

The whole protocol (2 jobs x 4 variants x 20 rounds of up to 4.5 minutes, quiet and
loaded) is about 12 hours of a quiet machine, so it is collected over many sessions:
every finished gate appends one line to the ledger
(``benchmarks/results/gate_ab_calibration.ledger.jsonl``, see ``gate_ab_ledger.py``), and
each invocation runs only what the ledger still lacks, up to ``--rounds`` per job,
variant and load, always a cell with the fewest records next. ``--max-minutes N`` starts
no gate (nor probe) that could end past N minutes, so a session spends a fixed slice and
stops between gates. The summary (``gate_ab_calibration[.loaded].json``) is rewritten
from the ledger every time: counts, rates per cell, each goal met, not met or not yet
decided, and the rounds still to run.

Goals (issue 50): ``same`` fails at most 1 of 20; ``all10`` caught at least 19 of 20;
``all5`` caught at least 15 of 20 and its interval covers the injected slowdown in 18;
``one10`` caught 19 of 20 with the cause rank 1's compute in 18; a demo gate's wall time
at most 5 minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness
import gate_ab_ledger as ledger_mod
from gate_ab_ledger import GateRecord, ProbeRecord

WORKER = Path(__file__).resolve().parent / "gate_worker.py"
PY = sys.executable
VARIANTS = ledger_mod.VARIANTS
JOBS = {"demo": [], "large": ["--batch-size", "1024"]}
LEDGER = _harness.RESULTS_DIR / "gate_ab_calibration.ledger.jsonl"
#: unchanged runs whose median step sizes the injected slowdowns: the demo job's step
#: differed from 1.6 to 3.9 ms between two runs a few seconds apart (2026-11-29)
PROBE_RUNS = 5
#: what one probe (a few seconds a run) may take, for --max-minutes
PROBE_ALLOWANCE_S = 40.0
#: a gate ends by its budget; this covers its last block's overrun, pooling and start-up
GATE_OVERRUN_S = 30.0
#: --max-minutes expects a gate to take at most this many times the slowest block seen in
#: the ledger (same job and load) for every block it may run, and its budget at most
BLOCK_TIME_MARGIN = 1.5
#: consecutive gates without a verdict (a run failed) before the collection stops
MAX_ERRORS_IN_A_ROW = 2


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

    def changes_between(self, start: float, end: float) -> int:
        return sum(start <= t <= end for t, _ in self.changes)

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.on:
            self.thread.join()
        self._set(0)


# ----------------------------------------------------------------------- options


def options() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gate_calibration.py --ab", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--rounds", type=int, default=20, help="gates per job, variant and load (20)")
    p.add_argument("--jobs", default="demo,large")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--steps", type=int, default=100, help="steps per run (100)")
    p.add_argument("--margin", default="5%")
    p.add_argument("--small-margin", default="1%", help="the margin the 5%% slowdown is judged at")
    p.add_argument("--ab-args", default="", help="more `hvdprof ab` options, one string")
    p.add_argument("--ledger", type=Path, default=None,
                   help=f"(default results/{LEDGER.name}; another ledger's summary goes "
                   "beside it, LEDGER.summary.json, unless --output)")  # fmt: skip
    p.add_argument("--max-minutes", type=float, default=None,
                   help="start no gate expected to end past N minutes; stop between gates")  # fmt: skip
    p.add_argument("--since", metavar="REV", default=None,
                   help="count only records from REV's descendants (older gate code)")  # fmt: skip
    p.add_argument("--merge", type=Path, nargs="+", default=[], metavar="LEDGER",
                   help="first add the records of these ledgers that this one lacks")  # fmt: skip
    p.add_argument("--summarize", action="store_true", help="run no gate; rewrite the summary")
    p.add_argument("--size-tolerance", type=float, default=ledger_mod.SIZE_TOLERANCE,
                   metavar="SHARE", help="count a slowed gate only when its slowdown, over its "
                   "own baseline's step, is within SHARE of its size (0.3); another runs")  # fmt: skip
    p.add_argument("--probe-max-age", type=float, default=30.0, metavar="MIN",
                   help="size slowdowns from a gate or probe this recent (30 minutes)")  # fmt: skip
    return p


def settings_of(args: argparse.Namespace) -> dict[str, Any]:
    """What two records must share to be counted together (besides job, variant, load)."""
    return {
        "steps": args.steps,
        "margin": args.margin,
        "small_margin": args.small_margin,
        "ab_args": list(args.ab_args),
    }


def quick_settings(args: argparse.Namespace) -> list[str]:
    """A smoke run: one short gate (2 blocks of 20 steps) of ``same`` and ``one10`` of the
    demo job; the jobs."""
    args.rounds, args.steps = 1, 20
    args.size_tolerance = float("inf")  # it checks the plumbing, not the slowdown's size
    args.variants = ["same", "one10"]
    args.ab_args += ["--min-blocks", "2", "--max-blocks", "2", "--warmup", "0"]
    return ["demo"]


def ab_options(ab_args: list[str]) -> argparse.Namespace:
    """The options ``hvdprof ab`` will run under (its own defaults where none is given:
    the budget, the warm-up and the most blocks), read with its own parser, which also
    refuses bad options here rather than in every gate."""
    from hvdprof.analysis.ab_cli import add_ab_parser

    p = argparse.ArgumentParser(prog="hvdprof")
    add_ab_parser(p.add_subparsers(dest="command"))
    return p.parse_args(["ab", "--command", "true", *ab_args])


# ------------------------------------------------------------------------- gates


def probe_step_ms(job: str, steps: int, base: Path) -> list[float]:
    """The job's step time in unchanged runs (as a user sizes a slowdown)."""
    from hvdprof.analysis import load_run
    from hvdprof.analysis.steps import typical_step_ms
    from hvdprof.config import name_of

    found = []
    for i in range(PROBE_RUNS):
        out = base / f"probe-{job}-{i}-{time.monotonic_ns()}"
        env = {**os.environ, name_of("timeline_dir"): str(out)}
        subprocess.run(job_command(job, steps), shell=True, env=env, check=True,
                       capture_output=True, timeout=900)  # fmt: skip
        found.append(typical_step_ms(load_run(str(out), cache=False)))
        shutil.rmtree(out, ignore_errors=True)
    return found


def _ab_process(command: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """``hvdprof ab``, stopped with SIGTERM (which ends its run under way with the run's
    ranks) when this calibration is stopped or the gate runs past ``timeout``."""
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          stdin=subprocess.DEVNULL) as proc:  # fmt: skip
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def run_gate(
    out: Path, baseline: str, candidate: str, margin: str, extra: list[str], timeout: float
) -> tuple[int, dict[str, Any], float, str]:
    """One ``hvdprof ab`` gate: its exit code, JSON result, wall time and output."""
    result = out.with_suffix(".json")
    started = time.monotonic()
    done = _ab_process(
        [PY, "-m", "hvdprof", "ab", "--baseline", baseline, "--candidate", candidate,
         "--fail-on", margin, "--out", str(out), "--json", str(result), *extra],
        timeout,
    )  # fmt: skip
    wall = time.monotonic() - started
    data = json.loads(result.read_text()) if result.exists() else {}
    return done.returncode, data, wall, (done.stdout + done.stderr)[-4000:]


def _median_of(data: dict[str, Any], key: str) -> float | None:
    """The median over both sides of ``hvdprof ab --json``'s per-side medians."""
    values = [v for v in (data.get(key) or {}).values() if v is not None]
    return round(statistics.median(values), 3) if values else None


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


def gate_record(
    job: str, variant: str, load: str, rnd: int, settings: dict[str, Any], probe: float | None,
    slow_ms: float, code: int, data: dict[str, Any], wall: float, started: str,
    load_changes: int, provenance: dict[str, Any], output: str,
) -> GateRecord:  # fmt: skip
    j = data.get("judgement") or {}
    base = [
        r["step_ms"]
        for r in data.get("runs") or []
        if r.get("side") == "baseline" and r.get("block", 0) > 0 and r.get("step_ms")
    ]
    return GateRecord(
        job=job, variant=variant, load=load, round=rnd, seed=rnd, settings=settings,
        exit=code, failed=bool(data.get("failed")) and code == 3,
        verdict=data.get("verdict") or _last_line(output),
        estimate=j.get("estimate"), low=j.get("low"), high=j.get("high"), alpha=j.get("alpha"),
        blocks=j.get("blocks"), stopped=data.get("stopped", ""),
        cause=(data.get("cause") or {}).get("key"), wall_s=round(wall, 1),
        probe_step_ms=probe, slow_ms=slow_ms,
        baseline_step_ms=round(statistics.median(base), 4) if base else None,
        load_changes=load_changes, started=started, date=ledger_mod.now_iso(),
        provenance=provenance,
        run_wall_s=_median_of(data, "median_wall_s"),
        startup_s=_median_of(data, "median_startup_s"),
        set_aside=len(data.get("set_aside_blocks") or []),
    )  # fmt: skip


# -------------------------------------------------------------------- collection


class Collection:
    """One session's share of the protocol: gates until every cell has ``rounds`` or the
    next one could pass ``--max-minutes``."""

    def __init__(self, args: argparse.Namespace, jobs: list[str], load: bool,
                 ledger: ledger_mod.Ledger, base: Path, spin: ChangingLoad,
                 descends: ledger_mod.Descends) -> None:  # fmt: skip
        self.args, self.jobs, self.ledger, self.base, self.spin = args, jobs, ledger, base, spin
        self.load = "changing" if load else "none"
        self.settings = settings_of(args)
        self.descends = descends
        ab = ab_options(args.ab_args)
        self.budget_s, self.warmup = float(ab.budget), ab.warmup
        self.most_blocks = ab.warmup + ab.max_blocks
        self.probes: dict[str, float] = {}
        self.started = time.monotonic()
        self.errors_in_a_row = 0

    def selection(self) -> ledger_mod.Selection:
        return ledger_mod.select(self.ledger.gates, self.load, self.settings, self.descends,
                                 self.args.size_tolerance)  # fmt: skip

    def expected_gate_s(self, job: str) -> float:
        """The longest the next gate of ``job`` should take: every block it may run at
        1.5x the slowest block of this job and load in the ledger, never more than its
        budget allows; the budget's bound until a gate has been seen. (A gate that runs
        past --max-minutes still ends; wrap the command in ``timeout`` for a hard bound:
        a gate killed is lost, nothing else.)"""
        bound = self.budget_s + GATE_OVERRUN_S
        per_block = [
            g.wall_s / (g.blocks + self.warmup)
            for g in self.selection().gates
            if g.job == job and g.blocks
        ]
        if not per_block:
            return bound
        return min(
            bound, BLOCK_TIME_MARGIN * max(per_block) * self.most_blocks + GATE_OVERRUN_S / 2
        )

    def step_ms(self, job: str) -> float:
        """The step a slowdown is sized from: the last gate's baseline runs (the machine as
        it runs now, from 20-40 warm runs), else a recent probe, else probe runs now. A
        ``--concurrent`` gate's baselines ran beside their candidates (each at about twice
        its own step), so its slowdowns are sized from probes only, which run alone."""
        recent = None if "--concurrent" in self.args.ab_args else self.last_baseline(job)
        if recent is not None:
            _harness.log(
                f"{job}: step {recent[0]:.3f} ms (the baseline of the gate of {recent[1]})"
            )
            return recent[0]
        if job in self.probes:
            return self.probes[job]
        probes = [p for p in self.ledger.probes if len(p.runs_ms) >= PROBE_RUNS]
        found = ledger_mod.fresh_probe(probes, job, self.load, self.args.steps,
                                       self.args.probe_max_age * 60.0, time.time())  # fmt: skip
        if found is None:
            runs = probe_step_ms(job, self.args.steps, self.base)
            found = ProbeRecord(job, self.load, self.args.steps, statistics.median(runs), runs,
                                time.time(), ledger_mod.now_iso(),
                dataclasses.asdict(ledger_mod.Provenance.current()))  # fmt: skip
            ledger_mod.append_record(self.ledger.path, found)
            self.ledger.records.append(found)
            _harness.log(
                f"{job}: step {found.step_ms:.3f} ms (probed: {[round(r, 3) for r in runs]})"
            )
        else:
            _harness.log(f"{job}: step {found.step_ms:.3f} ms (probe of {found.date}, reused)")
        self.probes[job] = found.step_ms
        return found.step_ms

    def last_baseline(self, job: str) -> tuple[float, str] | None:
        sel = self.selection()
        seen = [g for g in sel.gates + sel.mis_sized if g.job == job and g.baseline_step_ms]
        last = max(seen, key=lambda g: g.unix_s, default=None)
        if last is None or time.time() - last.unix_s > self.args.probe_max_age * 60.0:
            return None
        assert last.baseline_step_ms is not None
        return last.baseline_step_ms, last.date

    def run(self) -> str:
        """Gates until done or out of time; why it stopped."""
        limit = None if self.args.max_minutes is None else self.args.max_minutes * 60.0
        while True:
            gates = self.selection().gates
            counts = ledger_mod.cell_counts(gates, self.jobs, self.args.variants)
            cell = ledger_mod.next_cell(counts, self.args.rounds, 50 + len(self.ledger.records))
            if cell is None:
                return "every cell has its rounds"
            job, variant = cell
            need = self.expected_gate_s(job)
            sized_by_probe = "--concurrent" in self.args.ab_args or not self.last_baseline(job)
            if variant != "same" and job not in self.probes and sized_by_probe:
                need += PROBE_ALLOWANCE_S
            elapsed = time.monotonic() - self.started
            if limit is not None and elapsed + need > limit:
                return (f"--max-minutes {self.args.max_minutes:g}: the next gate could take "
                        f"{need:.0f} s and {max(0.0, limit - elapsed):.0f} s are left")  # fmt: skip
            self.one_gate(job, variant, counts[cell])
            if self.errors_in_a_row >= MAX_ERRORS_IN_A_ROW:
                return f"{self.errors_in_a_row} gates in a row ended without a verdict"

    def one_gate(self, job: str, variant: str, rnd: int) -> None:
        args = self.args
        step = None if variant == "same" else self.step_ms(job)
        share = ledger_mod.INJECTED[variant]
        slow_ms = round(share * step, 3) if step else 0.0
        slow_rank = 1 if variant == "one10" else -1
        margin = args.small_margin if variant == "all5" else args.margin
        plain = job_command(job, args.steps)
        candidate = job_command(job, args.steps, slow_ms, slow_rank) if slow_ms else plain
        out = self.base / f"{job}-{variant}-r{rnd}-{time.monotonic_ns()}"
        # which code ran this gate: read per gate, as a shared checkout changes under it
        provenance = dataclasses.asdict(ledger_mod.Provenance.current())
        started_iso, t0 = ledger_mod.now_iso(), time.time()
        code, data, wall, output = run_gate(out, plain, candidate, margin,
                                            ["--seed", str(rnd), *args.ab_args],
                                            2 * self.budget_s + 300)  # fmt: skip
        record = gate_record(job, variant, self.load, rnd, self.settings, step, slow_ms, code,
                             data, wall, started_iso, self.spin.changes_between(t0, time.time()),
                             provenance, output)  # fmt: skip
        ledger_mod.append_record(self.ledger.path, record)
        self.ledger.records.append(record)
        if code in (0, 3):
            self.errors_in_a_row = 0
            shutil.rmtree(out, ignore_errors=True)
            _harness.log(f"{job} {variant} round {rnd} ({wall:.0f} s): {record.verdict}")
            return
        self.errors_in_a_row += 1
        kept = Path(tempfile.mkdtemp(prefix="hvdprof-ab-cal-kept-"))
        shutil.move(str(out), kept / out.name)
        with contextlib.suppress(OSError):
            shutil.move(str(out.with_suffix(".json")), kept / f"{out.name}.json")
        _harness.log(f"{job} {variant} round {rnd}: gate ended {code}, no verdict; runs kept "
                     f"in {kept}: {record.verdict}")  # fmt: skip


@contextlib.contextmanager
def _ledger_lock(path: Path) -> Iterator[None]:
    """One collector per ledger at a time (two would both run the same missing gate): a
    lock on the ledger itself, so nothing else is left beside it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as ledger:
        try:
            fcntl.flock(ledger, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SystemExit(f"error: another calibration is writing {path}") from None
        yield


def _stop_on_sigterm() -> None:
    def stop(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)


def write_summaries(
    args: argparse.Namespace, jobs: list[str], load: bool, ledger: ledger_mod.Ledger,
    descends: ledger_mod.Descends, output: Path | None, quick: bool,
) -> None:  # fmt: skip
    """``gate_ab_calibration[.loaded].json`` from the ledger: the current load's always
    (when it has a gate), the other's too when it has gates and no --output was given."""
    settings = settings_of(args)
    for name in ("none", "changing"):
        current = (name == "changing") == load
        if not current and output is not None:
            continue
        sel = ledger_mod.select(ledger.gates, name, settings, descends, args.size_tolerance)
        if not sel.gates and not sel.errors:
            if current:
                print(f"no gate of load {name!r} with these settings in {ledger.path} yet")
            continue
        # the whole protocol's rows and missing rounds, whichever part this session ran
        every = (jobs, args.variants) if quick else (list(JOBS), list(VARIANTS))
        payload = ledger_mod.summary(ledger, sel, *every, args.rounds)
        header = ["job", "measure", "result", "goal", "met"]
        print(_harness.table([[*r[:4], {True: "yes", False: "NO", None: ""}[r[4]]]
                              for r in payload["table"]], header))  # fmt: skip
        path = _harness.write_results(
            "gate_ab_calibration" + (".loaded" if name == "changing" else ""),
            {**settings, "load": name, "cores": os.cpu_count(), **payload},
            output if current else None,
            quick,
        )
        print(f"results: {path} ({payload['gates_counted']} gates, "
              f"{payload['gates_missing']} to run)")  # fmt: skip


def main(argv: list[str], quick: bool, load: bool, output: Path | None) -> None:
    args = options().parse_args(argv)
    args.variants = [v for v in args.variants.split(",") if v]
    args.ab_args = args.ab_args.split()
    jobs = [j for j in args.jobs.split(",") if j]
    bad = [v for v in args.variants if v not in VARIANTS] + [j for j in jobs if j not in JOBS]
    if bad:
        raise SystemExit(f"error: unknown job or variant: {', '.join(bad)}")
    if quick:
        jobs = quick_settings(args)
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="hvdprof-ab-cal-")))
        if args.ledger is not None:
            path = args.ledger
            if output is None and path.resolve() != LEDGER.resolve():  # not results/'s
                output = path.with_name(path.name.removesuffix(".jsonl") + ".summary.json")
        elif output is not None:
            path = output.with_name(output.stem + ".ledger.jsonl")
        else:  # a smoke run keeps no records
            path = tmp / "quick.ledger.jsonl" if quick else LEDGER
        stack.enter_context(_ledger_lock(path))
        if args.merge:
            print(f"merged {ledger_mod.merge_into(path, args.merge)} record(s) into {path}")
        try:
            descends = ledger_mod.Descends(args.since)
        except ValueError as exc:  # --since names no commit
            raise SystemExit(f"error: {exc}") from None
        ledger = ledger_mod.read_ledger(path)
        why, interrupted = "--summarize", False
        if not args.summarize and args.rounds > 0:
            _stop_on_sigterm()
            try:
                with ChangingLoad(load, 50 + len(ledger.records)) as spin:
                    why = Collection(args, jobs, load, ledger, tmp, spin, descends).run()
            except KeyboardInterrupt:
                why, interrupted = "interrupted (the gate in flight is lost, the ledger kept)", True
        print(f"stopped: {why}")
        write_summaries(args, jobs, load, ledger, descends, output, quick)
    if interrupted:
        raise SystemExit(130)
