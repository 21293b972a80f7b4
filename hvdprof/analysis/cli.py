"""``hvdprof analyze`` and ``hvdprof diff``: the analyses in the terminal or as JSON.

:mod:`hvdprof.cli` only registers these; the work is here. Exit codes of ``analyze``:
0 when everything was read, 1 when something was skipped (the report covers the rest),
2 for usage errors or when nothing at all could be read; ``diff`` adds 3 when a
``--fail-on`` rule failed (:mod:`hvdprof.analysis.gate`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hvdprof.analysis.model import Run
    from hvdprof.analysis.report import Report

# Heavy imports (numpy, the analyses) happen in the command handlers: registering the
# commands must cost every other ``hvdprof`` command nothing.

EXIT_CLEAN = 0
EXIT_SKIPPED = 1
EXIT_UNREADABLE = 2
#: ``diff --fail-on``: B is worse than A beyond a rule's margin, at its confidence
EXIT_REGRESSION = 3


def add_analyze_parser(commands: Any) -> None:
    """``hvdprof analyze DIR [--json] [--kineto F ...] [--no-cache]``."""
    parser = commands.add_parser(
        "analyze",
        help="answer 'why is my step slow?' from a run's timelines",
        description="Analyse the timelines in DIR (hvdprof's per-rank files, a Horovod "
        "timeline, or a directory of torch.profiler traces, one per rank, from any PyTorch "
        "distributed job): where the time goes, the straggler, fusion, bandwidth, overlap with "
        "compute (given torch.profiler traces) and autotune. Exit code 0: everything read; "
        "1: something was skipped (listed); 2: usage error or nothing readable.",
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
        "to FILE, a baseline 'hvdprof diff FILE DIR' compares against",
    )
    parser.set_defaults(handler=cmd_analyze)


def add_diff_parser(commands: Any) -> None:
    """``hvdprof diff A B [--json] [--fail-on RULE ...]``."""
    parser = commands.add_parser(
        "diff",
        help="what changed between two runs (biggest regressions first); a CI gate",
        description="Compare run B with run A per step: per phase, per rank and per tensor. "
        "A and B are timeline directories (hvdprof, Horovod, or torch.profiler traces), "
        "trace files, or summaries written by "
        "'hvdprof analyze DIR --summary FILE'. Exit code 0: compared; 1: something was "
        "skipped (listed); 2: usage error or nothing readable; 3: a --fail-on rule failed.",
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
        "'2ms' (mean step time), 'negotiate:10%%' (a phase), 'rank:5%%' or 'rank1:5%%' "
        "(a rank's own work); repeatable",
    )
    parser.add_argument(
        "--confidence",
        type=float,
        default=0.95,
        help="one-sided confidence of --fail-on (default 0.95)",
    )
    parser.set_defaults(handler=cmd_diff)


def _load(path: str, cache: bool) -> Run:
    from hvdprof.analysis.loader import LoadError, load_run

    try:
        run = load_run(path, cache=cache, progress=True)
    except LoadError as exc:  # its message names files: printed as the terminal shows them
        raise LoadError(printable(str(exc))) from None
    if run.events == 0 and not len(run.slices):
        reasons = "; ".join(str(p) for p in run.problems[:3]) or "no events"
        raise LoadError(printable(f"nothing readable in {path}: {reasons}"))
    return run


#: characters a terminal acts on (escape sequences, bell, backspace ...), tab and newline
#: aside
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` safe to print: control characters (a directory named with an escape
    sequence) written as ``\\x1b``, and a file name's undecodable bytes as ``\\xff``."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


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
    from hvdprof.analysis.report import analyze

    run = _load(args.directory, not args.no_cache)
    report = analyze(run, kineto_paths=list(args.kineto))
    if args.json:
        _print_json(report.to_dict())
    else:
        print_report(report)
    if args.summary:
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
    from hvdprof.analysis.breakdown import LABELS
    from hvdprof.analysis.diff import diff_summaries
    from hvdprof.analysis.gate import check_gate, parse_rule
    from hvdprof.analysis.summary import RunSummary, summarize

    rules = [parse_rule(text) for text in args.fail_on]  # a bad rule: before any loading
    if not 0.5 < args.confidence < 1.0:
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
        data = diff.to_dict()
        data["gate"] = [g.to_dict() for g in gates]
        _print_json(data)
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
        console.print(_fitted(table))
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


def _ms(x: float) -> str:
    return f"{x:,.2f}"


def print_report(report: Report) -> None:
    """Verdicts first, then one table per question (rich)."""
    from rich.table import Table

    from hvdprof.analysis.breakdown import CATEGORIES, SHORT_LABELS
    from hvdprof.analysis.fusion import REASON_WORDS
    from hvdprof.analysis.steps import MIN_STEPS_TO_SKIP_WARMUP

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

    b = report.breakdown
    if b.ranks:
        steps = sorted({rb.steps for rb in b.ranks})
        # the step count goes in the title when every rank has the same (a column fewer:
        # the table then fits 80 columns with whole headers)
        per_rank = len(steps) > 1
        shown = "" if per_rank else f", {steps[0]} steps"
        if all(rb.steps >= MIN_STEPS_TO_SKIP_WARMUP for rb in b.ranks):
            shown += ", the first left out"
        table = Table(
            title=f"1. Where the time goes, per rank (mean ms per step{shown}, share of wall time)"
        )
        table.add_column("rank", justify="right")
        if per_rank:
            table.add_column("steps", justify="right")
        for c in CATEGORIES:
            table.add_column(SHORT_LABELS[c], justify="right")
        for rb in b.ranks:
            table.add_row(
                str(rb.rank),
                *([str(rb.steps)] if per_rank else []),
                *[f"{rb.mean_step_ms(c):.2f} ({rb.share(c):.0%})" for c in CATEGORIES],
            )
        console.print(_fitted(table))
        console.print(
            "  waiting = negotiation wait: submitted, waiting for the other ranks;"
            " idle = no collective activity on the rank (compute, data loading);"
            " backend = the backend's collective call",
            highlight=False,
        )
    if b.user.ranks:
        _print_user_phases(console, b.user)

    s = report.stragglers
    if s.ranks:
        seen = {
            "source": "each rank's own submission times",
            "nccl_kernels": "each rank's NCCL kernel starts",
            "launches": "each rank's launches, from its step's start",
        }.get(s.source, f"readiness as rank {s.observer} saw it")
        since = (
            f", shares and costs from the onset at step {s.onset_step}"
            if s.onset_step is not None and s.onset_step > s.first_step
            else ""
        )
        table = Table(
            title=f"2. Who is late ({s.steps:,} steps, {s.ops_with_marks:,} ops; {seen}{since})"
        )
        cols = ("rank", "held (steps)", "by (ms)", "cost/step (ms, 95%)", "late/step (ms)")
        for col in cols:
            table.add_column(col, justify="right")
        for x in s.ranks:  # most cost first
            mark = " (straggler)" if x.rank in s.culprits else ""
            table.add_row(
                f"{x.rank}{mark}",
                f"{x.held_share:.0%} ({x.held_count:,})",
                _ms(x.held_ms),
                f"{_ms(x.cost_per_step_ms)} ({_ms(x.cost_low_ms)}-{_ms(x.cost_high_ms)})",
                _ms(x.lateness_ms),
            )
        console.print(_fitted(table))
        console.print(
            "  late = the time the others were blocked on this rank per step (union over the "
            "step's ops); cost = as much of it as the rank's own work (data, forward, "
            "backward) took longer than the others': what the job would save if its code "
            "kept pace (the rest is the runtime's); held = steps whose cost reached "
            f"{_ms(s.held_floor_ms)} ms (the bar, or the noise of the ranks not named)",
            highlight=False,
        )

    f = report.fusion
    if f.ranks:
        thr = f"{f.threshold_bytes / 1048576:g} MiB" if f.threshold_bytes else "unknown"
        table = Table(title=f"3. Fusion (threshold {thr})")
        for col in (
            "rank",
            "collectives",
            "fused",
            "tensors per fused",
            "fill",
            "unfused",
            "why unfused",
        ):
            table.add_column(col, justify="left" if col == "why unfused" else "right")
        for x in f.ranks:
            why = "\n".join(f"{k} {n}" for k, n in x.unfused_reasons.items())
            table.add_row(
                str(x.rank),
                f"{x.groups:,}",
                f"{x.fused:,}",
                f"{x.tensors_per_fused_op:.1f}",
                f"{x.fill_mean:.1%}",
                f"{x.unfused:,}",
                why or "-",
            )
        console.print(_fitted(table))
        used = sorted({k for x in f.ranks for k in x.unfused_reasons})
        for k in used:
            console.print(f"  {k}: {REASON_WORDS[k]}", highlight=False)

    bw = report.bandwidth
    if bw.bins:
        table = Table(
            title=f"4. Bandwidth by message size ({bw.ranks} ranks; NCCL-tests algbw/busbw, GB/s = 10^9 B/s)"
        )
        for col in (
            "op",
            "message size",
            "calls",
            "median ms",
            "algbw",
            "busbw",
            "of best busbw",
        ):
            table.add_column(col, justify="right")
        for x in bw.bins:
            table.add_row(
                x.op.lower(),
                _size_range(x.min_bytes),
                f"{x.count:,}",
                f"{x.median_ms:.3f}",
                f"{x.algbw_gbps:.3g}",
                f"{x.busbw_gbps:.3g}",
                f"{x.vs_best:.0%}",
            )
        console.print(_fitted(table))

    o = report.overlap
    if o is not None and o.ranks:
        table = Table(title="5. Communication overlapped by backward compute")
        for col in (
            "rank",
            "communication (ms)",
            "backward compute (ms)",
            "overlapped (ms)",
            "share overlapped",
        ):
            table.add_column(col, justify="right")
        for x in o.ranks:
            table.add_row(
                str(x.rank),
                _ms(x.comm_ms),
                _ms(x.compute_ms),
                _ms(x.overlap_ms),
                f"{x.fraction:.0%}",
            )
        console.print(_fitted(table))

    a = report.autotune
    if a.samples:
        t0 = report.run["t0_us"]
        table = Table(title="6. Autotune samples (window in seconds from the start of the trace)")
        for col in (
            "#",
            "threshold",
            "cycle ms",
            "cache",
            "MB/s",
            "steps",
            "window (s)",
        ):
            table.add_column(col, justify="right")
        for x in a.samples:
            table.add_row(
                f"*{x.index}" if a.recommended == x.index else str(x.index),
                _bytes(x.fusion_threshold_bytes),
                f"{x.cycle_time_ms:.3g}",
                "on" if x.cache_enabled else "off",
                f"{x.score_mb_per_s:.3g}",
                f"{x.first_step}-{x.last_step}",
                f"{(x.t0_us - t0) / 1e6:.3f}-{(x.t1_us - t0) / 1e6:.3f}",
            )
        console.print(_fitted(table))
        if a.recommended is not None:
            console.print("  *: the tuner's recommendation when the recording ended")

    _print_gpu(console, report.gpu)

    if report.problems:
        table = Table(title="What could not be read (skipped)")
        for col in ("file", "where", "reason"):
            table.add_column(col)
        for p in report.problems[:50]:
            table.add_row(os.path.basename(p.file), p.where or "-", p.reason)
        console.print(_fitted(table))
        if len(report.problems) > 50:
            console.print(f"... and {len(report.problems) - 50} more (see --json)")
    sys.stdout.flush()


#: Kernel names per rank in ``analyze``'s GPU table (``--json`` has the report's top list).
CLI_TOP_KERNELS = 5
#: Kernel names are shortened to this many characters there (80-column terminals).
CLI_KERNEL_CHARS = 31
_KIND_WORDS = {"computation": "compute", "communication": "comm"}


def _print_user_phases(console: Any, p: Any) -> None:
    """The trace's own ranges, one row each, one column per rank (up to 8; beyond, the
    median and the rank with the most)."""
    import numpy as np
    from rich.table import Table

    from hvdprof.analysis.user_phases import OUTSIDE

    table = Table(
        title="1b. The step in the trace's own ranges (record_function; mean ms per step)"
    )
    table.add_column("range", justify="left", overflow="fold")
    few = len(p.ranks) <= 8
    if few:
        for r in p.ranks:
            table.add_column(f"rank {r.rank}", justify="right")
    else:
        table.add_column("median", justify="right")
        table.add_column("most (rank)", justify="right")
    for name in [*p.names, OUTSIDE, "step"]:
        values = [r.mean_step_ms() if name == "step" else r.mean_ms(name) for r in p.ranks]
        if few:
            table.add_row(name, *[_ms(v) for v in values])
        else:
            top = int(np.argmax(values))
            table.add_row(
                name, _ms(float(np.median(values))), f"{_ms(values[top])} ({p.ranks[top].rank})"
            )
    console.print(_fitted(table))


def _print_gpu(console: Any, g: Any) -> None:
    """7. HTA's GPU shares per rank, the rank that stands out, top kernels, memcpy rates."""
    from rich.table import Table

    from hvdprof.analysis.device import short_kernel_name

    if not g.ranks:
        return
    table = Table(title="7. GPU per rank (HTA's definitions: shares of the GPU kernel span)")
    for col in ("rank", "span ms", "idle", "compute", "non-compute", "comm overlap", "events"):
        table.add_column(col, justify="right")
    for x in g.ranks:
        mark = " *" if x.rank == g.stands_out else ""
        table.add_row(
            f"{x.rank}{mark}", _ms(x.span_ms), f"{x.idle_share:.2%}", f"{x.compute_share:.2%}",
            f"{x.non_compute_share:.2%}", f"{x.comm_comp_overlap_share:.2%}", f"{x.kernels:,}",
        )  # fmt: skip
    console.print(_fitted(table))
    if g.stands_out_text:
        console.print(
            f"  {'* ' if g.stands_out is not None else ''}{g.stands_out_text}", highlight=False
        )
    table = Table(title=f"GPU kernel time per name (top {CLI_TOP_KERNELS} per rank)")
    for col in ("rank", "kernel", "kind", "count", "ms", "of busy"):
        table.add_column(col, justify="left" if col in ("kernel", "kind") else "right")
    for x in g.ranks:
        for k in x.top_kernels[:CLI_TOP_KERNELS]:
            table.add_row(
                str(x.rank), printable(short_kernel_name(k.name, CLI_KERNEL_CHARS)),
                _KIND_WORDS.get(k.kind, k.kind), f"{k.count:,}", _ms(k.total_ms),
                f"{k.busy_share:.1%}",
            )  # fmt: skip
    console.print(_fitted(table))
    copies = [(x.rank, c) for x in g.ranks for c in x.memcpy]
    if copies:
        table = Table(title="Memcpy bandwidth per copy kind (bytes / duration, GB/s = 10^9 B/s)")
        for col in ("rank", "copy", "copies", "bytes", "ms", "GB/s"):
            table.add_column(col, justify="right")
        for rank, c in copies:
            table.add_row(
                str(rank), c.copy_kind, f"{c.count:,}", _bytes(c.bytes), f"{c.total_ms:.3f}",
                f"{c.gbps:.3g}",
            )  # fmt: skip
        console.print(_fitted(table))


def _bytes(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{int(n)} B"


def _size_range(low: float) -> str:
    """A message-size bin [low, 2 low) compactly: "8-16 B", "16-32 KiB", "512 B-1 KiB"."""
    a, b = _bytes(low).split(), _bytes(2 * low).split()
    if a[1] == b[1]:
        return f"{a[0]}-{b[0]} {a[1]}"
    return f"{a[0]} {a[1]}-{b[0]} {b[1]}"


def _fitted(table: Any) -> Any:
    """``table`` with no header or cell cut to an ellipsis ("backe..."): each column at
    least as wide as the longest word in it (header and cells wrap between words) and
    no wider than its longest line, so a narrow terminal wraps rather than truncates."""
    for column in table.columns:
        header = str(column.header)
        lines = [line for cell in column.cells for line in str(cell).splitlines()]
        words = [w for text in (header, *lines) for w in text.split()] or [""]
        column.min_width = max(len(w) for w in words)  # wrap between words, never cut
        column.max_width = max(len(header), *map(len, lines), 1)
        column.overflow = "fold"
    return table
