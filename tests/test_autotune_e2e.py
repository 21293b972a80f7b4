"""The autotuner in real jobs: real processes through ``hvdprof run``, real Gloo.

Few launches, each checked for many things (a launch costs a torch import per rank). The
workload is ``workers/autotune_worker.py``; samples are tiny (3 steps, no warmup) so a
whole tuning round takes seconds.

* ``two_rank_run`` (2 ranks, tuned to convergence, continuous mode, log and timeline on):
  every rank applied the same parameters at the same cycle and more than one change
  happened; the log, polled from this process while the job ran, was well formed at
  every poll; its rows match the applied parameters; the best configuration is printed
  at the end of tuning and at exit in ``HVDPROF_*=`` form; rank 0's timeline has an
  ``AUTOTUNE_SAMPLE`` per log row and an ``AUTOTUNE_PARAMS`` per change, and the latter
  names the cycle from which the parameters apply (as ``param_history`` does).
* ``three_rank_run`` (3 ranks, HVDPROF_CYCLE_TIME=2 set explicitly, stopped after five
  windows): identical parameters across ranks; the cycle time never left 2 ms (log,
  history, best).
* ``stopped_run`` (the same job, stopped after its first window, before any decision is
  possible): the end line is said once, at exit, says the job ended while tuning and names
  the pinned knob. (Stopped after five windows, the tuner had sometimes already kept the
  default: two candidates each clearly worse after one window end a round that soon.)
* a 2-rank run whose rank 0 is SIGKILLed mid-tuning: the log still parses, no partial row.
* a 2-rank run with HVDPROF_AUTOTUNE_WARM_START (an earlier log with a watch row and a
  torn last line): accepted, and its best is the first configuration tried after the
  starting one.

Every launch has a hard time limit (launcher ``--timeout``, a subprocess deadline here,
the worker's own watchdog).
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, WORKERS, JobResult, child_env, parse_output

from hvdprof.autotune import AutotuneTrialLog, read_autotune_log
from hvdprof.autotune.log import (
    PHASE_DECISION,
    PHASE_TUNE,
    PHASE_WATCH,
    ROLE_RECOMMENDED,
    make_row,
)
from hvdprof.common import activities as act
from hvdprof.common.records import TunableParams
from hvdprof.config import Config
from hvdprof.timeline import load_traces

pytestmark = pytest.mark.timeout(240)

WORKER = "autotune_worker.py"
MiB = 1024 * 1024
_DEFAULTS = Config()
#: the runtime's starting configuration, from the one registry of defaults
DEFAULT = TunableParams(_DEFAULTS.fusion_threshold_bytes, _DEFAULTS.cycle_time_ms, True)
#: small samples so that a round of tuning takes seconds, not minutes
FAST_TUNING = {
    "HVDPROF_AUTOTUNE": "1",
    "HVDPROF_AUTOTUNE_STEPS_PER_SAMPLE": "3",
    "HVDPROF_AUTOTUNE_WARMUP_SAMPLES": "0",
}
#: the variables in a round's line (only those the tuner changed)
ASSIGNMENT = re.compile(r"(HVDPROF_[A-Z_]+)=(\S+)")
POLL_S = 0.02
#: the log's header as documented: units in the column names
HEADER = (
    "fusion_threshold_bytes,cycle_time_ms,cache_enabled,score_bytes_per_s,"
    "first_step,last_step,unix_time,is_best,phase,role,ratio_to_default,while_tuning_ratio"
)


# ------------------------------------------------------------------------- launching


@dataclass
class LogPolls:
    """What polling the autotune log while the job ran saw."""

    polls: int = 0
    empty: int = 0  # polls that saw the file created but its header not yet written
    max_rows: int = 0
    problems: list[str] = field(default_factory=list)
    #: the row counts the polls saw: the log read at several lengths while it grew
    row_counts: set[int] = field(default_factory=set)


def start_job(
    num_proc: int,
    out: Path,
    *worker_args: str,
    env: dict[str, str],
    timeout: float,
    launcher_args: tuple[str, ...] = (),
) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """``hvdprof run -np N --timeout T [LAUNCHER_ARGS] -- python autotune_worker.py OUT
    ARGS`` in the background; its stdout and stderr go to files (read once it has exited)."""
    out.mkdir(parents=True, exist_ok=True)
    stdout, stderr = out / "launcher.stdout", out / "launcher.stderr"
    command = [
        sys.executable, "-m", "hvdprof", "run", "-np", str(num_proc), "--timeout", str(timeout),
        *launcher_args, "--", sys.executable, str(WORKERS / WORKER), str(out), *worker_args,
    ]  # fmt: skip
    with open(stdout, "wb") as so, open(stderr, "wb") as se:
        proc = subprocess.Popen(
            command, stdout=so, stderr=se, env=child_env(env, timeout), cwd=REPO
        )
    return proc, stdout, stderr


def finish_job(
    proc: subprocess.Popen[bytes],
    stdout: Path,
    stderr: Path,
    started: float,
    timeout: float,
    while_running: Callable[[], None] | None = None,
) -> JobResult:
    """Wait for the launcher (calling ``while_running`` in between), then parse its output."""
    deadline = started + timeout + 30
    while proc.poll() is None:
        if time.monotonic() > deadline:
            proc.send_signal(signal.SIGTERM)  # the launcher then stops its ranks
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            pytest.fail(f"the launcher outlived its own --timeout {timeout:g} s")
        if while_running is not None:
            while_running()
        time.sleep(POLL_S)
    if while_running is not None:
        while_running()  # and once more after the end
    out, err = stdout.read_text(errors="replace"), stderr.read_text(errors="replace")
    result = JobResult(proc.returncode, out + err, time.monotonic() - started)
    parse_output(out, result)
    parse_output(err, result)
    return result


def run_tuned_job(
    num_proc: int,
    out: Path,
    *worker_args: str,
    env: dict[str, str],
    log: Path | None = None,
    timeout: float = 120.0,
) -> tuple[JobResult, LogPolls]:
    """Run a job to its end, polling ``log`` (when given) all the while."""
    polls = LogPolls()
    started = time.monotonic()
    proc, so, se = start_job(num_proc, out, *worker_args, env=env, timeout=timeout)
    poll = None if log is None else (lambda: poll_log(log, out / "snapshot.csv", polls))
    result = finish_job(proc, so, se, started, timeout, poll)
    return result, polls


def info(result: JobResult, rank: int, key: str) -> list[Any]:
    """The JSON values of ``rank``'s ``INFO <key> <json>`` lines."""
    return [json.loads(v) for v in result.values(rank, f"INFO {key}")]


def history_of(result: JobResult, rank: int) -> list[tuple[int, TunableParams]]:
    """The rank's ``cycle.param_history``, as the worker dumped it after shutdown."""
    found = info(result, rank, "history")
    assert len(found) == 1, f"rank {rank} dumped {len(found)} histories; {result.describe()}"
    return [(c, TunableParams(int(f), float(t), bool(ce))) for c, f, t, ce in found[0]]


def tuner_of(result: JobResult) -> dict[str, Any]:
    found = info(result, 0, "tuner")
    assert len(found) == 1, f"rank 0 reported no tuner state; {result.describe()}"
    return found[0]


def _tuple(p: TunableParams) -> list[Any]:
    """As the worker's JSON has it."""
    return [p.fusion_threshold_bytes, p.cycle_time_ms, p.cache_enabled]


def said_lines(result: JobResult, rank: int = 0) -> list[str]:
    """The tuner's lines on a rank's stderr."""
    return [line for line in result.lines(rank, "stderr") if line.startswith("hvdprof autotune:")]


def params_of_line(line: str, default: TunableParams = DEFAULT) -> TunableParams:
    """The configuration a round's line tells the user to set, over ``default``."""
    head = line.split(" — ")[0]
    assignments = dict(ASSIGNMENT.findall(head))
    config = Config.from_env(assignments)
    assert config.explicitly_set == frozenset(assignments), (line, assignments)
    return TunableParams(
        config.fusion_threshold_bytes if "HVDPROF_FUSION_THRESHOLD" in assignments
        else default.fusion_threshold_bytes,
        config.cycle_time_ms if "HVDPROF_CYCLE_TIME" in assignments else default.cycle_time_ms,
        config.cache_capacity > 0 if "HVDPROF_CACHE_CAPACITY" in assignments
        else default.cache_enabled,
    )  # fmt: skip


# --------------------------------------------------------------------------- the log


class _Captured(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def log_problems(text: str, path: Path) -> tuple[list[str], int]:
    """Everything wrong with one snapshot of a log (``path`` holds exactly ``text``), and
    its number of rows. Checked with the csv module and with ``read_autotune_log``."""
    problems: list[str] = []
    if not text.endswith("\n"):
        problems.append(f"does not end with a newline (a partial line): {text[-80:]!r}")
    lines = text.split("\n")[:-1]
    if not lines or lines[0] != HEADER:
        problems.append(f"first line is not the header: {lines[:1]!r}")
        return problems, 0
    header = next(csv.reader([lines[0]]))  # units are in the names: _bytes, _ms, _bytes_per_s
    rows = list(csv.DictReader(io.StringIO(text)))
    for lineno, row in enumerate(rows, start=2):
        if None in row or None in row.values():
            problems.append(f"line {lineno} does not have {len(header)} fields: {row}")
            continue
        try:
            assert int(row["fusion_threshold_bytes"]) >= 0
            assert float(row["cycle_time_ms"]) > 0
            assert row["cache_enabled"] in ("0", "1")
            assert float(row["score_bytes_per_s"]) >= 0
            assert 0 <= int(row["first_step"]) <= int(row["last_step"])
            assert float(row["unix_time"]) > 1.6e9
            assert row["is_best"] in ("0", "1")
            assert row["phase"] in (PHASE_TUNE, PHASE_WATCH, PHASE_DECISION)
        except (AssertionError, ValueError) as exc:
            problems.append(f"line {lineno} has a bad value ({exc!r}): {row}")
    captured = _Captured()
    logger = logging.getLogger("hvdprof.autotune")
    logger.addHandler(captured)
    try:
        parsed = read_autotune_log(path)
    except Exception as exc:
        problems.append(f"read_autotune_log raised {type(exc).__name__}: {exc}")
        parsed = []
    finally:
        logger.removeHandler(captured)
    if captured.messages:
        problems.append(f"read_autotune_log skipped something: {captured.messages}")
    if len(parsed) != len(rows):
        problems.append(f"read_autotune_log found {len(parsed)} rows, csv {len(rows)}")
    return problems, len(rows)


def poll_log(log: Path, snapshot: Path, polls: LogPolls) -> None:
    """One poll: copy the log's bytes as they are now, check the copy."""
    try:
        data = log.read_bytes()
    except FileNotFoundError:
        return  # not created yet
    polls.polls += 1
    if not data:
        polls.empty += 1  # between open(O_TRUNC) and the header's write
        return
    snapshot.write_bytes(data)
    problems, rows = log_problems(data.decode("utf-8", "replace"), snapshot)
    polls.max_rows = max(polls.max_rows, rows)
    polls.row_counts.add(rows)
    if problems and len(polls.problems) < 10:
        polls.problems.append(f"poll {polls.polls} ({rows} rows): {problems}")


def collapse(params: list[TunableParams]) -> list[TunableParams]:
    """Drop consecutive repeats (re-proposing the running configuration changes nothing)."""
    return [p for i, p in enumerate(params) if i == 0 or p != params[i - 1]]


def assert_same_history(result: JobResult, num_proc: int) -> list[tuple[int, TunableParams]]:
    """Every rank applied the same parameters at the same cycles; more than one change."""
    histories = {rank: history_of(result, rank) for rank in range(num_proc)}
    reference = histories[0]
    for rank, history in histories.items():
        assert history == reference, f"rank {rank} applied {history}\nrank 0 applied {reference}"
    cycles = [c for c, _ in reference]
    assert cycles == sorted(set(cycles)), f"cycles not strictly increasing: {cycles}"
    assert reference[0] == (0, reference[0][1]), reference[0]
    assert len(reference) >= 3, f"expected more than one change of parameters: {reference}"
    return reference


def assert_rows_follow_history(rows: list[Any], history: list[tuple[int, TunableParams]]) -> None:
    """The tuning rows measured the applied configurations, in the order applied."""
    tuned = collapse([r.params for r in rows if r.phase == PHASE_TUNE])  # not the decision
    applied = [p for _, p in history]
    assert tuned == applied[: len(tuned)], f"rows measured {tuned}\nranks applied {applied}"
    assert len(applied) <= len(tuned) + 1, f"applied but never measured: {applied[len(tuned) :]}"
    last = -1
    for row in (r for r in rows if r.phase != PHASE_DECISION):  # a decision is no window
        assert row.first_step > last, f"sample step ranges overlap or go back: {rows}"
        last = row.last_step


# ------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("autotune2")
    log, timeline = out / "autotune.csv", out / "timeline"
    env = {
        **FAST_TUNING,
        "HVDPROF_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "6",
        "HVDPROF_AUTOTUNE_LOG": str(log),
        "HVDPROF_TIMELINE": str(timeline),
        "HVDPROF_BACKEND": "shm",  # the threshold is then held: cycle time and cache searched
    }
    result, polls = run_tuned_job(2, out, "--stop", "converged", "--watch", "2", env=env, log=log)
    result.assert_done(2)
    return {"result": result, "polls": polls, "log": log, "timeline": timeline}


def _three_rank_env(log: Path) -> dict[str, str]:
    """The three-rank jobs' settings: a short cycle, Gloo (whose threshold is searched)."""
    return {
        **FAST_TUNING,
        "HVDPROF_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "40",  # far more than it gets
        "HVDPROF_AUTOTUNE_LOG": str(log),
        "HVDPROF_CYCLE_TIME": "2",
        "HVDPROF_BACKEND": "gloo",  # the threshold is searched
    }


@pytest.fixture(scope="module")
def three_rank_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("autotune3")
    log = out / "autotune.csv"
    env = _three_rank_env(log)
    result, polls = run_tuned_job(3, out, "--stop", "samples", "--samples", "5", env=env, log=log)
    result.assert_done(3)
    return {"result": result, "polls": polls, "log": log}


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``three_rank_run``'s job, ended after the first window the tuner scored: no
    decision can come from one window (it needs a comparison between two), so the round
    is surely still running when the job ends. The worker checks after every step and a
    window is 3 steps, so at most one more window is scored before it stops."""
    out = tmp_path_factory.mktemp("autotune3stopped")
    log = out / "autotune.csv"
    env = _three_rank_env(log)
    result, _ = run_tuned_job(3, out, "--stop", "samples", "--samples", "1", env=env, log=log)
    result.assert_done(3)
    return {"result": result, "log": log}


# --------------------------------------------------------------------------- tests


def test_two_ranks_apply_identical_params(two_rank_run: dict[str, Any]) -> None:
    result = two_rank_run["result"]
    result.assert_section("run", 2)  # the sums stayed right across every change
    history = assert_same_history(result, 2)
    assert history[0][1] == DEFAULT
    tuner = tuner_of(result)
    assert tuner["converged"] and tuner["phase"] == "watch", tuner
    # converged: the last change is to the best configuration, which is being watched
    assert _tuple(history[-1][1]) == tuner["best"], (history, tuner)


def test_three_ranks_apply_identical_params(three_rank_run: dict[str, Any]) -> None:
    result = three_rank_run["result"]
    result.assert_section("run", 3)
    assert_same_history(result, 3)


def test_log_well_formed_while_running(two_rank_run: dict[str, Any]) -> None:
    polls: LogPolls = two_rank_run["polls"]
    # Read while it grew, at several lengths (how many polls that takes depends on how
    # fast the job runs: a poll count once failed at 19 of 20 on a quicker runtime)
    assert len(polls.row_counts) >= 4, f"polls saw the log at lengths {sorted(polls.row_counts)}"
    assert polls.max_rows >= 7, f"polls saw at most {polls.max_rows} rows"
    assert not polls.problems, "\n".join(polls.problems)
    rows = read_autotune_log(two_rank_run["log"])
    history = history_of(two_rank_run["result"], 0)
    assert_rows_follow_history(rows, history)
    tune = [r for r in rows if r.phase == PHASE_TUNE]
    watch = [r for r in rows if r.phase == PHASE_WATCH]
    assert 2 <= len(tune) <= 6, f"HVDPROF_AUTOTUNE_BAYES_OPT_MAX_SAMPLES=6: {len(tune)} tune rows"
    decisions = [r for r in rows if r.phase == PHASE_DECISION]
    assert len(decisions) == 1 and rows.index(decisions[0]) == len(tune), rows
    assert tune[0].params == DEFAULT, "the starting configuration is the first sample"
    best = tuner_of(two_rank_run["result"])["best"]
    assert len(watch) >= 2 and all(_tuple(r.params) == best for r in watch), watch
    assert all(r.is_best for r in watch)
    assert any(_tuple(r.params) == best for r in tune), "the best was measured while tuning"


def test_shared_memory_holds_the_threshold_and_windows_alternate(
    two_rank_run: dict[str, Any],
) -> None:
    rows = read_autotune_log(two_rank_run["log"])
    for rank in (0, 1):
        history = history_of(two_rank_run["result"], rank)
        thresholds = {p.fusion_threshold_bytes for _, p in history}
        assert thresholds == {DEFAULT.fusion_threshold_bytes}, history
    assert len({(r.params.cycle_time_ms, r.params.cache_enabled) for r in rows}) >= 2
    tune = [r for r in rows if r.phase == PHASE_TUNE]
    roles = [r.role for r in tune]
    assert roles[:2] == ["incumbent", "candidate"], roles
    for i, role in enumerate(roles[:-1]):
        if role == "candidate":
            assert roles[i + 1] == "incumbent", roles
    assert tune[0].ratio_to_default == 1.0
    assert all(r.role == "watch" for r in rows if r.phase == PHASE_WATCH)


def test_throughput_while_tuning_is_logged_live(two_rank_run: dict[str, Any]) -> None:
    """Every tuning row carries the round's throughput so far against the default (the
    paired estimates of what its windows ran), written as the window is scored; watch rows,
    outside a round, carry none."""
    rows = read_autotune_log(two_rank_run["log"])
    tune = [r for r in rows if r.phase == PHASE_TUNE]
    assert tune and all(r.while_tuning_ratio is not None for r in tune), tune
    assert tune[0].while_tuning_ratio == 1.0  # the first window ran the default
    assert all(0 < (r.while_tuning_ratio or 0) < 10 for r in tune), tune
    assert all(r.while_tuning_ratio is None for r in rows if r.phase == PHASE_WATCH)


def test_log_well_formed_while_running_at_three_ranks(three_rank_run: dict[str, Any]) -> None:
    polls: LogPolls = three_rank_run["polls"]
    assert len(polls.row_counts) >= 3 and polls.max_rows >= 5, polls
    assert not polls.problems, "\n".join(polls.problems)
    rows = read_autotune_log(three_rank_run["log"])
    assert_rows_follow_history(rows, history_of(three_rank_run["result"], 0))


def test_explicit_cycle_time_is_not_searched(three_rank_run: dict[str, Any]) -> None:
    result = three_rank_run["result"]
    rows = read_autotune_log(three_rank_run["log"])
    assert len(rows) >= 5
    assert {r.params.cycle_time_ms for r in rows} == {2.0}, [r.params for r in rows]
    for rank in range(3):
        history = history_of(result, rank)
        assert {p.cycle_time_ms for _, p in history} == {2.0}, history
    # the other knobs were searched (5 windows: default, candidate, default, ...)
    searched = {(r.params.fusion_threshold_bytes, r.params.cache_enabled) for r in rows}
    assert len(searched) >= 2, searched


def test_end_of_tuning_is_said_once_in_one_true_line(two_rank_run: dict[str, Any]) -> None:
    result = two_rank_run["result"]
    tuner = tuner_of(result)
    lines = said_lines(result)
    # once, when the round finished; not again at exit (it said what it did)
    assert len(lines) == 1, f"the tuner's lines on rank 0's stderr: {lines}"
    line = lines[0]
    assert line == tuner["best_line"]
    rows = read_autotune_log(two_rank_run["log"])
    (decision,) = [r for r in rows if r.phase == PHASE_DECISION]
    assert _tuple(decision.params) == tuner["best"]
    if tuner["best"] == _tuple(DEFAULT):
        # true: it kept the default, and prints none of the default's values as a finding
        assert line.startswith("hvdprof autotune: kept the default — nothing to set: "), line
        assert not ASSIGNMENT.findall(line.split(";")[0]), line
        assert decision.role == "kept_default"
    else:
        # true: the variables it prints reproduce what it chose, and the gain is stated
        assert _tuple(params_of_line(line)) == tuner["best"], (line, tuner)
        assert " — step time " in line and "95% interval" in line and "paired steps" in line
        assert decision.role == ROLE_RECOMMENDED
    # only rank 0 tunes, so only rank 0 speaks
    assert not said_lines(result, 1)


def test_stopped_mid_tuning_says_so_and_names_the_pinned_knob(
    stopped_run: dict[str, Any],
) -> None:
    result = stopped_run["result"]
    tuner = tuner_of(result)
    assert not tuner["converged"] and tuner["phase"] == "tune", repr(tuner)
    lines = said_lines(result)
    assert len(lines) == 1, f"expected only the line said at exit: {lines}"
    line = lines[0]
    assert line == tuner["best_line"]
    assert line.startswith("hvdprof autotune: the job ended while tuning (")
    assert "nothing to set" in line
    # too short to tune at this budget, said with the steps it had used
    assert re.search(r"too short to tune: the round had used \d+ of its \d+-step budget", line)
    # the user's HVDPROF_CYCLE_TIME=2 is named as pinned (and was never tuned)
    assert "pinned by you (not tuned): HVDPROF_CYCLE_TIME=2 (" in line, line
    rows = read_autotune_log(stopped_run["log"])
    assert not [r for r in rows if r.phase == PHASE_DECISION]


def test_timeline_records_samples_and_changes(two_rank_run: dict[str, Any]) -> None:
    run = load_traces(str(two_rank_run["timeline"]))
    assert not run.problems, run.problems
    events = run.traces[0].events
    # one sample per measured window; the log's decision row is no window
    rows = [r for r in read_autotune_log(two_rank_run["log"]) if r.phase != PHASE_DECISION]
    history = history_of(two_rank_run["result"], 0)

    samples = [e for e in events if e.get("name") == act.AUTOTUNE_SAMPLE]
    assert len(samples) == len(rows), (len(samples), len(rows))
    for event, row in zip(samples, rows, strict=True):
        args = event["args"]
        assert event["tid"] == act.LANE_AUTOTUNE
        assert (args["fusion_threshold_bytes"], args["cycle_time_ms"], args["cache_enabled"]) == (
            row.params.fusion_threshold_bytes,
            row.params.cycle_time_ms,
            row.params.cache_enabled,
        )
        assert (args["first_step"], args["last_step"], args["phase"]) == (
            row.first_step,
            row.last_step,
            row.phase,
        )
        assert args["is_best"] == row.is_best
        assert args["score"] == pytest.approx(row.score_bytes_per_s, rel=1e-5)
        # the tuner's decisions travel with the sample, as the log has them
        assert args["role"] == row.role
        if row.ratio_to_default is None:
            assert "ratio_to_default" not in args
        else:
            assert args["ratio_to_default"] == pytest.approx(row.ratio_to_default, rel=1e-5)
        assert "recommendation" in args and "incumbent" in args
    scores = [e for e in events if e.get("name") == act.COUNTER_AUTOTUNE_SCORE]
    assert len(scores) == len(rows)

    for rank in (0, 1):
        changes = [e for e in run.traces[rank].events if e.get("name") == act.AUTOTUNE_PARAMS]
        seen = [
            TunableParams(a["fusion_threshold_bytes"], a["cycle_time_ms"], a["cache_enabled"])
            for a in (e["args"] for e in changes)
        ]
        assert seen == [p for _, p in history[1:]], f"rank {rank}: {seen} vs {history}"
    # only rank 0 tunes: no samples on the other rank's timeline
    assert not [e for e in run.traces[1].events if e.get("name") == act.AUTOTUNE_SAMPLE]


def test_timeline_param_changes_at_the_applied_cycle(two_rank_run: dict[str, Any]) -> None:
    """``AUTOTUNE_PARAMS`` names the cycle from which the parameters apply, as
    ``param_history`` does (the cycle that ran with the new parameters first)."""
    run = load_traces(str(two_rank_run["timeline"]))
    history = history_of(two_rank_run["result"], 0)
    changes = [e for e in run.traces[0].events if e.get("name") == act.AUTOTUNE_PARAMS]
    marked = [e["args"]["cycle"] for e in changes]
    applied = [c for c, _ in history[1:]]
    assert marked == applied, (
        f"AUTOTUNE_PARAMS marks cycles {marked}, the ranks applied the parameters from "
        f"cycles {applied}: the CycleRecord of the cycle at whose end new parameters are "
        "applied already carries them (params_changed=True), although that cycle fused and "
        "ran its ops with the old ones (hvdprof/runtime/cycle.py builds the record after "
        "_apply_directives)"
    )


def test_log_survives_sigkill_of_rank0(tmp_path: Path) -> None:
    log = tmp_path / "autotune.csv"
    env = {
        **FAST_TUNING,
        "HVDPROF_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "50",
        "HVDPROF_AUTOTUNE_LOG": str(log),
    }
    timeout = 90.0
    polls = LogPolls()
    killed: list[float] = []
    started = time.monotonic()
    proc, so, se = start_job(
        2, tmp_path, "--stop", "never", "--max-seconds", "60", env=env, timeout=timeout
    )

    def watch() -> None:
        poll_log(log, tmp_path / "snapshot.csv", polls)
        if not killed and polls.max_rows >= 3:
            pid = int((tmp_path / "pid.0").read_text())
            os.kill(pid, signal.SIGKILL)  # rank 0 itself, mid-tuning, no warning
            killed.append(time.monotonic())

    result = finish_job(proc, so, se, started, timeout, watch)
    assert killed, f"the log never reached 3 rows; {result.describe()}"
    assert result.returncode != 0, result.describe()
    assert "DONE" not in result.lines(0), "rank 0 finished before it was killed"
    assert not polls.problems, "\n".join(polls.problems)
    text = log.read_text()
    problems, rows = log_problems(text, log)
    assert not problems, problems
    assert rows >= 3
    # the job was torn down promptly, not after the collective timeout
    assert time.monotonic() - killed[0] < 30, result.describe()


def test_warm_start_seeds_the_tuner(tmp_path: Path) -> None:
    """A log from an earlier run is read back: its best is tried right after the default."""
    warm = tmp_path / "earlier.csv"
    best = TunableParams(3079 * 1024, 7.3, False)  # nothing a fresh design would propose
    earlier = [
        (TunableParams(64 * 1024, 0.5, True), 5e7, PHASE_TUNE),
        (best, 4.8e8, PHASE_TUNE),
        (TunableParams(128 * MiB, 20.0, True), 4e7, PHASE_TUNE),
        (DEFAULT, 6e7, PHASE_TUNE),
        (TunableParams(1 * MiB, 2.0, False), 8e7, PHASE_TUNE),
        (TunableParams(256 * 1024, 0.3, True), 3e7, PHASE_TUNE),
        (TunableParams(32 * MiB, 5.0, False), 9e7, PHASE_TUNE),
        (best, 5.1e8, PHASE_WATCH),
    ]
    with AutotuneTrialLog(warm) as writer:
        for i, (params, score, phase) in enumerate(earlier):
            writer.write(make_row(params, score, 10 * i, 10 * i + 9, params == best, phase))
    with open(warm, "a") as f:
        f.write("4096,0.5,1,1e6,90")  # a torn last line, as a crash would leave
    # A window can end at the default while the first proposal is on its way to the
    # ranks, and on a loaded runner the tuner may end its round on the noise before
    # proposing anything ("kept the default: nothing else was measured"), which is its
    # documented right. Such a job shows nothing about the order: up to three jobs, and
    # every job that proposed anything must have proposed the warm start's best first.
    proposed = 0
    for attempt in range(3):
        out, log = tmp_path / f"job{attempt}", tmp_path / f"autotune{attempt}.csv"
        env = {
            **FAST_TUNING,
            "HVDPROF_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "20",
            "HVDPROF_AUTOTUNE_WARM_START": str(warm),
            "HVDPROF_AUTOTUNE_LOG": str(log),
            "HVDPROF_BACKEND": "gloo",  # the earlier best's threshold is in the space
        }
        result, _ = run_tuned_job(2, out, "--stop", "samples", "--samples", "5", env=env)
        result.assert_done(2)
        assert "ignored" not in result.text(0, "stderr"), result.text(0, "stderr")
        history = assert_same_history_at_least(result, 2, changes=0)
        assert history[0][1] == DEFAULT
        if len(history) == 1:
            said = tuner_of(result)["best_line"]
            assert "nothing else was measured" in said, said
            continue
        proposed += 1
        assert history[1][1] == best, f"first proposal {history[1][1]}, warm start's best {best}"
        tried = [r.params for r in read_autotune_log(log)]
        assert tried[0] == DEFAULT, tried
        assert next(p for p in tried if p != DEFAULT) == best, tried
        break
    assert proposed, "three jobs in a row ended their round before proposing anything"
    assert warm.read_text().count("\n") == len(earlier) + 1, "the warm-start file was modified"


def assert_same_history_at_least(
    result: JobResult, num_proc: int, changes: int
) -> list[tuple[int, TunableParams]]:
    histories = [history_of(result, rank) for rank in range(num_proc)]
    assert all(h == histories[0] for h in histories), histories
    assert len(histories[0]) >= changes + 1, histories[0]
    return histories[0]


# ------------------------------------------------------------- --autotune-from LOG


def decision_log(path: Path, params: TunableParams) -> Path:
    """An autotune log as a finished round leaves it: windows, then its decision row."""
    with AutotuneTrialLog(path) as writer:
        writer.write(make_row(DEFAULT, 1e8, 5, 7, False, PHASE_TUNE, role="incumbent"))
        writer.write(make_row(params, 1.2e8, 9, 11, True, PHASE_TUNE, role="candidate"))
        writer.write(
            make_row(params, 1.2e8, 9, 11, True, PHASE_DECISION, role=ROLE_RECOMMENDED,
                     ratio_to_default=1.2)
        )  # fmt: skip
    return path


def test_autotune_from_starts_a_job_from_the_logged_variables(tmp_path: Path) -> None:
    chosen = TunableParams(2 * MiB, 0.5, False)
    log = decision_log(tmp_path / "tuned.csv", chosen)
    # launched as a user would, without --autotune: every rank starts with the chosen
    # values; a variable the user sets themselves wins over the log
    for env, expected, kept in (
        ({}, chosen, None),
        ({"HVDPROF_CYCLE_TIME": "3"}, TunableParams(2 * MiB, 3.0, False), "HVDPROF_CYCLE_TIME"),
    ):
        out = tmp_path / f"job{len(env)}"
        started = time.monotonic()
        proc, so, se = start_job(
            2, out, "--stop", "never", "--max-steps", "3", env=env, timeout=90.0,
            launcher_args=("--autotune-from", str(log)),
        )  # fmt: skip
        result = finish_job(proc, so, se, started, 90.0)
        result.assert_done(2)
        for rank in (0, 1):
            history = history_of(result, rank)
            assert history == [(0, expected)], (rank, history)
        said = [line for line in result.output.splitlines() if "--autotune-from" in line]
        assert len(said) == 1, result.describe()
        if kept:
            assert f"(yours kept: {kept})" in said[0] and f"{kept}=" not in said[0], said
        else:
            assert "HVDPROF_FUSION_THRESHOLD=2097152 HVDPROF_CYCLE_TIME=0.5 " in said[0], said
            assert "HVDPROF_CACHE_CAPACITY=0" in said[0], said


def test_autotune_from_a_log_without_a_decision_is_one_clear_line(tmp_path: Path) -> None:
    log = tmp_path / "cut.csv"
    with AutotuneTrialLog(log) as writer:  # a job that ended while tuning
        writer.write(make_row(DEFAULT, 1e8, 5, 7, True, PHASE_TUNE, role="incumbent"))
    for path, why in ((log, "has no autotune decision"), (tmp_path / "none.csv", "no such file")):
        proc = subprocess.run(
            [sys.executable, "-m", "hvdprof", "run", "-np", "2", "--autotune-from", str(path),
             "--", sys.executable, "-c", "pass"],
            capture_output=True, text=True, env=child_env({}, 60.0), cwd=REPO, timeout=60,
        )  # fmt: skip
        assert proc.returncode != 0
        err = proc.stderr.strip().splitlines()
        assert len(err) == 1 and why in err[0] and str(path) in err[0], proc.stderr
        assert "Traceback" not in proc.stderr


def test_autotune_from_leaves_the_run_options_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--cycle-time-ms`` beside ``--autotune-from``: the option wins, and the line says
    which of the log's variables were kept as the user set them."""
    from hvdprof.cli import build_parser, run_overrides

    for var in ("HVDPROF_FUSION_THRESHOLD", "HVDPROF_CYCLE_TIME", "HVDPROF_CACHE_CAPACITY"):
        monkeypatch.delenv(var, raising=False)
    log = decision_log(tmp_path / "tuned.csv", TunableParams(2 * MiB, 0.5, True))
    argv = ["run", "-np", "2", "--autotune-from", str(log), "--cycle-time-ms", "3", "--", "x"]
    overrides = run_overrides(build_parser().parse_args(argv))
    assert overrides["HVDPROF_CYCLE_TIME"] == "3"
    assert overrides["HVDPROF_FUSION_THRESHOLD"] == "2097152"
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and "(yours kept: HVDPROF_CYCLE_TIME)" in said[0], said
