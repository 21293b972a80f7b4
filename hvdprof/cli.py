"""The ``hvdprof`` console command: ``run``, ``timeline merge``, ``env``, ``stacks``,
``dashboard``, ``report``, ``analyze``, ``diff``, ``ab``, ``history``.

Only argument parsing and error reporting live here; the work is done by
:func:`hvdprof.launch.local_job.launch`, ``hvdprof.timeline.merge``, :mod:`hvdprof.config`,
:mod:`hvdprof.dashboard.commands` and :mod:`hvdprof.analysis.cli`.
Every expected failure becomes ``hvdprof: error: ...`` and exit code 2 instead of a
traceback, because the person reading it is starting a job, not debugging hvdprof.
"""

from __future__ import annotations

import sys

from hvdprof.launch import stack_requests

# Before the imports below (~80 ms): the console script imports this module before it
# calls main(), and `hvdprof run` must not die of an early SIGUSR1.
if sys.argv[:1] and sys.argv[0].rsplit("/", 1)[-1] == "hvdprof":  # the console script
    stack_requests.hold_for(sys.argv[1] if len(sys.argv) > 1 else None)

import argparse
import contextlib
import os
import signal
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from hvdprof import __version__
from hvdprof.config import (
    Config,
    MiB,
    env_var,
    horovod_settings,
    horovod_timeline_paths,
    markdown_table,
    name_of,
    timeline_path_problem,
)
from hvdprof.errors import ConfigError, HvdprofError
from hvdprof.launch.local_job import TOPOLOGY_VARS, launch

#: Exit code for bad usage and handled errors, as argparse uses.
EXIT_USAGE = 2
#: Exit code after a Ctrl+C outside the launcher (the launcher returns its own).
EXIT_INTERRUPTED = 130
#: Exit code of any command when hvdprof itself failed (a bug): never 0 or 1, which the
#: analysis commands use for "read" and "read, something skipped"
EXIT_INTERNAL = 4

_RUN_EPILOG = """\
examples:
  hvdprof run -np 4 python train.py --lr 0.1
  hvdprof run -np 2 --timeline /tmp/tl --autotune -- python train.py

Each rank gets HVDPROF_RANK, HVDPROF_SIZE, HVDPROF_LOCAL_RANK, HVDPROF_LOCAL_SIZE,
HVDPROF_CROSS_RANK, HVDPROF_CROSS_SIZE, HVDPROF_CONTROLLER_ADDR and HVDPROF_CONTROLLER_PORT.
Options override the same settings in the environment; `hvdprof env` lists them all.
When one rank fails, the others are stopped and the exit code is the failing rank's.
"""


# --------------------------------------------------------------- argument types


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value


def _megabytes(text: str) -> int:
    """MiB on the command line, bytes in HVDPROF_FUSION_THRESHOLD (as horovodrun does)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of MiB >= 0, got {text!r}")
    return round(value * MiB)


def _like_env(name: str) -> Callable[[str], str]:
    """An argparse type that accepts exactly what the environment variable ``name`` does.

    The option's value is passed on as text, so the rank parses the same string the
    launcher validated.
    """
    var = env_var(name)

    def parse(text: str) -> str:
        try:
            var.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"expected {exc}, got {text!r}") from None
        return text

    return parse


# ------------------------------------------------------------------------ parser


def build_parser() -> argparse.ArgumentParser:
    """The full ``hvdprof`` parser; separate from :func:`main` so tests can inspect it."""
    parser = argparse.ArgumentParser(
        prog="hvdprof",
        description="Horovod-compatible collective runtime for PyTorch, and the tools to see "
        "why a distributed step is slow: launch, trace, tune, analyze (hvdprof, Horovod and "
        "torch.profiler traces), diff, and a live dashboard.",
    )
    parser.add_argument("--version", action="version", version=f"hvdprof {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_run(commands)
    _add_timeline(commands)
    env = commands.add_parser(
        "env",
        help="print the table of every HVDPROF_* variable",
        description="Print every HVDPROF_* variable hvdprof reads, with its default and what "
        "it does, as a Markdown table (docs/environment.md holds this output).",
    )
    env.set_defaults(handler=_cmd_env)
    stacks = commands.add_parser(
        "stacks",
        help="make a running job print every rank's Python stacks",
        description="Send SIGUSR1 to PID: `hvdprof run`'s launcher forwards it to every "
        "rank, and a rank prints its threads' Python stacks to its stderr (each line "
        "prefixed 'hvdprof rank N:') and puts a STACKS instant on its timeline. PID must "
        "be an hvdprof job that handles SIGUSR1 (an `hvdprof run` launcher, or a rank "
        "after hvd.init()); any other process is refused, since SIGUSR1 would end it.",
    )
    stacks.add_argument("pid", metavar="PID", help="the launcher's (or a rank's) pid")
    stacks.set_defaults(handler=_cmd_stacks)
    _add_dashboard(commands)
    _add_analysis(commands)
    return parser


def _add_analysis(commands: Any) -> None:
    """``analyze`` and ``diff`` (implemented in :mod:`hvdprof.analysis.cli`)."""
    from hvdprof.analysis.cli import add_analyze_parser, add_diff_parser

    add_analyze_parser(commands)
    add_diff_parser(commands)
    from hvdprof.analysis.ab_cli import add_ab_parser, add_history_parser

    add_ab_parser(commands)  # hvdprof ab: the interleaved speed gate
    add_history_parser(commands)


def _add_dashboard(commands: Any) -> None:
    """``dashboard`` and ``report`` (implemented in :mod:`hvdprof.dashboard.commands`)."""
    from hvdprof.dashboard.commands import add_dashboard_parser, add_report_parser

    add_dashboard_parser(commands)
    add_report_parser(commands)


def _add_run(commands: Any) -> None:
    run = commands.add_parser(
        "run",
        help="start N ranks of a command (like horovodrun): local, on hosts, or elastic",
        description="Start N ranks of COMMAND, prefix their output, stop all on failure.\n"
        "Local by default; -H hands the job to mpirun; --min-np/--max-np make it elastic.",
        epilog=_RUN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    run.add_argument("-np", "--num-proc", type=_positive_int, metavar="N", help="number of ranks")
    run.add_argument(
        "--min-np", type=_positive_int, metavar="N", help="elastic: fewest ranks the job may run on"
    )
    run.add_argument(
        "--max-np", type=_positive_int, metavar="N", help="elastic: most ranks the job may run on"
    )
    run.add_argument(
        "--host-discovery-script",
        metavar="SCRIPT",
        help="elastic: executable printing HOST:SLOTS lines (this host only); polled every second",
    )
    run.add_argument(
        "-H",
        "--hosts",
        metavar="HOST:SLOTS,...",
        help="run on these hosts through mpirun (e.g. host1:2,host2:2); -np defaults to "
        "the total slots",
    )
    run.add_argument("--timeline", metavar="DIR", help="write per-rank timelines to DIR")
    run.add_argument("--autotune", action="store_true", help="tune fusion and cycle time live")
    run.add_argument("--autotune-log", metavar="PATH", help="CSV log of autotune samples")
    run.add_argument(
        "--autotune-from",
        metavar="LOG",
        help="start from the variables an earlier job's autotune log decided (any you set "
        "yourself win)",
    )
    run.add_argument(
        "--cycle-time-ms", type=_like_env(name_of("cycle_time_ms")), metavar="MS", help="cycle time"
    )
    run.add_argument(
        "--fusion-threshold-mb",
        type=_megabytes,
        metavar="MB",
        help="fusion buffer size in MiB (0 disables fusion)",
    )
    run.add_argument(
        "--timeout",
        type=_positive_seconds,
        metavar="SECONDS",
        help="kill the whole job after SECONDS and exit 124",
    )
    run.add_argument(
        "--start-timeout",
        type=_like_env(name_of("start_timeout_s")),
        metavar="SECONDS",
        help="how long ranks wait for each other at init",
    )
    run.add_argument(
        "--output-filename",
        metavar="DIR",
        help="also save each rank's output to DIR/rank.N/stdout and DIR/rank.N/stderr",
    )
    run.add_argument("--verbose", action="store_true", help="report what the launcher does")
    from hvdprof.dashboard.commands import add_run_option

    add_run_option(run)
    run.add_argument(
        "cmd", nargs=argparse.REMAINDER, metavar="COMMAND", help="program and arguments to run"
    )
    run.set_defaults(handler=_cmd_run)


def _add_timeline(commands: Any) -> None:
    timeline = commands.add_parser("timeline", help="work with timeline files")
    actions = timeline.add_subparsers(dest="timeline_command", metavar="ACTION")
    merge = actions.add_parser(
        "merge",
        help="merge per-rank timelines into one Chrome trace",
        description="Merge the per-rank timelines in DIR (and optional Kineto traces).",
    )
    merge.add_argument("directory", metavar="DIR", help="directory written with --timeline")
    merge.add_argument("-o", "--output", required=True, metavar="OUT", help="merged trace file")
    merge.add_argument(
        "--kineto",
        action="extend",
        nargs="+",
        default=[],
        metavar="TRACE",
        help="PyTorch profiler (Kineto) trace(s) to fold in",
    )
    merge.set_defaults(handler=_cmd_timeline_merge)
    timeline.set_defaults(handler=lambda _args: _usage_error(timeline))


def _usage_error(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return EXIT_USAGE


# ---------------------------------------------------------------------- handlers


def run_overrides(args: argparse.Namespace) -> dict[str, str]:
    """The ``HVDPROF_*`` settings given as ``run`` options; they win over the environment.

    Paths are made absolute so a rank that changes directory still writes where asked.
    """
    overrides: dict[str, str] = {}
    if args.timeline is not None:
        overrides[name_of("timeline_dir")] = os.path.abspath(args.timeline)
    if args.autotune:
        overrides[name_of("autotune")] = "1"
    if args.autotune_log is not None:
        overrides[name_of("autotune_log")] = os.path.abspath(args.autotune_log)
    if args.cycle_time_ms is not None:
        overrides[name_of("cycle_time_ms")] = args.cycle_time_ms
    if args.fusion_threshold_mb is not None:
        overrides[name_of("fusion_threshold_bytes")] = str(args.fusion_threshold_mb)
    if args.start_timeout is not None:
        overrides[name_of("start_timeout_s")] = args.start_timeout
    if getattr(args, "autotune_from", None) is not None:  # last: the options above win
        overrides.update(_autotune_from(args.autotune_from, overrides))
    return overrides


def _autotune_from(path: str, overrides: dict[str, str]) -> dict[str, str]:
    """The variables an earlier autotune log decided, less those set by an option or in
    the environment (a knob the user pinned stays pinned); says what it applies."""
    from hvdprof.autotune.summary import assignments_from_log

    _check_autotune_log_file(path)
    with _skipped_lines() as skipped:
        try:
            found, kept = assignments_from_log(path)
        except (OSError, ValueError) as exc:
            why = f"; {_shown_skips(skipped)}" if skipped else ""
            raise HvdprofError(f"run --autotune-from: {exc}{why}") from None
    if skipped:
        print(f"hvdprof run: --autotune-from {path}: {_shown_skips(skipped)}", file=sys.stderr)
    for name, value in found.items():  # a decision no rank could use: refused here, named
        var = env_var(name)
        try:
            var.parse(value)
        except ValueError as exc:
            raise HvdprofError(
                f"run --autotune-from {path}: its decision {name}={value} is out of range: "
                f"it accepts {exc}; no rank was started"
            ) from None
    if kept:
        print(
            f"hvdprof run: --autotune-from {path}: that tuner kept the default; nothing to set",
            file=sys.stderr,
        )
        return {}
    use = {k: v for k, v in found.items() if k not in overrides and k not in os.environ}
    mine = [k for k in found if k not in use]
    applied = " ".join(f"{k}={v}" for k, v in use.items()) or "nothing"
    note = f" (yours kept: {', '.join(mine)})" if mine else ""
    print(f"hvdprof run: --autotune-from {path}: {applied}{note}", file=sys.stderr)
    return use


def _refuse_set_topology() -> None:
    """``hvdprof run`` sets each rank's topology (``HVDPROF_SIZE`` from ``-np`` ...); one a
    user set would be replaced without a word, so it is refused, naming it. The whole set
    inherited by a command run inside another hvdprof job's rank (its launcher set them
    all) is replaced, and that is said."""
    mine = [name for name in TOPOLOGY_VARS if name in os.environ]
    if not mine:
        return
    Config.from_env({name: os.environ[name] for name in mine})  # malformed: its own line
    if name_of("rank") in os.environ and name_of("controller_port") in os.environ:
        print(
            f"hvdprof run: started inside rank {os.environ[name_of('rank')]} of another "
            "hvdprof job: this job's ranks get their own topology",
            file=sys.stderr,
        )
        return
    given = ", ".join(f"{name}={os.environ[name]!r}" for name in mine)
    raise ConfigError(
        f"{given}: `hvdprof run` sets {'this' if len(mine) == 1 else 'these'} for each rank "
        f"(from -np and the hosts), so {'it' if len(mine) == 1 else 'they'} would not be "
        f"used; unset {'it' if len(mine) == 1 else 'them'} (env -u {mine[0]} ...); no rank "
        "was started"
    )


#: An autotune log is a few kB; a file larger than this is not one (and is not read).
_AUTOTUNE_LOG_MAX_BYTES = 64 * MiB


def _check_autotune_log_file(path: str) -> None:
    """A regular file of sane size, or one line saying what ``path`` is instead."""
    import stat

    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise HvdprofError(f"run --autotune-from: {path}: no such file") from None
    except OSError as exc:
        raise HvdprofError(f"run --autotune-from {path}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(info.st_mode):
        raise HvdprofError(f"run --autotune-from {path}: it is a directory; name the CSV log")
    if not stat.S_ISREG(info.st_mode):
        kind = "a FIFO" if stat.S_ISFIFO(info.st_mode) else "not a regular file"
        if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode):
            kind = "a device"
        raise HvdprofError(f"run --autotune-from {path}: it is {kind}, not an autotune log")
    if info.st_size > _AUTOTUNE_LOG_MAX_BYTES:
        raise HvdprofError(
            f"run --autotune-from {path}: {info.st_size:,} bytes is no autotune log (they "
            f"are kilobytes; at most {_AUTOTUNE_LOG_MAX_BYTES:,} are read)"
        )


def _shown_skips(skipped: list[str]) -> str:
    more = f" and {len(skipped) - 1:,} more" if len(skipped) > 1 else ""
    return f"{len(skipped):,} line(s) skipped ({skipped[0]}{more})"


@contextlib.contextmanager
def _skipped_lines() -> Iterator[list[str]]:
    """The ``hvdprof.autotune`` reader's warnings, one per skipped line (a binary file
    gave thousands), gathered to be said in one line instead of printed each."""
    import logging

    skipped: list[str] = []

    class _Gather(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            skipped.append(record.getMessage()[:160])

    logger = logging.getLogger("hvdprof.autotune")
    handler, propagate = _Gather(logging.WARNING), logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield skipped
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def _check_environment(overrides: dict[str, str]) -> None:
    """Fail fast on a malformed HVDPROF_* variable, once, instead of in every rank."""
    _refuse_set_topology()
    env = {**os.environ, **overrides}
    for name in TOPOLOGY_VARS:
        env.pop(name, None)
    config = Config.from_env(env)
    problem = timeline_path_problem(config.timeline_dir)
    if problem is not None:
        given = "--timeline" if name_of("timeline_dir") in overrides else name_of("timeline_dir")
        raise ConfigError(f"{given}: {problem}; no rank was started")


def _cmd_run(args: argparse.Namespace) -> int:
    command = list(args.cmd)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise HvdprofError(
            "run: no command given; usage: hvdprof run -np N [options] [--] COMMAND [ARGS...]"
        )
    overrides = run_overrides(args)
    _turn_off_an_unwritable_horovod_timeline(overrides)
    _check_environment(overrides)
    horovod = horovod_settings({**os.environ, **overrides})
    if horovod:
        mapped = ", ".join(f"{h} -> {ours}={v}" for ours, (v, h) in horovod.items())
        print(f"hvdprof run: honouring Horovod's variables: {mapped}", file=sys.stderr)
    timeline_file = ""
    if name_of("timeline_dir") in horovod:
        timeline_file = horovod_timeline_paths(os.environ["HOROVOD_TIMELINE"])[1]
    from hvdprof.launch.elastic_local import elastic_requested, run_elastic

    if elastic_requested(args):
        return run_elastic(args, command, overrides)
    if args.hosts:  # several hosts: mpirun starts the ranks (see hvdprof/launch/mpirun.py)
        from hvdprof.launch.mpirun import run_with_mpirun

        return run_with_mpirun(args, command, overrides)
    if args.num_proc is None:
        raise HvdprofError("run: -np N is required (or --min-np/--max-np for an elastic job)")
    from hvdprof.dashboard.commands import launch_with_dashboard

    code = launch_with_dashboard(
        args,
        lambda: launch(
            command,
            args.num_proc,
            env=overrides,
            timeout=args.timeout,
            output_dir=args.output_filename,
            verbose=args.verbose,
        ),
    )
    if timeline_file:
        _write_horovod_timeline(horovod[name_of("timeline_dir")][0], timeline_file)
    return code


def _turn_off_an_unwritable_horovod_timeline(overrides: dict[str, str]) -> None:
    """``HOROVOD_TIMELINE`` naming a place no timeline can be written (``/proc/x.json``, a
    path too long): one warning, then every rank starts with the timeline off and the
    job trains on, as Horovod does. (Our own ``--timeline``/``HVDPROF_TIMELINE`` stays a
    clear error before any rank starts: the user asked hvdprof for that directory.)"""
    horovod = horovod_settings({**os.environ, **overrides})
    if name_of("timeline_dir") not in horovod:
        return
    from hvdprof.timeline.session import horovod_warning, write_problem

    problem = write_problem(horovod[name_of("timeline_dir")][0])
    if problem is not None:
        warning = horovod_warning(os.environ.get("HOROVOD_TIMELINE", ""), problem)
        print(f"hvdprof run: {warning}", file=sys.stderr)
        overrides[name_of("timeline_dir")] = ""


def _write_horovod_timeline(directory: str, path: str) -> None:
    """``HOROVOD_TIMELINE=FILE``: leave the merged trace of every rank at FILE, as
    Horovod leaves its one timeline there (the per-rank files stay in ``directory``)."""
    import glob

    if not glob.glob(os.path.join(glob.escape(directory), "rank.*.json*")):
        print(
            f"hvdprof run: HOROVOD_TIMELINE={path}: no rank recorded a timeline, so no "
            "merged one was written",
            file=sys.stderr,
        )
        return
    from hvdprof.analysis.output_file import refusal

    # (while the job ran, the path was a link to rank 0's trace: that one is ours to replace)
    ours = os.path.islink(path) and os.path.realpath(path).startswith(
        os.path.join(os.path.realpath(directory), "")
    )
    if not ours and (problem := refusal(path, "HOROVOD_TIMELINE", trace_ok=True)) is not None:
        print(f"hvdprof run: {problem}; the per-rank timelines are in {directory}", file=sys.stderr)
        return
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        from hvdprof.timeline.merge import merge_directory

        merge_directory(directory, tmp, [])
        os.replace(tmp, path)
    except Exception as exc:  # the job's result stands; say what is where
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        print(
            f"hvdprof run: HOROVOD_TIMELINE={path}: could not write the merged timeline "
            f"({exc}); the per-rank timelines are in {directory}",
            file=sys.stderr,
        )
        return
    print(
        f"hvdprof run: HOROVOD_TIMELINE: merged timeline of every rank in {path}", file=sys.stderr
    )


def _cmd_timeline_merge(args: argparse.Namespace) -> int:
    # Imported here so `hvdprof run` keeps working whatever state the timeline code is in.
    try:
        from hvdprof.timeline.merge import merge_directory
    except ModuleNotFoundError as exc:
        if exc.name not in ("hvdprof.timeline.merge", "hvdprof.timeline"):
            raise
        raise HvdprofError("timeline merge is not available in this installation") from None
    from hvdprof.analysis.output_file import refusal

    if (problem := refusal(args.output, "timeline merge -o", trace_ok=True)) is not None:
        raise HvdprofError(problem)
    result = merge_directory(args.directory, args.output, list(args.kineto))
    print(str(result))
    return 0


def _cmd_stacks(args: argparse.Namespace) -> int:
    from hvdprof.launch.stack_target import parse_pid, refusal

    pid, problem = parse_pid(args.pid)
    if pid is None:
        raise HvdprofError(f"stacks: {problem}")
    why = refusal(pid)
    if why is not None:
        raise HvdprofError(f"stacks: {why}")
    try:
        os.kill(pid, signal.SIGUSR1)
    except ProcessLookupError:
        raise HvdprofError(f"stacks: no process {pid}") from None
    print(f"asked process {pid} for its ranks' Python stacks (SIGUSR1): see its output")
    return 0


def _cmd_env(_args: argparse.Namespace) -> int:
    print(markdown_table())
    return 0


# -------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hvdprof`` command; returns the process exit code."""
    if argv is None:  # (done at import for the console script; here for other callers)
        stack_requests.hold_for(sys.argv[1] if len(sys.argv) > 1 else None)
    from hvdprof.shadowing import repair_if_shadowed

    repair_if_shadowed()
    parser = build_parser()
    try:
        args = parser.parse_args(None if argv is None else list(argv))
    except SystemExit as exc:  # --help, --version and usage errors
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    handler = getattr(args, "handler", None)
    if handler is None:
        return _usage_error(parser)
    try:
        return int(handler(args))
    except (HvdprofError, OSError) as exc:
        print(f"hvdprof: error: {_message(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("hvdprof: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # a bug: the traceback for the report, and never 0 or 1
        import traceback

        traceback.print_exc()
        print(
            f"hvdprof: internal error in {args.command} ({type(exc).__name__}): this is a bug "
            f"in hvdprof, please report it with the traceback above; exit {EXIT_INTERNAL}",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


def _message(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        return f"{exc.strerror}: {exc.filename}"
    return str(exc) or type(exc).__name__
