"""``hvdprof analyze``'s tables: one printer per analysis, named in the registry.

Each printer is ``printer(console, number, value, run)``: ``value`` is the analysis's
answer as the report holds it, ``number`` its place among the analyses with a table (the
registry's order), ``run`` the report's run summary. A printer prints nothing when its
analysis has nothing to say. rich is imported inside them: the CLI imports this module to
register its commands, which must cost every other ``hvdprof`` command nothing.
"""

from __future__ import annotations

import re
from typing import Any

#: Kernel names per rank in ``analyze``'s GPU table (``--json`` has the report's top list).
CLI_TOP_KERNELS = 5
#: Kernel names are shortened to this many characters there (80-column terminals).
CLI_KERNEL_CHARS = 31
_KIND_WORDS = {"computation": "compute", "communication": "comm"}
#: Names of ops and tensors shown per stall or divergence (the JSON has them all).
NAMES_SHOWN = 3

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


def fitted(table: Any) -> Any:
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


def _ms(x: float) -> str:
    return f"{x:,.2f}"


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


def _names(names: list[str], total: int) -> str:
    shown = ", ".join(names[:NAMES_SHOWN])
    more = total - min(len(names), NAMES_SHOWN)
    return shown + (f" and {more} more" if more > 0 else "")


def breakdown_table(console: Any, number: int, b: Any, run: dict[str, Any]) -> None:
    """Where the time goes per rank; then the trace's own ranges (``{number}b``)."""
    from rich.table import Table

    from hvdprof.analysis.breakdown import CATEGORIES, SHORT_LABELS
    from hvdprof.analysis.steps import MIN_STEPS_TO_SKIP_WARMUP

    if b.ranks:
        steps = sorted({rb.steps for rb in b.ranks})
        # the step count goes in the title when every rank has the same (a column fewer:
        # the table then fits 80 columns with whole headers)
        per_rank = len(steps) > 1
        shown = "" if per_rank else f", {steps[0]} steps"
        if all(rb.steps >= MIN_STEPS_TO_SKIP_WARMUP for rb in b.ranks):
            shown += ", the first left out"
        table = Table(
            title=f"{number}. Where the time goes, per rank (mean ms per step{shown}, "
            "share of wall time)"
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
        console.print(fitted(table))
        console.print(
            "  waiting = negotiation wait: submitted, waiting for the other ranks;"
            " idle = no collective activity on the rank (compute, data loading);"
            " backend = the backend's collective call",
            highlight=False,
        )
    if b.user.ranks:
        _user_phases_table(console, f"{number}b", b.user)


def _user_phases_table(console: Any, number: str, p: Any) -> None:
    """The trace's own ranges, one row each, one column per rank (up to 8; beyond, the
    median and the rank with the most)."""
    import numpy as np
    from rich.table import Table

    from hvdprof.analysis.user_phases import OUTSIDE

    table = Table(
        title=f"{number}. The step in the trace's own ranges (record_function; mean ms per step)"
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
    console.print(fitted(table))


def straggler_table(console: Any, number: int, s: Any, run: dict[str, Any]) -> None:
    """Who is late, by how much, and what it costs per step."""
    from rich.table import Table

    if not s.ranks:
        return
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
        title=f"{number}. Who is late ({s.steps:,} steps, {s.ops_with_marks:,} ops; {seen}{since})"
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
    console.print(fitted(table))
    console.print(
        "  late = the time the others were blocked on this rank per step (union over the "
        "step's ops); cost = as much of it as the rank's own work (data, forward, "
        "backward) took longer than the others': what the job would save if its code "
        "kept pace (the rest is the runtime's); held = steps whose cost reached "
        f"{_ms(s.held_floor_ms)} ms (the bar, or the noise of the ranks not named)",
        highlight=False,
    )


def fusion_table(console: Any, number: int, f: Any, run: dict[str, Any]) -> None:
    """Fused ops per rank, their fill, and why the rest ran alone."""
    from rich.table import Table

    from hvdprof.analysis.fusion import REASON_WORDS

    if not f.ranks:
        return
    thr = f"{f.threshold_bytes / 1048576:g} MiB" if f.threshold_bytes else "unknown"
    table = Table(title=f"{number}. Fusion (threshold {thr})")
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
    console.print(fitted(table))
    used = sorted({k for x in f.ranks for k in x.unfused_reasons})
    for k in used:
        console.print(f"  {k}: {REASON_WORDS[k]}", highlight=False)


def bandwidth_table(console: Any, number: int, bw: Any, run: dict[str, Any]) -> None:
    """Bandwidth by op and message size against the best seen."""
    from rich.table import Table

    if not bw.bins:
        return
    table = Table(
        title=f"{number}. Bandwidth by message size ({bw.ranks} ranks; NCCL-tests "
        "algbw/busbw, GB/s = 10^9 B/s)"
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
    console.print(fitted(table))


def overlap_table(console: Any, number: int, o: Any, run: dict[str, Any]) -> None:
    """Communication time overlapped by backward compute, per rank."""
    from rich.table import Table

    if not o.ranks:
        return
    table = Table(title=f"{number}. Communication overlapped by backward compute")
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
    console.print(fitted(table))


def autotune_table(console: Any, number: int, a: Any, run: dict[str, Any]) -> None:
    """Every scored sample, the recommendation starred."""
    from rich.table import Table

    if not a.samples:
        return
    t0 = run["t0_us"]
    table = Table(
        title=f"{number}. Autotune samples (window in seconds from the start of the trace)"
    )
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
    console.print(fitted(table))
    if a.recommended is not None:
        console.print("  *: the tuner's recommendation when the recording ended")


def gpu_tables(console: Any, number: int, g: Any, run: dict[str, Any]) -> None:
    """HTA's GPU shares per rank, the rank that stands out, top kernels, memcpy rates."""
    from rich.table import Table

    from hvdprof.analysis.device import short_kernel_name

    if not g.ranks:
        return
    table = Table(
        title=f"{number}. GPU per rank (HTA's definitions: shares of the GPU kernel span)"
    )
    for col in ("rank", "span ms", "idle", "compute", "non-compute", "comm overlap", "events"):
        table.add_column(col, justify="right")
    for x in g.ranks:
        mark = " *" if x.rank == g.stands_out else ""
        table.add_row(
            f"{x.rank}{mark}", _ms(x.span_ms), f"{x.idle_share:.2%}", f"{x.compute_share:.2%}",
            f"{x.non_compute_share:.2%}", f"{x.comm_comp_overlap_share:.2%}", f"{x.kernels:,}",
        )  # fmt: skip
    console.print(fitted(table))
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
    console.print(fitted(table))
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
        console.print(fitted(table))


def stall_table(console: Any, number: int, s: Any, run: dict[str, Any]) -> None:
    """Each stall rank 0 reported, longest first: who, how long, at which step, where."""
    from rich.table import Table

    if not s.stalls:
        return
    table = Table(title=f"{number}. Stalls: who kept the job waiting (longest first)")
    for col in ("late rank(s)", "waited (s)", "step", "reports", "ops waited for", "where"):
        table.add_column(
            col, justify="right" if col in ("waited (s)", "step", "reports") else "left"
        )
    for x in sorted(s.stalls, key=lambda x: -x.waited_s):
        places = []
        for rank in x.missing:
            where = x.where.get(rank)
            if where:
                coll = x.collective.get(rank)
                inside = f"waiting in {coll} (a mismatch), called from " if coll else ""
                places.append(f"rank {rank}: {inside}{where.split(' <- ')[0]}")
        table.add_row(
            ", ".join(str(r) for r in x.missing),
            f"{x.waited_s:.1f}" + (" (job ended)" if x.shutdown else ""),
            str(x.step) if x.step >= 0 else "-",
            f"{x.reports:,}",
            _names(x.names, len(x.names)) or "-",
            "\n".join(places) or "-",
        )
    console.print(fitted(table))


def divergence_table(console: Any, number: int, d: Any, run: dict[str, Any]) -> None:
    """Where the ranks stopped holding one model (nothing when they never did)."""
    from rich.table import Table

    if d.step is None:
        return
    table = Table(title=f"{number}. Divergence: the ranks stopped holding one model")
    table.add_column("what", justify="left")
    table.add_column("found", justify="left")
    table.add_row("first step that differed", str(d.step))
    table.add_row("ranks differing from rank 0", ", ".join(str(r) for r in d.ranks) or "-")
    if d.weights_total:
        table.add_row("weights", _names(d.weights, d.weights_total))
    if d.grads_total:
        table.add_row("averaged gradients", _names(d.grads, d.grads_total))
    table.add_row("recorded by ranks", ", ".join(str(r) for r in d.seen_by))
    console.print(fitted(table))
