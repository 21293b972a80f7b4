"""``hvdprof ab``: run the baseline and the candidate in interleaved blocks and judge them.

Each run is a fresh process group started from a shell command line, with
``HVDPROF_TIMELINE`` pointing at its own directory: both sides record the same way, so
the timeline's cost (a few percent of a step) weighs on both alike and cancels in their
ratio. A run is measured by the step time ``analyze`` quotes (the median over ranks and
steps, warm-up left out), taken from its summary, so start-up (imports, rendezvous, a
slower-starting side) is not counted. Every run is kept: its timeline, its summary and
its output, under ``OUT/block-NN-SIDE/``.

Each run also notes the machine's other load while its steps ran (:mod:`machine_load`,
over the whole run where the steps' window cannot be placed on the wall clock): a block
whose two runs saw other loads more than ``GatePlan.load_tolerance_cores`` apart (a
neighbour's job started or stopped between them) is set aside, kept and listed, and
another block is run in its place; the looks count judged blocks only.

The statistics are in :mod:`hvdprof.analysis.ab`; the cause is named by
:func:`hvdprof.analysis.diff.diff_summaries` on the pooled runs of each side
(:mod:`hvdprof.analysis.pooling`).
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hvdprof.analysis.ab import PairedJudgement, SequentialGate, block_orders, blocks_to_decide
from hvdprof.analysis.diff import DiffRow, RunDiff, diff_summaries
from hvdprof.analysis.machine_load import LoadSampler, other_load_cores, snapshot
from hvdprof.analysis.pooling import pool_summaries
from hvdprof.analysis.result import Result
from hvdprof.analysis.steps import step_starts, warmup_steps
from hvdprof.analysis.summary import RunSummary
from hvdprof.config import name_of
from hvdprof.trace.manifest import timeline_to_unix_s

if TYPE_CHECKING:
    from hvdprof.trace.model import Run

SIDES = ("baseline", "candidate")


@dataclass(frozen=True)
class Side:
    """How to start one side: a shell command line, extra environment, a directory."""

    name: str  # "baseline" | "candidate"
    command: str
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None


@dataclass
class RunRecord:
    """One run of one side: where it is kept, how it ended, and its step time."""

    side: str
    block: int  # 0: the warm-up block (not judged)
    directory: str
    exit_code: int | None  # None: killed at the run timeout
    wall_s: float
    started_unix_s: float = 0.0  # when it was launched
    startup_s: float | None = None  # from launch to the first rank's timeline start
    step_ms: float | None = None
    steps: int = 0
    problem: str | None = None  # why it cannot be judged (it crashed, wrote no steps ...)
    summary: RunSummary | None = None
    other_load_cores: float | None = None  # the machine's load not its own (None: unknown)
    #: the seconds of samples that load was read over, around the steps (None: the run)
    load_window_s: float | None = None
    #: its judged steps' span on the wall clock (None: they could not be placed)
    steps_unix_s: tuple[float, float] | None = None
    set_aside: bool = False  # its block's two runs could not be compared fairly


class RunEntry(Result):
    """One run as ``hvdprof ab --json`` lists it (its times to the millisecond; its
    summary is in its directory)."""

    side: str
    block: int
    directory: str
    exit_code: int | None
    wall_s: float
    startup_s: float | None
    step_ms: float | None
    steps: int
    problem: str | None
    #: cores' worth of CPU the machine spent on other work while its steps ran (None: unknown)
    other_load_cores: float | None
    #: the wall seconds that load was read over: the samples around the judged steps, at
    #: least 2 s of them (None: the whole run)
    load_window_s: float | None
    set_aside: bool  # its block was not judged: its two runs' other loads were too far apart

    @classmethod
    def of(cls, r: RunRecord) -> RunEntry:
        startup = None if r.startup_s is None else round(r.startup_s, 3)
        load = None if r.other_load_cores is None else round(r.other_load_cores, 3)
        window = None if r.load_window_s is None else round(r.load_window_s, 3)
        return cls(r.side, r.block, r.directory, r.exit_code, round(r.wall_s, 3), startup,
                   r.step_ms, r.steps, r.problem, load, window, r.set_aside)  # fmt: skip


@dataclass
class GatePlan:
    """What one ``hvdprof ab`` does: the test, its time budget and the run limits."""

    gate: SequentialGate
    budget_s: float = 270.0
    run_timeout_s: float = 270.0
    warmup_blocks: int = 1
    seed: int = 50
    #: a block whose two runs' other loads differ by more is set aside (None: never)
    load_tolerance_cores: float | None = 0.25
    #: run each block's two sides at the same time (``--concurrent``)
    concurrent: bool = False


@dataclass
class GateOutcome:
    """Everything the gate did and concluded."""

    plan: GatePlan
    out_dir: str
    runs: list[RunRecord] = field(default_factory=list)
    log_ratios: list[float] = field(default_factory=list)
    looks: list[PairedJudgement] = field(default_factory=list)
    judgement: PairedJudgement | None = None
    stopped: str = ""  # "clear" | "max_blocks" | "budget" | "run_failed"
    failed_run: RunRecord | None = None
    diff: RunDiff | None = None
    wall_s: float = 0.0
    set_aside: list[int] = field(default_factory=list)  # blocks not judged (load changed)

    def median_wall_s(self, side: str) -> float | None:
        walls = [r.wall_s for r in self.runs if r.side == side and r.problem is None]
        return statistics.median(walls) if walls else None

    def median_startup_s(self, side: str) -> float | None:
        starts = [r.startup_s for r in self.runs if r.side == side and r.startup_s is not None]
        return statistics.median(starts) if starts else None


#: Seconds a stopped run's process group has to end after SIGTERM before SIGKILL.
STOP_GRACE_S = 15.0


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM first: ``hvdprof run``'s launcher traps it and stops its ranks, which run
    in sessions of their own that a SIGKILL of this group would not reach; then SIGKILL
    whatever is left of the group."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline:
        if proc.poll() is not None and not _group_alive(proc.pid):
            break
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _steps_window_unix_s(run: Run) -> tuple[float, float] | None:
    """The judged steps' span on the wall clock (the warm-up step left out), from each
    rank's step starts and its manifest's pairing of its clock with the wall clock."""
    spans = []
    for rank, starts in step_starts(run).items():
        m = run.manifests.get(rank)
        first = warmup_steps(len(starts))
        if m is None or len(starts) - first < 2:
            continue
        to_unix = timeline_to_unix_s(m)
        if to_unix is not None:
            spans.append((to_unix(float(starts[first])), to_unix(float(starts[-1]))))
    if not spans:
        return None
    return min(a for a, _ in spans), max(b for _, b in spans)


def _measure(record: RunRecord, timeline: str, sampler: LoadSampler) -> None:
    """Fill in the run's step time from its timeline (or say why there is none), and the
    other load over its steps' window where the samples enclose it."""
    from hvdprof.analysis.summary import summarize, write_summary
    from hvdprof.trace.loader import LoadError, load_run

    try:
        run = load_run(timeline, cache=False)
    except LoadError as exc:
        record.problem = f"wrote no timeline that can be read ({exc})"
        return
    if not len(run.slices):
        record.problem = "wrote no timeline (is it an hvdprof job: `hvdprof run` or hvdprof.torch?)"
        return
    starts = [s for m in run.manifests.values() if (s := m.start_unix_ns) is not None and s > 0]
    if starts:
        record.startup_s = max(0.0, min(starts) / 1e9 - record.started_unix_s)
    summary = summarize(run)
    if not summary.series.step or not summary.step_ms > 0:
        record.problem = "recorded no training steps to time (a collective per step is needed)"
        return
    write_summary(summary, os.path.join(record.directory, "summary.json"))
    record.summary = summary
    record.step_ms = summary.step_ms
    record.steps = len(summary.series.step)
    window = record.steps_unix_s = _steps_window_unix_s(run)
    if window is not None and (load := sampler.other_load_cores(*window)) is not None:
        record.other_load_cores, record.load_window_s = load


@dataclass
class _Launched:
    """A run under way: its process (a shell, in a session of its own), where it writes,
    and the sampler reading its tree's CPU."""

    record: RunRecord
    proc: subprocess.Popen[bytes]
    log: Any  # its open output.log
    timeline: str
    sampler: LoadSampler
    before: Any  # the machine's counters at launch (the whole run's load figure)
    started: float  # monotonic


class _HeldStop:
    """A stop (SIGTERM, Ctrl+C) that comes while a run is being started waits until the
    run is on its caller's list of runs to stop: raised between ``Popen``'s fork and the
    list's append, it would leave the new run's process tree behind, running (a CI
    runner's cancel did)."""

    depth = 0
    pending = False


@contextlib.contextmanager
def _holding_stops() -> Iterator[None]:
    _HeldStop.depth += 1
    try:
        yield
    finally:
        _HeldStop.depth -= 1
        if _HeldStop.depth == 0 and _HeldStop.pending:
            _HeldStop.pending = False
            raise KeyboardInterrupt  # the stop wins over an error raised while held


def stop_on_signals() -> None:
    """SIGTERM (a CI runner's cancel) and Ctrl+C end the gate as KeyboardInterrupt, so the
    runs under way are stopped with their ranks (:func:`_kill_group`) rather than left
    running; one that comes while a run is being started is raised once it is listed."""

    def stop(_signum: int, _frame: Any) -> None:
        if _HeldStop.depth:
            _HeldStop.pending = True
            return
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)


def _launch(side: Side, block: int, out_dir: str, into: list[_Launched]) -> _Launched:
    """Start ``side`` once with its own timeline; its output goes to ``output.log``. The
    run is appended to ``into`` before a stop can be raised: the caller stops what that
    list holds, whatever ends it."""
    directory = os.path.join(out_dir, f"block-{block:02d}-{side.name}")
    timeline = os.path.join(directory, "timeline")
    os.makedirs(timeline, exist_ok=True)
    env = {**os.environ, **side.env, name_of("timeline_dir"): os.path.abspath(timeline)}
    record = RunRecord(side.name, block, directory, None, 0.0, time.time())
    # the whole run's figure, where its steps cannot be placed: it counts the run's CPU as
    # reaped (RUSAGE_CHILDREN), which also covers its last moments, after the sampler's
    # last look and once its tree has left /proc
    before = snapshot()
    with _holding_stops():
        log = open(os.path.join(directory, "output.log"), "wb")  # noqa: SIM115 (closed by _finish)
        try:
            proc = subprocess.Popen(
                side.command,
                shell=True,
                cwd=side.cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its whole process tree is killed with it
            )
        except BaseException:
            log.close()
            raise
        launched = _Launched(record, proc, log, timeline, LoadSampler(), before, time.monotonic())
        into.append(launched)
    launched.sampler.start(proc.pid)  # the run's whole process tree, under its shell
    return launched


def _abandon(run: _Launched) -> None:
    """Ctrl+C or SIGTERM while it ran: no run is left behind."""
    _kill_group(run.proc)
    run.sampler.stop()
    run.log.close()


def _finish(run: _Launched, deadline: float, timeout_s: float) -> RunRecord:
    """Wait for the run until ``deadline`` (monotonic), then measure it."""
    _wait(run, deadline, timeout_s)
    return _measured(run)


def _wait(run: _Launched, deadline: float, timeout_s: float) -> None:
    """Wait for the run until ``deadline`` (monotonic): killed past it."""
    record = run.record
    try:
        record.exit_code = run.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        _kill_group(run.proc)
        record.problem = f"ran past the run timeout ({timeout_s:g} s) and was killed"
    finally:
        run.sampler.stop()
        run.log.close()
    record.wall_s = time.monotonic() - run.started
    record.other_load_cores = other_load_cores(run.before, snapshot())


def _measured(run: _Launched) -> RunRecord:
    """The ended run's record, its step time read from its timeline (a second of CPU or
    so: never while another run of the gate is still in its steps)."""
    record = run.record
    if record.problem is None and record.exit_code != 0:
        record.problem = f"failed ({_how_it_ended(record.exit_code or 0)})"
    if record.problem is None:
        _measure(record, run.timeline, run.sampler)
    return record


def record_run(side: Side, block: int, out_dir: str, timeout_s: float) -> RunRecord:
    """Run ``side`` once with its own timeline; its output goes to ``output.log``."""
    started: list[_Launched] = []
    try:
        run = _launch(side, block, out_dir, started)
        return _finish(run, run.started + timeout_s, timeout_s)
    except BaseException:
        for run in started:
            _abandon(run)
        raise


def record_together(
    sides: list[Side], block: int, out_dir: str, timeout_s: float
) -> list[RunRecord]:
    """Run the sides at the same time (``--concurrent``), launched in the order given:
    a change in the machine's speed then reaches both, as it cannot reach two runs one
    after the other."""
    runs: list[_Launched] = []
    try:
        for side in sides:
            _launch(side, block, out_dir, runs)
        deadline = min(r.started for r in runs) + timeout_s
        pending = list(runs)
        while pending:  # each as it ends, so that its wall time is its own
            ended = [r for r in pending if r.proc.poll() is not None]
            if not ended and time.monotonic() >= deadline:
                ended = list(pending)  # killed, past the run timeout
            for r in ended:
                _wait(r, deadline, timeout_s)
                pending.remove(r)
            if pending:
                time.sleep(0.05)
        return [_measured(r) for r in runs]  # reading one would slow the other's steps
    except BaseException:
        for r in runs:
            _abandon(r)
        raise


def _how_it_ended(code: int) -> str:
    """``exit code 3``; ``killed by SIGKILL``; a shell's 128+N also names signal N."""

    def name(number: int) -> str:
        try:
            return signal.Signals(number).name
        except ValueError:
            return f"signal {number}"

    if code < 0:
        return f"killed by {name(-code)}"
    if 128 < code < 128 + signal.NSIG:
        return f"exit code {code}: killed by {name(code - 128)}"
    return f"exit code {code}"


Progress = Callable[[GateOutcome, RunRecord | None], None]


def run_gate(
    plan: GatePlan,
    sides: dict[str, Side],
    out_dir: str,
    progress: Progress | None = None,
) -> GateOutcome:
    """Warm-up, then blocks until the answer is clear, the blocks run out or the budget
    would be passed; a run that fails stops the gate (what ran is kept and judged). A
    block whose two runs saw different other loads is set aside and replaced (up to
    ``max_blocks`` of them: a machine whose load never holds still ends the gate)."""
    started = time.monotonic()
    outcome = GateOutcome(plan, out_dir)
    gate = plan.gate
    orders = block_orders(plan.warmup_blocks + 2 * gate.max_blocks, plan.seed)
    block_s: list[float] = []

    def tell(record: RunRecord | None) -> None:
        # None: a look, or a block set aside (its runs, the last ones, are flagged)
        if progress is not None:
            progress(outcome, record)

    for index, order in enumerate(orders):
        block = index - plan.warmup_blocks + 1  # <= 0: warm-up
        if len(outcome.log_ratios) >= gate.max_blocks:
            outcome.stopped = "max_blocks"
            break
        elapsed = time.monotonic() - started
        if block > 1 and block_s and elapsed + max(block_s) > plan.budget_s:
            outcome.stopped = "budget"
            break
        t0 = time.monotonic()
        pair: dict[str, RunRecord] = {}
        if plan.concurrent:
            records = record_together(
                [sides[name] for name in order], max(block, 0), out_dir, plan.run_timeout_s
            )
        else:
            records = (
                record_run(sides[name], max(block, 0), out_dir, plan.run_timeout_s)
                for name in order
            )
        for record in records:
            outcome.runs.append(record)
            tell(record)
            if record.problem is not None:
                outcome.failed_run = outcome.failed_run or record
                if not plan.concurrent:
                    break  # the other side's run is not started
            pair[record.side] = record
        if outcome.failed_run is not None:
            outcome.stopped = "run_failed"
            break
        block_s.append(time.monotonic() - t0)
        if block <= 0:
            continue
        apart = (
            not steps_overlap(pair) if plan.concurrent
            else loads_apart(pair, plan.load_tolerance_cores)
        )  # fmt: skip
        if apart:
            for record in pair.values():
                record.set_aside = True
            outcome.set_aside.append(block)
            tell(None)
            continue
        b, c = pair["baseline"].step_ms, pair["candidate"].step_ms
        assert b is not None and c is not None  # measured, or a problem stopped the gate
        outcome.log_ratios.append(math.log(c / b))
        if gate.is_look(len(outcome.log_ratios)):
            look = gate.judge(outcome.log_ratios)
            outcome.looks.append(look)
            tell(None)
            if look.clear:
                outcome.stopped = "clear"
                break
    else:
        outcome.stopped = "max_blocks"
    _conclude(outcome)
    outcome.wall_s = time.monotonic() - started
    return outcome


#: --concurrent: a block counts when its two runs were in their steps together for at
#: least this share of the shorter one's steps
MIN_OVERLAP = 0.5


def steps_overlap(pair: dict[str, RunRecord]) -> bool:
    """The two runs of a concurrent block were in their judged steps at the same time for
    at least :data:`MIN_OVERLAP` of the shorter's: one that started much later ran its
    steps beside the other's exit, on a machine the other no longer shared. Runs whose
    steps cannot be placed count (nothing says they did not overlap)."""
    spans = [r.steps_unix_s for r in pair.values()]
    if any(s is None for s in spans):
        return True
    (a0, a1), (b0, b1) = spans  # type: ignore[misc]
    shorter = min(a1 - a0, b1 - b0)
    return shorter <= 0 or min(a1, b1) - max(a0, b0) >= MIN_OVERLAP * shorter


def loads_apart(pair: dict[str, RunRecord], tolerance: float | None) -> bool:
    """The block's two runs saw the machine's other load differ by more than
    ``tolerance`` cores (unknown loads are never apart)."""
    loads = [r.other_load_cores for r in pair.values()]
    if tolerance is None or any(x is None for x in loads):
        return False
    a, b = loads
    assert a is not None and b is not None
    return abs(a - b) > tolerance


def _conclude(outcome: GateOutcome) -> None:
    """The last judgement (the last look, or one more on the blocks run since) and the
    cause, from the pooled runs of each side."""
    n = len(outcome.log_ratios)
    last = outcome.looks[-1] if outcome.looks else None
    if n and (last is None or last.blocks != n):
        last = outcome.plan.gate.judge(outcome.log_ratios)
    outcome.judgement = last
    judged = [r for r in outcome.runs if r.block > 0 and r.summary is not None and not r.set_aside]
    pools = {
        side: [r.summary for r in judged if r.side == side and r.summary is not None]
        for side in SIDES
    }
    if all(pools.values()):
        a = pool_summaries(pools["baseline"], os.path.join(outcome.out_dir, "baseline"))
        b = pool_summaries(pools["candidate"], os.path.join(outcome.out_dir, "candidate"))
        outcome.diff = diff_summaries(a, b)


def _pct(x: float) -> str:
    return f"{x:+.1%}"


def _cause_text(outcome: GateOutcome) -> str:
    d = outcome.diff
    if d is None or d.cause is None:
        return ""
    text = f" Cause: {d.cause.key} {d.cause.delta_ms:+.2f} ms per step"
    if d.effects:
        text += "; " + ", ".join(f"{r.key} waits {r.delta_ms:+.2f} ms" for r in d.effects)
    return text + " (pooled runs of each side)."


def _start_note(outcome: GateOutcome) -> str:
    """A side much slower to start (imports, a compile, a sleep) is said: start-up is
    not in the step time the gate compares."""
    a, b = outcome.median_startup_s("baseline"), outcome.median_startup_s("candidate")
    if a is None or b is None or abs(b - a) < max(2.0, 0.5 * min(a, b)):
        return ""
    return (
        f" Note: from launch to the first rank's timeline took {a:.1f} s (baseline) and "
        f"{b:.1f} s (candidate); only the step time is compared, not start-up."
    )


def _set_aside_note(outcome: GateOutcome) -> str:
    """Blocks set aside are said: the gate ran more blocks than it judged, and why."""
    n = len(outcome.set_aside)
    if not n:
        return ""
    tol = outcome.plan.load_tolerance_cores
    blocks = ", ".join(str(b) for b in outcome.set_aside)
    head = f" {n} block{'s' if n > 1 else ''} set aside ({blocks}): "
    their = "their" if n > 1 else "its"
    if outcome.plan.concurrent:
        return head + (
            f"{their} two runs were in their steps together for less than "
            f"{MIN_OVERLAP:.0%} of the shorter's (one started much later)."
        )
    return head + (
        f"the machine's other load changed by more than {tol:g} cores between {their} two runs."
    )


def verdict_line(outcome: GateOutcome) -> str:
    """The one line a CI log shows."""
    j, margin = outcome.judgement, outcome.plan.gate.margin
    if outcome.failed_run is not None:
        r = outcome.failed_run
        where = "in the warm-up block" if r.block == 0 else f"in block {r.block}"
        judged = len(outcome.log_ratios)
        return (
            f"ERROR: the {r.side} {r.problem} {where}; its output: "
            f"{os.path.join(r.directory, 'output.log')}; no verdict ({judged} block(s) ran "
            f"before it, every run kept in {outcome.out_dir})."
        )
    if j is None:
        why = "the budget ended first" if not outcome.set_aside else "every block was set aside"
        return f"ERROR: no block was judged ({why}); no verdict." + _set_aside_note(outcome)
    level = 1.0 - 2.0 * j.alpha
    interval = (
        f"{level:.0%} interval {_pct(j.low)} to {_pct(j.high)}"
        if j.high is not None and j.low > -1.0
        else "too few blocks for an interval"
    )
    body = (
        f"the candidate's step is {_pct(j.estimate)} against the baseline's ({interval}, "
        f"{j.blocks} blocks)"
    )
    conf = f"{outcome.plan.gate.confidence:.0%}"
    if j.failed:
        return (
            f"FAIL: {body}: slower by more than {margin:.0%} with {conf} confidence."
            + _cause_text(outcome)
            + _start_note(outcome)
            + _set_aside_note(outcome)
        )
    if j.passed:
        line = f"pass: {body}: not slower by more than {margin:.0%}, with {conf} confidence."
    else:
        why = {"budget": "the budget ended", "max_blocks": "the blocks ran out"}.get(
            outcome.stopped, outcome.stopped
        )
        line = (
            f"pass: {body}: no evidence at {conf} confidence of slower by more than "
            f"{margin:.0%} ({why} before the answer was clear{_more_blocks_note(outcome)})."
        )
    return line + _start_note(outcome) + _set_aside_note(outcome)


def _more_blocks_note(outcome: GateOutcome) -> str:
    """What deciding would have taken, at the spread and pace this gate saw."""
    j = outcome.judgement
    needed = None if j is None else blocks_to_decide(j)
    if j is None or needed is None:
        return ""
    # every warm-up run is numbered block 0, so count blocks from the plan, not the runs
    ran = outcome.plan.warmup_blocks + len(outcome.log_ratios) + len(outcome.set_aside)
    pace_s = outcome.wall_s / ran if ran else 0.0
    minutes = needed * pace_s / 60.0
    return f"; at the spread its blocks showed, about {needed} would decide it" + (
        f", {minutes:.0f} min at this pace: see --budget" if minutes >= 1.0 else ""
    )


class AbResult(Result):
    """``hvdprof ab --json FILE``: the gate's plan, what it saw and what it concluded."""

    verdict: str
    exit_code: int
    #: slower by more than the margin, significantly (and no run failed)
    failed: bool
    stopped: str  # "clear" | "max_blocks" | "budget" | "run_failed"
    margin: float
    confidence: float
    min_blocks: int
    max_blocks: int
    looks_planned: list[int]
    budget_s: float
    seed: int
    #: a block whose two runs' other loads differed by more was set aside (None: never)
    load_tolerance_cores: float | None
    #: each block ran its two sides at the same time (--concurrent)
    concurrent: bool
    set_aside_blocks: list[int]
    wall_s: float
    out_dir: str
    judgement: PairedJudgement | None
    #: about how many blocks, spread as these were, would have made an undecided
    #: judgement clear (None: it is clear, or its estimate sits on the margin)
    blocks_to_decide: int | None
    looks: list[PairedJudgement]
    log_ratios: list[float]
    runs: list[RunEntry]
    failed_run: RunEntry | None
    #: side -> its median wall time (None: no run of it could be judged)
    median_wall_s: dict[str, float | None]
    median_startup_s: dict[str, float | None]
    cause: DiffRow | None
    effects: list[DiffRow]
    diff_verdict: str | None


def outcome_result(outcome: GateOutcome, exit_code: int) -> AbResult:
    """The typed JSON result (``hvdprof ab --json FILE``)."""
    g = outcome.plan.gate
    d = outcome.diff
    j = outcome.judgement
    return AbResult(
        verdict=verdict_line(outcome),
        exit_code=exit_code,
        failed=bool(j and j.failed and outcome.failed_run is None),
        stopped=outcome.stopped,
        margin=g.margin,
        confidence=g.confidence,
        min_blocks=g.min_blocks,
        max_blocks=g.max_blocks,
        looks_planned=g.looks,
        budget_s=outcome.plan.budget_s,
        seed=outcome.plan.seed,
        load_tolerance_cores=outcome.plan.load_tolerance_cores,
        concurrent=outcome.plan.concurrent,
        set_aside_blocks=list(outcome.set_aside),
        wall_s=round(outcome.wall_s, 3),
        out_dir=outcome.out_dir,
        judgement=j,
        blocks_to_decide=blocks_to_decide(j) if j is not None else None,
        looks=list(outcome.looks),
        log_ratios=outcome.log_ratios,
        runs=[RunEntry.of(r) for r in outcome.runs],
        failed_run=RunEntry.of(outcome.failed_run) if outcome.failed_run else None,
        median_wall_s={s: outcome.median_wall_s(s) for s in SIDES},
        median_startup_s={s: outcome.median_startup_s(s) for s in SIDES},
        cause=d.cause if d else None,
        effects=list(d.effects) if d else [],
        diff_verdict=d.verdict if d else None,
    )


def outcome_to_dict(outcome: GateOutcome, exit_code: int) -> dict[str, Any]:
    """:func:`outcome_result` as JSON-safe builtins (every number finite: an open bound
    of the interval is None)."""
    return outcome_result(outcome, exit_code).to_dict()
