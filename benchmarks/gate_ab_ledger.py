"""The ledger of ``hvdprof ab``'s calibration: one JSON line per finished gate, so the
protocol (2 jobs x 4 variants x 20 rounds, quiet and loaded: about 12 hours of a quiet
2-core machine) can be collected over many sessions, and ledgers from several sessions or
machines merged.

Why a ledger of lines, not one results file rewritten per run: a session that is killed
(its slice of the machine is over, a CI job is cancelled) loses at most the gate in
flight. Each line is written with one ``write`` on a file opened for appending, then
flushed to disk; a line cut short by a kill is skipped on reading with one warning, and
the next append starts on a fresh line. Records carry an ``id``, so merging two ledgers
(``--merge``) adds only the records it does not already hold.

Each record says which code produced it: the commit, whether the tree was dirty, and a
hash of the gate's code (:data:`GATE_CODE`: the statistics, the runner, the CLI's
defaults, the step time, the cause, the injected slowdown, the demo job). A record whose
hash differs from the current code's is counted and flagged in the summary;
``--since REV`` drops records from commits that do not descend from REV.

This module holds the pure parts (reading, appending, choosing what to run next, the
summary's rows); ``gate_ab_calibration.py`` runs the gates.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("same", "all10", "all5", "one10")
#: the slowdown each variant injects, as a share of the job's probed step
INJECTED = {"same": 0.0, "all10": 0.10, "all5": 0.05, "one10": 0.10}
#: the files whose change can change a gate's verdict on the same machine: a record made
#: with other contents of these is from another gate
GATE_CODE = (
    "hvdprof/analysis/ab.py",
    "hvdprof/analysis/ab_runner.py",
    "hvdprof/analysis/ab_cli.py",
    "hvdprof/analysis/pooling.py",
    "hvdprof/analysis/diff.py",
    "hvdprof/analysis/summary.py",
    "hvdprof/analysis/steps.py",
    "hvdprof/demo.py",
    "benchmarks/gate_worker.py",
)
#: how many identical gates may fail, and how many slowed ones must be caught, per 20
#: rounds (issue 50): goal name -> (share, "at most" or "at least")
GOALS = {
    "same_failed": (0.05, "at most"),
    "all10_caught": (0.95, "at least"),
    "all5_caught": (0.75, "at least"),
    "all5_covered": (0.90, "at least"),
    "one10_caught": (0.95, "at least"),
    "one10_cause": (0.90, "at least"),
}
#: a slowed gate counts for its variant only when its busy wait was within this share of
#: the variant's size, measured against the gate's own baseline step (a wait sized from a
#: step the machine no longer runs at tests another slowdown)
SIZE_TOLERANCE = 0.3
#: the demo gate's wall time at the default budget (issue 50)
DEMO_WALL_GOAL_S = 300.0


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30, check=False
    )


def gate_code_digest() -> str:
    digest = hashlib.sha256()
    for name in GATE_CODE:
        path = ROOT / name
        digest.update(name.encode())
        digest.update(path.read_bytes() if path.exists() else b"(missing)")
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class Provenance:
    """Which code and machine a record comes from."""

    git_commit: str | None
    git_dirty: bool  # anything uncommitted in the tree
    gate_code_sha256: str
    gate_code_dirty: bool  # uncommitted changes in GATE_CODE
    hvdprof_version: str
    host: str
    cpu_count: int | None

    @classmethod
    def current(cls) -> Provenance:
        from hvdprof import __version__

        head = _git("rev-parse", "HEAD").stdout.strip() or None
        dirty = bool(_git("status", "--porcelain", "--untracked-files=no").stdout.strip())
        code_dirty = bool(_git("status", "--porcelain", "--", *GATE_CODE).stdout.strip())
        return cls(head, dirty, gate_code_digest(), code_dirty, __version__,
                   platform.node(), os.cpu_count())  # fmt: skip


@dataclass
class GateRecord:
    """One finished gate of the calibration."""

    job: str
    variant: str
    load: str  # "none" | "changing"
    round: int  # this cell's round, from 0
    seed: int
    settings: dict[str, Any]  # what else must match for two records to be comparable
    exit: int  # hvdprof ab's exit code
    failed: bool
    verdict: str
    estimate: float | None  # B/A - 1
    low: float | None
    high: float | None
    alpha: float | None  # each bound's one-sided error rate
    blocks: int | None
    stopped: str
    cause: str | None  # the named cause's key, e.g. "rank 1: compute"
    wall_s: float
    probe_step_ms: float | None  # the step the slowdown was sized from
    slow_ms: float
    baseline_step_ms: float | None  # the gate's own baseline runs (median)
    load_changes: int  # spin-loop changes during the gate (--load)
    started: str
    date: str  # when it ended
    provenance: dict[str, Any]
    #: one run's wall time and its start-up (launch to the first rank's timeline), the
    #: median over both sides: what a gate's time is made of (None in older records)
    run_wall_s: float | None = None
    startup_s: float | None = None
    #: blocks set aside because the machine's other load changed between their two runs
    #: (None in records older than load-matched blocks)
    set_aside: int | None = None
    kind: str = "gate"
    id: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def injected(self) -> float:
        return INJECTED.get(self.variant, 0.0)

    @property
    def concurrent(self) -> bool:
        return "--concurrent" in (self.settings.get("ab_args") or [])

    @property
    def injected_measured(self) -> float | None:
        """The slowdown injected, as a share of the step this gate's baseline ran at (the
        machine's speed can differ from the probe's). A ``--concurrent`` gate's baseline
        ran beside its candidate, at about twice its own step, so its share is of the
        probe's step, run alone: the slowdown a user of the job would see."""
        step = self.probe_step_ms if self.concurrent else self.baseline_step_ms
        if not self.slow_ms or not step:
            return None
        return self.slow_ms / step

    def off_size(self, tolerance: float = SIZE_TOLERANCE) -> bool:
        """A slowdown more than ``tolerance`` (a share) off its variant's size."""
        measured = self.injected_measured
        return (
            bool(self.injected)
            and measured is not None
            and (abs(measured / self.injected - 1.0) > tolerance)
        )

    @property
    def unix_s(self) -> float:
        return datetime.datetime.fromisoformat(self.date).timestamp()


@dataclass
class ProbeRecord:
    """The job's step time from unchanged runs, which sizes the injected slowdowns; kept
    so the next session within ``--probe-max-age`` skips the probe runs."""

    job: str
    load: str
    steps: int
    step_ms: float
    runs_ms: list[float]
    unix_s: float
    date: str
    provenance: dict[str, Any]
    kind: str = "probe"
    id: str = field(default_factory=lambda: uuid.uuid4().hex)


Record = GateRecord | ProbeRecord


def _from_dict(d: dict[str, Any]) -> Record:
    cls: type[GateRecord] | type[ProbeRecord] = (
        ProbeRecord if d.get("kind") == "probe" else GateRecord
    )
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in names})


@dataclass
class Ledger:
    """The records of a ledger file, in the order written, and what could not be read."""

    path: Path
    records: list[Record]
    bad_lines: list[int]  # 1-based numbers of lines skipped

    @property
    def gates(self) -> list[GateRecord]:
        return [r for r in self.records if isinstance(r, GateRecord)]

    @property
    def probes(self) -> list[ProbeRecord]:
        return [r for r in self.records if isinstance(r, ProbeRecord)]


def read_ledger(path: Path, warn: Any = None) -> Ledger:
    """Every record that reads; a damaged line (a kill mid-write, a bad merge) is skipped
    and named in one warning line on stderr, the rest kept."""
    records: list[Record] = []
    bad: list[int] = []
    seen: set[str] = set()
    if path.exists():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                if not isinstance(d, dict):
                    raise ValueError("not an object")
                record = _from_dict(d)
            except (ValueError, TypeError):
                bad.append(number)
                continue
            if record.id not in seen:
                seen.add(record.id)
                records.append(record)
    if bad:
        shown = ", ".join(map(str, bad[:5])) + (" ..." if len(bad) > 5 else "")
        message = (
            f"warning: {path}: skipped {len(bad)} damaged line(s) ({shown}); "
            f"kept {len(records)} record(s)"
        )
        print(message, file=warn or sys.stderr, flush=True)
    return Ledger(path, records, bad)


def append_record(path: Path, record: Record) -> None:
    """One line, one ``write`` on an appending descriptor, then fsync: a kill loses at
    most this line, and a line cut short before it is closed with a newline first so it
    cannot swallow this one."""
    line = json.dumps(dataclasses.asdict(record), separators=(",", ":")) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size:
            with open(path, "rb") as f:
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    line = "\n" + line
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def merge_into(path: Path, others: Iterable[Path]) -> int:
    """Append the records of ``others`` that ``path`` does not hold (by id); how many."""
    have = {r.id for r in read_ledger(path).records}
    added = 0
    for other in others:
        for record in read_ledger(other).records:
            if record.id not in have:
                append_record(path, record)
                have.add(record.id)
                added += 1
    return added


# ------------------------------------------------------------------ choosing records


class Descends:
    """``commit`` descends from ``since`` (``git merge-base --is-ancestor``), cached; a
    commit this checkout does not know does not."""

    def __init__(self, since: str | None) -> None:
        self.since = None
        if since is not None:
            done = _git("rev-parse", "--verify", f"{since}^{{commit}}")
            if done.returncode != 0:
                raise ValueError(f"--since {since}: not a commit of this checkout")
            self.since = done.stdout.strip()
        self.known: dict[str | None, bool] = {}

    def __call__(self, commit: str | None) -> bool:
        if self.since is None:
            return True
        if commit not in self.known:
            ok = commit is not None and (
                _git("merge-base", "--is-ancestor", self.since, commit).returncode == 0
            )
            self.known[commit] = ok
        return self.known[commit]


@dataclass
class Selection:
    """The gates that count for one load and settings, and why others do not."""

    gates: list[GateRecord]
    #: gates that ended without a verdict (a run failed: exit 5; a bug: exit 4), which
    #: count in no rate
    errors: list[GateRecord] = field(default_factory=list)
    #: slowed gates whose slowdown was off its variant's size (SIZE_TOLERANCE)
    mis_sized: list[GateRecord] = field(default_factory=list)
    other_settings: int = 0
    before_since: int = 0
    other_load: int = 0


def select(
    gates: Sequence[GateRecord],
    load: str,
    settings: dict[str, Any],
    descends: Any,
    tolerance: float = SIZE_TOLERANCE,
) -> Selection:
    out = Selection([])
    for g in gates:
        if g.load != load:
            out.other_load += 1
        elif g.settings != settings:
            out.other_settings += 1
        elif not descends((g.provenance or {}).get("git_commit")):
            out.before_since += 1
        elif g.exit not in (0, 3):
            out.errors.append(g)
        elif g.off_size(tolerance):
            out.mis_sized.append(g)
        else:
            out.gates.append(g)
    return out


def cell_counts(
    gates: Sequence[GateRecord], jobs: Sequence[str], variants: Sequence[str]
) -> dict[tuple[str, str], int]:
    counts = {(j, v): 0 for j in jobs for v in variants}
    for g in gates:
        if (g.job, g.variant) in counts:
            counts[(g.job, g.variant)] += 1
    return counts


def next_cell(counts: dict[tuple[str, str], int], rounds: int, seed: int) -> tuple[str, str] | None:
    """The cell to run next: one of those with the fewest records, at random among them
    (so no variant always runs first, or right after another), None when every cell has
    ``rounds``."""
    open_cells = [c for c, n in counts.items() if n < rounds]
    if not open_cells:
        return None
    fewest = min(counts[c] for c in open_cells)
    choices = sorted(c for c in open_cells if counts[c] == fewest)
    return random.Random(seed).choice(choices)


def missing(counts: dict[tuple[str, str], int], rounds: int) -> int:
    return sum(max(0, rounds - n) for n in counts.values())


def fresh_probe(
    probes: Sequence[ProbeRecord], job: str, load: str, steps: int, max_age_s: float, now: float
) -> ProbeRecord | None:
    """The newest probe of this job, load and steps not older than ``max_age_s``."""
    fitting = [
        p
        for p in probes
        if p.job == job and p.load == load and p.steps == steps and now - p.unix_s <= max_age_s
    ]
    return max(fitting, key=lambda p: p.unix_s, default=None)


# ------------------------------------------------------------------------ summary


@dataclass
class GoalRow:
    """One line of the published table: a count against its goal."""

    job: str
    measure: str
    result: str
    goal: str
    met: bool | None  # None: not decided yet (rounds missing) or no goal
    done: int = 0
    missing: int = 0
    rate: float | None = None


def _count_row(job: str, measure: str, hits: int, done: int, rounds: int, goal_key: str) -> GoalRow:
    """``hits`` of ``done`` against a share of ``max(rounds, done)``: met or not once
    the missing rounds can no longer change it, else undecided."""
    share, sense = GOALS[goal_key]
    target = max(rounds, done)
    left = max(0, rounds - done)
    if sense == "at most":
        allowed = max(1, math.floor(share * target + 1e-9))
        goal = f"<= {allowed} of {target}"
        met = False if hits > allowed else (True if left == 0 else None)
    else:
        need = math.ceil(share * target - 1e-9)
        goal = f">= {need} of {target}"
        met = True if hits >= need else (False if hits + left < need else None)
    result = f"{hits} of {done}" + (f" ({left} to run)" if left else "")
    rate = hits / done if done else None
    return GoalRow(job, measure, result, goal, met, done, left, rate)


def _covers(g: GateRecord, value: float) -> bool:
    return g.low is not None and g.low <= value <= (g.high if g.high is not None else math.inf)


def job_rows(
    gates: Sequence[GateRecord],
    job: str,
    rounds: int,
    timed: Sequence[GateRecord] | None = None,
) -> list[GoalRow]:
    """The goal rows of one job (issue 50's proof), from its selected gates; its wall
    times from ``timed`` too (a gate whose slowdown was off its size still timed a gate)."""
    by = {v: [g for g in gates if g.job == job and g.variant == v] for v in VARIANTS}

    def row(measure: str, variant: str, goal: str, test: Any) -> GoalRow:
        have = by[variant]
        return _count_row(job, measure, sum(bool(test(g)) for g in have), len(have), rounds, goal)

    rows = [
        row("identical: failed", "same", "same_failed", lambda g: g.failed),
        row("every rank 10% slower: caught", "all10", "all10_caught", lambda g: g.failed),
        row("every rank 5% slower: caught", "all5", "all5_caught", lambda g: g.failed),
        # the slowdown a gate saw is the busy wait over its own baseline's step (the
        # machine's speed moves the share away from the probe's 5%)
        row(
            "... interval covers the slowdown injected",
            "all5",
            "all5_covered",
            lambda g: _covers(g, g.injected_measured or g.injected),
        ),
        row("rank 1 10% slower: caught", "one10", "one10_caught", lambda g: g.failed),
        row(
            "... cause rank 1's compute",
            "one10",
            "one10_cause",
            lambda g: g.cause == "rank 1: compute",
        ),
    ]
    nominal = sum(_covers(g, 0.05) for g in by["all5"])
    rows.append(GoalRow(job, "... interval covers 5% (the probe's share)",
                        f"{nominal} of {len(by['all5'])}", "", None))  # fmt: skip
    walls = [g.wall_s for g in [*gates, *(timed or [])] if g.job == job]
    if walls:
        wall = f"{max(walls):.0f} s, {statistics.median(walls):.0f} s (of {len(walls)} gates)"
    else:
        wall = "no gate yet"
    if job == "demo":
        over = any(w > DEMO_WALL_GOAL_S for w in walls)
        left = sum(max(0, rounds - len(by[v])) for v in VARIANTS)
        met = False if over else (True if walls and left == 0 else None)
        rows.append(GoalRow(job, "gate wall time (max, median)", wall,
                            f"<= {DEMO_WALL_GOAL_S:.0f} s", met, len(walls), left))  # fmt: skip
    else:
        rows.append(GoalRow(job, "gate wall time (max, median)", wall, "", None, len(walls)))
    measured = [
        f"{v} {statistics.median(xs):.1%}"
        for v in ("all10", "all5", "one10")
        if (xs := [x for g in by[v] if (x := g.injected_measured) is not None])
    ]
    if measured:
        # a --concurrent gate's baseline ran beside its candidate: its share is of the probe's
        of = "the probe's step, run alone" if any(g.concurrent for g in gates) else (
            "the gate's own baseline step")  # fmt: skip
        rows.append(GoalRow(job, f"slowdown injected, of {of} (median)",
                            ", ".join(measured), "", None))  # fmt: skip
    # what the injection did to the step, as the gates of each cell estimated it (a busy
    # wait in Python can cost the step more than its own time)
    effects = [
        f"{v} {statistics.median(xs):+.1%}"
        for v in ("all10", "all5", "one10")
        if (xs := [g.estimate for g in by[v] if g.estimate is not None])
    ]
    if effects:
        centre = [g.estimate for g in by["all5"] if g.estimate is not None]
        covered = sum(_covers(g, statistics.median(centre)) for g in by["all5"]) if centre else 0
        rows.append(GoalRow(job, "slowdown estimated (median over the cell's gates)",
                            ", ".join(effects), "", None))  # fmt: skip
        rows.append(GoalRow(job, "... all5 interval covers that median",
                            f"{covered} of {len(by['all5'])}", "", None))  # fmt: skip
    runs = [g for v in VARIANTS for g in by[v] if g.run_wall_s is not None]
    if runs:
        wall = statistics.median(g.run_wall_s for g in runs if g.run_wall_s is not None)
        starts = [g.startup_s for g in runs if g.startup_s is not None]
        start = f", start-up {statistics.median(starts):.1f} s" if starts else ""
        rows.append(GoalRow(job, "one run of a gate (median): wall", f"{wall:.1f} s{start}",
                            "", None))  # fmt: skip
    return rows


def summary(
    ledger: Ledger,
    selection: Selection,
    jobs: Sequence[str],
    variants: Sequence[str],
    rounds: int,
) -> dict[str, Any]:
    """The summary's payload, all of it from the ledger."""
    gates = selection.gates
    counts = cell_counts(gates, jobs, variants)
    rows = [r for job in jobs for r in job_rows(gates, job, rounds, selection.mis_sized)]
    current = gate_code_digest()
    commits: dict[str, int] = {}
    for g in gates:
        c = str((g.provenance or {}).get("git_commit"))[:12]
        commits[c] = commits.get(c, 0) + 1
    cells = {
        f"{j}/{v}": {
            "done": n,
            "missing": max(0, rounds - n),
            "failed": sum(g.failed for g in gates if g.job == j and g.variant == v),
            "failure_rate": (
                sum(g.failed for g in gates if g.job == j and g.variant == v) / n if n else None
            ),
        }
        for (j, v), n in counts.items()
    }
    return {
        "ledger": str(
            ledger.path.relative_to(ROOT) if ledger.path.is_relative_to(ROOT) else ledger.path
        ),
        "rounds": rounds,
        "jobs": list(jobs),
        "variants_run": list(variants),
        "gates_counted": len(gates),
        "gates_missing": missing(counts, rounds),
        "gates_ended_in_error": [
            {"job": g.job, "variant": g.variant, "exit": g.exit, "verdict": g.verdict}
            for g in selection.errors
        ],
        "ignored": {
            "other_settings": selection.other_settings,
            "before_since": selection.before_since,
            "damaged_lines": len(ledger.bad_lines),
            "slowdown_off_its_size": len(selection.mis_sized),
        },
        "gate_code_sha256": current,
        "gates_from_other_gate_code": sum(
            (g.provenance or {}).get("gate_code_sha256") != current for g in gates
        ),
        "gates_with_uncommitted_gate_code": sum(
            bool((g.provenance or {}).get("gate_code_dirty")) for g in gates
        ),
        "commits": commits,
        "first_record": min((g.date for g in gates), default=None),
        "last_record": max((g.date for g in gates), default=None),
        "cells": cells,
        "header": ["job", "measure", "result", "goal", "met"],
        "table": [[r.job, r.measure, r.result, r.goal, r.met] for r in rows],
        "rows": [dataclasses.asdict(r) for r in rows],
        "variants": {v: [dataclasses.asdict(g) for g in gates if g.variant == v] for v in VARIANTS},
    }
