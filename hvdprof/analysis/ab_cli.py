"""``hvdprof ab`` and ``hvdprof history``: the commands; the work is in
:mod:`hvdprof.analysis.ab_runner`, :mod:`hvdprof.analysis.ab` and
:mod:`hvdprof.analysis.history`.

Exit codes of ``ab``: 0 the candidate passed; 2 usage error; 3 the candidate is slower
than the margin allows (as ``diff --fail-on``); 4 hvdprof itself failed (a bug, as for
``analyze`` and ``diff``); 5 a run failed (a command that exits non-zero, is killed, runs
past its timeout or records no steps): never a success code, whatever ran before it.
``history``: 0 read; 2 usage error or a summary that cannot be read; 4 a bug.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hvdprof.analysis.ab_runner import GateOutcome, RunRecord, Side

EXIT_PASS = 0
EXIT_USAGE = 2
#: the same code as ``diff --fail-on``'s regression
EXIT_SLOWER = 3
#: hvdprof itself failed (a bug), as ``analyze`` and ``diff`` say it
EXIT_INTERNAL = 4
EXIT_RUN_FAILED = 5

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|min)?\s*$")


def _duration(text: str) -> float:
    m = _DURATION.match(text)
    if m is None or float(m[1]) <= 0:
        raise argparse.ArgumentTypeError(f"expected seconds ('300', '300s' or '5m'), got {text!r}")
    return float(m[1]) * (60.0 if m[2] in ("m", "min") else 1.0)


def _env_pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def _load_tolerance(text: str) -> float | None:
    if text.strip().lower() == "off":
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected cores (e.g. 0.25) or 'off', got {text!r}")
    return value


def _at_least(low: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}")
        return value

    return parse


def add_ab_parser(commands: Any) -> None:
    """``hvdprof ab --baseline CMD --candidate CMD [--fail-on 5%] ...``."""
    from hvdprof.analysis.ab import MAX_BLOCKS, MIN_BLOCKS

    p = commands.add_parser(
        "ab",
        help="a speed gate for CI: baseline and candidate run interleaved, judged pair by pair",
        description="Run the baseline and the candidate (shell command lines of an hvdprof "
        "job, e.g. 'hvdprof run -np 2 -- python train.py --steps 100') in interleaved "
        "blocks of one run each, in random ABBA order, each with its own timeline; judge "
        "the blocks' ratios of the step time (a signed-rank interval), stop once the answer "
        "is clear, and name the cause from the pooled runs. Exit code 0: passed; 2: usage "
        "error; 3: slower than --fail-on allows; 4: hvdprof itself failed (a bug); 5: a run "
        "failed (every run is kept).",
    )
    p.add_argument("--baseline", metavar="CMD", help="the baseline's command line")
    p.add_argument("--candidate", metavar="CMD", help="the candidate's command line")
    p.add_argument("--command", metavar="CMD", help="one command line for both sides")
    for side in ("baseline", "candidate"):
        p.add_argument(
            f"--{side}-env",
            action="append",
            default=[],
            type=_env_pair,
            metavar="NAME=VALUE",
            help=f"environment variable for the {side}'s runs (repeatable)",
        )
        p.add_argument(
            f"--{side}-dir", metavar="DIR", help=f"run the {side} in DIR (a second checkout)"
        )
    p.add_argument(
        "--fail-on",
        default="5%",
        metavar="MARGIN",
        help="fail when the candidate's step is slower by more than MARGIN (default 5%%)",
    )
    p.add_argument("--confidence", type=float, default=0.95, help="(default 0.95)")
    p.add_argument(
        "--budget",
        type=_duration,
        default=270.0,
        metavar="TIME",
        help="start no block that would end past TIME (default 270s; '5m' also works)",
    )
    p.add_argument(
        "--run-timeout",
        type=_duration,
        default=None,
        metavar="TIME",
        help="kill a run after TIME, a failed run (default: the budget)",
    )
    p.add_argument("--min-blocks", type=_at_least(1), default=MIN_BLOCKS, metavar="N")
    p.add_argument("--max-blocks", type=_at_least(1), default=MAX_BLOCKS, metavar="N")
    p.add_argument(
        "--warmup", type=_at_least(0), default=1, metavar="N", help="unjudged blocks first (1)"
    )
    p.add_argument("--seed", type=int, default=50, help="the blocks' order (default 50)")
    p.add_argument(
        "--load-tolerance",
        type=_load_tolerance,
        default=0.25,
        metavar="CORES",
        help="set a block aside (and run another) when the machine's other load differed "
        "by more than CORES between its two runs; 'off' never does (default 0.25)",
    )
    p.add_argument(
        "--concurrent",
        action="store_true",
        help="run each block's two sides at the same time, so that the machine's changes of "
        "speed reach both (CPU jobs on a noisy runner; each side gets half the machine)",
    )
    p.add_argument(
        "--out", default="hvdprof-ab", metavar="DIR", help="where every run is kept (hvdprof-ab)"
    )
    p.add_argument("--json", metavar="FILE", help="also write the result as JSON to FILE")
    p.set_defaults(handler=_bug_is_not_success(cmd_ab))


def add_history_parser(commands: Any) -> None:
    """``hvdprof history SUMMARY...``."""
    p = commands.add_parser(
        "history",
        help="lasting shifts in a series of nightly summaries, and their causes",
        description="Find where the step time of a series of runs (summaries written by "
        "'hvdprof analyze DIR --summary FILE', in run order) shifted for good: E-divisive "
        "means with a permutation test, so one noisy night is not a shift. Names the first "
        "run of each shift and its cause. Exit code 0: read; 2: usage error or a summary "
        "that cannot be read; 4: hvdprof itself failed (a bug).",
    )
    p.add_argument("summaries", nargs="+", metavar="SUMMARY", help="summary files, oldest first")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(handler=_bug_is_not_success(cmd_history))


def _bug_is_not_success(handler: Any) -> Any:
    """An unexpected exception exits :data:`EXIT_INTERNAL` with its traceback: a CI job
    must not read a crashed gate as anything else."""

    def run(args: argparse.Namespace) -> int:
        from hvdprof.errors import HvdprofError

        try:
            return int(handler(args))
        except (HvdprofError, OSError, KeyboardInterrupt):
            raise  # one line and exit 2 (or 130), from hvdprof.cli
        except Exception as exc:
            import traceback

            traceback.print_exc()
            print(
                f"hvdprof: internal error in {args.command} ({type(exc).__name__}): a bug in "
                f"hvdprof; exit {EXIT_INTERNAL}",
                file=sys.stderr,
            )
            return EXIT_INTERNAL

    return run


def _usage(message: str) -> None:
    from hvdprof.errors import HvdprofError

    raise HvdprofError(message)


def _sides(args: argparse.Namespace) -> dict[str, Side]:
    from hvdprof.analysis.ab_runner import Side

    out = {}
    for name in ("baseline", "candidate"):
        command = getattr(args, name) or args.command
        if not command or not command.strip():
            _usage(f"ab: no command for the {name}: give --{name} CMD (or --command CMD for both)")
        cwd = getattr(args, f"{name}_dir")
        if cwd is not None and not os.path.isdir(cwd):
            _usage(f"ab: --{name}-dir {cwd}: not a directory")
        out[name] = Side(name, command, dict(getattr(args, f"{name}_env")), cwd)
    return out


def _plan(args: argparse.Namespace) -> Any:
    from hvdprof.analysis.ab import SequentialGate
    from hvdprof.analysis.ab_runner import GatePlan
    from hvdprof.analysis.gate import parse_rule

    rule = parse_rule(args.fail_on)
    if rule.what != "step" or not rule.relative:
        _usage(f"ab: --fail-on {args.fail_on!r}: expected a share of the step time, e.g. '5%'")
    if not 0.5 < args.confidence < 1.0:
        _usage(f"ab: --confidence {args.confidence}: expected a number between 0.5 and 1")
    if args.min_blocks > args.max_blocks:
        _usage(f"ab: --min-blocks {args.min_blocks} is more than --max-blocks {args.max_blocks}")
    gate = SequentialGate(rule.margin, args.confidence, args.min_blocks, args.max_blocks)
    timeout = args.run_timeout if args.run_timeout is not None else args.budget
    return GatePlan(
        gate, args.budget, timeout, args.warmup, args.seed, args.load_tolerance, args.concurrent
    )


def _prepare_out(path: str) -> str:
    if os.path.exists(path) and (not os.path.isdir(path) or os.listdir(path)):
        _usage(f"ab: --out {path}: already exists and is not empty (a gate keeps its runs there)")
    os.makedirs(path, exist_ok=True)
    return os.path.abspath(path)


def cmd_ab(args: argparse.Namespace) -> int:
    from rich.console import Console

    from hvdprof.analysis.ab_runner import (
        outcome_to_dict,
        run_gate,
        stop_on_signals,
        verdict_line,
    )

    sides, plan = _sides(args), _plan(args)
    if args.json is not None:  # refused before the runs, not after them
        from hvdprof.analysis.output_file import refusal

        if (problem := refusal(args.json, "ab --json")) is not None:
            _usage(problem)
    out_dir = _prepare_out(args.out)
    stop_on_signals()
    err = Console(stderr=True, markup=False, highlight=False)
    err.print(
        f"hvdprof ab: up to {plan.gate.max_blocks} blocks (looks after {plan.gate.looks}), "
        f"budget {plan.budget_s:g} s; runs kept in {out_dir}"
    )
    outcome = _with_progress(err, plan, sides, out_dir, run_gate)
    j = outcome.judgement
    if outcome.failed_run is not None or j is None:
        code = EXIT_RUN_FAILED
    else:
        code = EXIT_SLOWER if j.failed else EXIT_PASS
    line = verdict_line(outcome)
    if args.json:
        _write_json(args.json, outcome_to_dict(outcome, code))
    style = "bold green" if code == EXIT_PASS else "bold red"
    Console(markup=False, highlight=False, soft_wrap=True).print(line, style=style)
    return code


def _with_progress(err: Any, plan: Any, sides: Any, out_dir: str, run_gate: Any) -> GateOutcome:
    """The gate with a progress bar (a terminal) and one line per run (always: a CI log)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    total = plan.warmup_blocks + plan.gate.max_blocks
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} blocks"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    ) as bar:
        task = bar.add_task("warm-up", total=total)

        def show(outcome: GateOutcome, record: RunRecord | None) -> None:
            if record is not None:
                bar.console.print(_run_line(record))
            elif outcome.runs[-1].set_aside:  # the block just run was set aside
                bar.console.print(_set_aside_line(outcome))
            else:
                bar.console.print(_look_line(outcome))
            done = sum(1 for r in outcome.runs if r.problem is None) // 2
            bar.update(task, completed=done, description=_estimate(outcome))

        return run_gate(plan, sides, out_dir, show)


def _run_line(r: RunRecord) -> str:
    block = "warm-up" if r.block == 0 else f"block {r.block}"
    if r.problem is not None:
        return f"  {block}: {r.side} {r.problem}"
    return f"  {block}: {r.side} {r.step_ms:.3f} ms/step ({r.steps} steps, {r.wall_s:.1f} s)"


def _set_aside_line(outcome: GateOutcome) -> str:
    runs = [r for r in outcome.runs if r.block == outcome.set_aside[-1]]
    if outcome.plan.concurrent:
        spans = ", ".join(
            f"{r.side} {r.steps_unix_s[0] - runs[0].started_unix_s:.1f}-"
            f"{r.steps_unix_s[1] - runs[0].started_unix_s:.1f} s"
            for r in runs
            if r.steps_unix_s is not None
        )
        return (
            f"  block {outcome.set_aside[-1]} set aside: its runs' steps hardly overlapped "
            f"(from launch: {spans}); another block runs in its place"
        )
    loads = ", ".join(
        f"{r.side} {r.other_load_cores:.2f}" for r in runs if r.other_load_cores is not None
    )
    return (
        f"  block {outcome.set_aside[-1]} set aside: the machine's other load (cores, "
        "while the steps ran) "
        f"{loads}; another block runs in its place"
    )


def _look_line(outcome: GateOutcome) -> str:
    j = outcome.looks[-1]
    state = (
        "slower than the margin"
        if j.failed
        else "clear: not slower"
        if j.passed
        else "not clear yet"
    )
    interval = (
        f"{1 - 2 * j.alpha:.0%} interval {j.low:+.1%} to {j.high:+.1%}"
        if j.low > -1.0 and j.high is not None
        else "too few blocks for an interval"
    )
    return f"  look after {j.blocks} blocks: B/A {j.estimate:+.1%} ({interval}): {state}"


def _estimate(outcome: GateOutcome) -> str:
    if not outcome.log_ratios:
        return "warm-up"
    import math
    import statistics

    return f"B/A {math.expm1(statistics.median(outcome.log_ratios)):+.1%}"


def _write_json(path: str, data: dict[str, Any]) -> None:
    """Written as every output file is (:mod:`hvdprof.analysis.output_file`): never over a
    device, a link or a trace, and no temporary file left on any path out."""
    import orjson

    from hvdprof.analysis.output_file import write_atomically

    encoded = orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)
    write_atomically(path, encoded, "ab --json")


def cmd_history(args: argparse.Namespace) -> int:
    from hvdprof.analysis.history import MIN_SEGMENT, find_history
    from hvdprof.analysis.summary import read_summary
    from hvdprof.analysis.table_cells import printable

    summaries = []
    for path in args.summaries:
        s = read_summary(path)  # a damaged one raises SummaryError naming it: exit 2
        if s is None:
            _usage(
                f"history: {printable(path)}: not a summary (write one with "
                "'hvdprof analyze DIR --summary FILE')"
            )
        if not s.step_ms > 0:
            _usage(f"history: {printable(path)}: records no step time (no steps after warm-up)")
        summaries.append(s)
    if len(summaries) < 2 * MIN_SEGMENT:
        _usage(f"history: {len(summaries)} summaries; a shift needs at least {2 * MIN_SEGMENT}")
    names = [os.path.basename(p) for p in args.summaries]
    result = find_history(summaries, names)
    if args.json:
        import orjson

        sys.stdout.write(orjson.dumps(result.to_dict()).decode() + "\n")
        return EXIT_PASS
    print(printable(result.verdict))
    for s in result.shifts:
        print(printable(f"  run {s.index + 1}: {s.verdict}"))
    return EXIT_PASS
