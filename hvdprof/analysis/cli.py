"""``hvdprof analyze`` and ``hvdprof diff``: the analyses in the terminal or as JSON.

:mod:`hvdprof.cli` only registers these; the work is here. Exit codes of ``analyze``:
0 when everything was read, 1 when something was skipped (the report covers the rest),
2 for usage errors or when nothing at all could be read; ``diff`` adds 3 when a
``--fail-on`` rule failed (:mod:`hvdprof.analysis.gate`). A failure of hvdprof itself (a
bug) exits 4, never 0 or 1: a CI script that tolerates "something was skipped" must not
pass a build whose gate crashed.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hvdprof.analysis.table_cells import fitted, printable

if TYPE_CHECKING:
    from hvdprof.analysis.report import Report
    from hvdprof.trace.model import Run

# Heavy imports (numpy, the analyses) happen in the command handlers: registering the
# commands must cost every other ``hvdprof`` command nothing.

EXIT_CLEAN = 0
EXIT_SKIPPED = 1
EXIT_UNREADABLE = 2
#: ``diff --fail-on``: B is worse than A beyond a rule's margin, at its confidence
EXIT_REGRESSION = 3
#: hvdprof itself failed (a bug: the traceback is printed for the report)
EXIT_INTERNAL = 4


def _crash_is_not_success(handler: Callable[[argparse.Namespace], int]) -> Callable[..., int]:
    """An unexpected exception exits :data:`EXIT_INTERNAL`, not Python's 1 (which these
    commands use for "something was skipped"); expected errors pass through to the
    ``hvdprof: error:`` line and exit 2."""

    @functools.wraps(handler)
    def run(args: argparse.Namespace) -> int:
        from hvdprof.errors import HvdprofError

        try:
            return handler(args)
        except (HvdprofError, OSError, KeyboardInterrupt):
            raise
        except Exception as exc:  # a bug: say so, keep the traceback, never exit 0/1
            traceback.print_exc()
            name = getattr(args, "command", None) or handler.__name__
            print(
                f"hvdprof: internal error in {name} ({type(exc).__name__}): this is a bug "
                f"in hvdprof, please report it with the traceback above; exit {EXIT_INTERNAL}",
                file=sys.stderr,
            )
            return EXIT_INTERNAL

    return run


def add_analyze_parser(commands: Any) -> None:
    """``hvdprof analyze DIR [--json] [--kineto F ...] [--no-cache]``."""
    parser = commands.add_parser(
        "analyze",
        help="answer 'why is my step slow?' from a run's timelines",
        description="Analyse the timelines in DIR (hvdprof's per-rank files, a Horovod "
        "timeline, or a directory of torch.profiler traces, one per rank, from any PyTorch "
        "distributed job): where the time goes, the straggler, fusion, bandwidth, overlap with "
        "compute (given torch.profiler traces) and autotune. Exit code 0: everything read; "
        "1: something was skipped (listed); 2: usage error or nothing readable; 4: hvdprof "
        "itself failed (a bug).",
    )
    parser.add_argument("directory", metavar="DIR", help="timeline directory or one trace file")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--kineto",
        action="extend",
        nargs="+",
        default=[],
        metavar="TRACE",
        help="torch.profiler (Kineto) trace(s) of the same run, for the overlap question "
        "(RANK=PATH when the rank is not in the file)",
    )
    parser.add_argument(
        "--no-cache", action="store_true", help="neither read nor write .hvdprof-cache/"
    )
    parser.add_argument(
        "--summary",
        metavar="FILE",
        help="also write the run's summary (per-step times per phase and rank: kilobytes) "
        "to FILE, a baseline 'hvdprof diff FILE DIR' compares against (a new file, or one "
        "that is neither a trace nor a device, FIFO, directory or link)",
    )
    parser.set_defaults(handler=_crash_is_not_success(cmd_analyze))


def add_diff_parser(commands: Any) -> None:
    """``hvdprof diff A B [--json] [--fail-on RULE ...]``."""
    parser = commands.add_parser(
        "diff",
        help="what changed between two runs (biggest regressions first); a CI gate",
        description="Compare run B with run A per step: per phase, per rank and per tensor. "
        "A and B are timeline directories (hvdprof, Horovod, or torch.profiler traces), "
        "trace files, or summaries written by "
        "'hvdprof analyze DIR --summary FILE'. Exit code 0: compared; 1: something was "
        "skipped (listed); 2: usage error or nothing readable; 3: a --fail-on rule failed; "
        "4: hvdprof itself failed (a bug).",
    )
    parser.add_argument("run_a", metavar="A", help="the reference run (directory or summary)")
    parser.add_argument("run_b", metavar="B", help="the run to compare (directory or summary)")
    parser.add_argument("--json", action="store_true", help="print the diff as JSON")
    parser.add_argument(
        "--top", type=int, default=20, help="rows to show per table (default 20; 0: none)"
    )
    parser.add_argument(
        "--no-cache", action="store_true", help="neither read nor write .hvdprof-cache/"
    )
    parser.add_argument(
        "--fail-on",
        action="append",
        default=[],
        metavar="RULE",
        help="exit 3 when B is worse than A by more than RULE with --confidence: '5%%' or "
        "'2ms' (the median step time, as analyze quotes it), 'negotiate:10%%' (a phase's "
        "mean per step), 'rank:5%%' or 'rank1:5%%' (a rank's own work, mean per step); "
        "repeatable",
    )
    parser.add_argument(
        "--confidence",
        type=float,
        default=0.95,
        help="one-sided confidence of --fail-on (default 0.95): a rule fails when the "
        "change is above its margin at this confidence, the line printing that lower bound",
    )
    parser.set_defaults(handler=_crash_is_not_success(cmd_diff))


def _load(path: str, cache: bool) -> Run:
    from hvdprof.trace.loader import LoadError, load_run

    try:
        run = load_run(path, cache=cache, progress=True)
    except LoadError as exc:  # its message names files: printed as the terminal shows them
        raise LoadError(printable(str(exc))) from None
    if run.events == 0 and not len(run.slices):
        reasons = "; ".join(str(p) for p in run.problems[:3]) or "no events"
        raise LoadError(printable(f"nothing readable in {path}: {reasons}"))
    return run


def _json_safe(value: Any) -> Any:
    """JSON-writable strings (a file name's undecodable bytes written ``\\xff``)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            return value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    if isinstance(value, dict):
        return {_json_safe(k) if isinstance(k, str) else k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def _print_json(data: dict[str, Any]) -> None:
    """The JSON on stdout; a reader that went away (``| head``) is not an error."""
    import orjson

    option = orjson.OPT_SERIALIZE_NUMPY
    try:
        text = orjson.dumps(data, option=option)
    except orjson.JSONEncodeError:  # a string JSON cannot carry (see _json_safe)
        text = orjson.dumps(_json_safe(data), option=option)
    try:
        sys.stdout.write(text.decode() + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def cmd_analyze(args: argparse.Namespace) -> int:
    from hvdprof.analysis.output_file import refusal
    from hvdprof.analysis.report import analyze

    if args.summary is not None:  # before the work: a refused path loses no analysis
        problem = refusal(args.summary)
        if problem is not None:
            raise_usage(f"analyze {problem}")
    run = _load(args.directory, not args.no_cache)
    report = analyze(run, kineto_paths=list(args.kineto))
    if args.json:
        _print_json(report.to_dict())
    else:
        print_report(report)
    if args.summary is not None:
        _write_summary(run, args.summary, sys.stderr if args.json else sys.stdout)
    return EXIT_SKIPPED if report.skipped else EXIT_CLEAN


def _write_summary(run: Run, path: str, stream: Any) -> None:
    from hvdprof.analysis.summary import summarize, write_summary

    size = write_summary(summarize(run), path)
    traces = _trace_bytes(run)
    share = f" ({size / traces:.2%} of the traces' {traces / 1e6:.1f} MB)" if traces else ""
    print(printable(f"summary written to {path}: {size / 1000:.1f} kB{share}"), file=stream)


def _trace_bytes(run: Run) -> int:
    total = 0
    for f in set(run.files.values()):
        with contextlib.suppress(OSError):
            total += os.path.getsize(f)
    return total


def _load_either(path: str, cache: bool) -> Any:
    """A summary file as it is, anything else as a run."""
    from hvdprof.analysis.summary import read_summary

    summary = read_summary(path)
    return summary if summary is not None else _load(path, cache)


def cmd_diff(args: argparse.Namespace) -> int:
    from hvdprof.analysis.diff import diff_summaries
    from hvdprof.analysis.gate import GatedDiff, check_gate, parse_rule
    from hvdprof.analysis.phases import LABELS
    from hvdprof.analysis.summary import RunSummary, summarize

    rules = [parse_rule(text) for text in args.fail_on]  # a bad rule: before any loading
    if not 0.5 < args.confidence < 1.0:  # (NaN too)
        raise_usage(f"--confidence {args.confidence}: expected a number between 0.5 and 1")
    a = _load_either(args.run_a, not args.no_cache)
    b = _load_either(args.run_b, not args.no_cache)
    sa = a if isinstance(a, RunSummary) else summarize(a)
    sb = b if isinstance(b, RunSummary) else summarize(b)
    diff = diff_summaries(sa, sb)
    gates = [check_gate(sa, sb, rule, args.confidence) for rule in rules]
    failed = any(g.failed for g in gates)
    skipped = bool(sa.problems or sb.problems)
    code = EXIT_REGRESSION if failed else EXIT_SKIPPED if skipped else EXIT_CLEAN
    if args.json:
        _print_json(GatedDiff.of(diff, gates).to_dict())
        return code
    from rich.table import Table

    console = _console()
    console.print(diff.verdict or "", style="bold")
    sections = (
        ("work", "Causes: each rank's own work per step (compute and runtime phases)"),
        ("wait", "Consequences: each rank's waiting for the others per step"),
        (None, "Phases (mean over ranks) and tensors per step"),
    )
    for kind, title in sections:
        rows = [
            r
            for r in diff.rows
            if (r.kind == kind if kind else r.kind not in ("work", "wait")) and (r.a_ms or r.b_ms)
        ]
        if not rows or args.top <= 0:
            continue
        table = Table(title=f"{title}; B ({diff.b}) against A ({diff.a})")
        for col in ("what", "A (ms/step)", "B (ms/step)", "change (ms)", "B / A"):
            table.add_column(col, justify="left" if col == "what" else "right")
        for row in rows[: args.top]:
            if row.kind == "wait":
                cause = diff.cause is not None and row in diff.effects
                what = f"{row.key} waiting" + (" (consequence)" if cause else "")
            elif row.kind == "work":
                what = row.key + (" (cause)" if row is diff.cause else "")
            else:
                what = f"{row.kind}: {LABELS.get(row.key, row.key)}"
            ratio = f"{row.ratio:.2f}x" if row.ratio is not None else "new"
            table.add_row(what, f"{row.a_ms:.3f}", f"{row.b_ms:.3f}", f"{row.delta_ms:+.3f}", ratio)
        console.print(fitted(table))
    for s in (sa, sb):
        for p in s.problems:
            console.print(_styled(("skipped", "yellow"), f" {p}"))
    for g in gates:
        style = "bold red" if g.failed else "green"
        line = g.message
        if g.failed and diff.cause is not None and g.checks:
            line += f" Where it came from: {diff.cause.key} {diff.cause.delta_ms:+.2f} ms per step"
            if diff.effects:
                line += "; " + ", ".join(
                    f"{r.key} waits {r.delta_ms:+.2f} ms" for r in diff.effects
                )
            line += "."
        console.print(line, style=style)
    return code


def raise_usage(message: str) -> None:
    from hvdprof.errors import HvdprofError

    raise HvdprofError(message)


def _console() -> Any:
    """A rich console that stops printing quietly when the reader goes away (``| head``),
    keeping the exit code about the input rather than rich's own 1."""
    from rich.console import Console

    class _Console(Console):
        def render_str(self, text: str, **kwargs: Any) -> Any:
            # every string printed, table cells included: names from the files
            return super().render_str(printable(text), **kwargs)

        def on_broken_pipe(self) -> None:
            self.quiet = True
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())

    # no markup: names from the files ("a[/b]" as a directory) are text, never rich's tags
    return _Console(markup=False)


def _styled(*parts: str | tuple[str, str]) -> Any:
    """Styled text from (text, style) pairs and plain strings, each made printable (a
    ``Text`` is not passed through ``render_str``)."""
    from rich.text import Text

    return Text.assemble(
        *((printable(p[0]), p[1]) if isinstance(p, tuple) else printable(p) for p in parts)
    )


def print_report(report: Report) -> None:
    """Verdicts first, then one table per question (rich): each analysis's printer, in
    the registry's order, numbered by its place among the analyses with a table."""
    from rich.table import Table

    from hvdprof.analysis import registry

    console = _console()
    r = report.run
    console.print(
        _styled(
            (r["path"], "bold"),
            f": {r['format']} timeline, {len(r['ranks'])} rank(s), "
            f"{r['events']:,} events, {r['duration_ms'] / 1000.0:.2f} s",
        )
    )
    console.print("Verdicts", style="bold")
    for i, verdict in enumerate(report.verdicts, 1):
        console.print(f" {i}. {verdict}", highlight=False)

    tabled = [a for a in registry.in_report() if a.table is not None]
    for number, analysis in enumerate(tabled, 1):
        value = report.sections.get(analysis.name)
        if value is not None:
            analysis.print_table(console, number, value, report.run)

    if report.problems:
        table = Table(title="What could not be read (skipped)")
        for col in ("file", "where", "reason"):
            table.add_column(col)
        for p in report.problems[:50]:
            table.add_row(os.path.basename(p.file), p.where or "-", p.reason)
        console.print(fitted(table))
        if len(report.problems) > 50:
            console.print(f"... and {len(report.problems) - 50} more (see --json)")
    sys.stdout.flush()
