"""Q6: what did autotune do? Every scored sample, its parameters, score and time window.

The timeline records a sample (``AUTOTUNE_SAMPLE``) when it is scored, i.e. at the end of
its window, and each change of parameters (``AUTOTUNE_PARAMS``) when it is applied. A
sample's window therefore runs from the later of the previous sample and the last change
of parameters before it, to the sample itself. The dashboard jumps from a sample to
that window.

The tuner compares candidates with the incumbent in paired windows, so the single
highest-scoring window is one noisy measurement, not what it recommends. Since the paired
tuner, each sample also records what the tuner decided by then (its role, the paired
ratio to the default, the incumbent, the recommendation with its lower bound, and the
one line it said when the round ended): the verdict here is that line. Older traces have
only ``is_best``: the recommendation is then the configuration of the last sample marked
so (the rule the warm start reads from a log), compared by the mean of its windows.
"""

from __future__ import annotations

from typing import Any

import msgspec

from hvdprof.analysis.registry import Analysis
from hvdprof.analysis.result import Result
from hvdprof.trace.model import Run


class SampleWindow(Result):
    index: int
    fusion_threshold_bytes: int
    cycle_time_ms: float
    cache_enabled: bool
    score_mb_per_s: float  # bytes reduced per second / 1e6
    first_step: int
    last_step: int
    is_best: bool
    phase: str
    t0_us: float
    t1_us: float
    role: str = ""  # incumbent, candidate or watch ("" in older traces)
    ratio_to_default: float | None = None  # the tuner's paired estimate for its configuration
    incumbent: dict[str, Any] | None = None  # the tuner's incumbent after this window


class AutotuneReport(Result):
    samples: list[SampleWindow] = msgspec.field(default_factory=list)
    best: int | None = None  # index into samples of the highest score
    #: index of the last sample marked ``is_best``: the tuner's recommendation when the
    #: recording ended (None when no sample is marked, e.g. a trace from before the mark)
    recommended: int | None = None
    params_changes: int = 0
    verdict: str | None = None
    #: the tuner's recommendation when the recording ended ({fusion_threshold_bytes,
    #: cycle_time_ms, cache_enabled, ratio_to_default, ratio_lower_bound, kept_default}),
    #: and its verdict once a round ended; None in traces from before they were recorded
    recommendation: dict[str, Any] | None = None
    decision: str | None = None
    #: True when the samples carry the tuner's paired decisions (roles, estimates)
    paired: bool = False


def autotune_report(run: Run) -> AutotuneReport:
    """The scored autotune samples with their windows on the run's clock."""
    out = AutotuneReport()
    rank = min((x.rank for x in run.autotune_samples), default=0)
    samples = [x for x in run.autotune_samples if x.rank == rank]
    changes = sorted(c.ts_us for c in run.params_changes if c.rank == rank)
    out.params_changes = len(changes)
    previous = -float("inf")
    for i, x in enumerate(samples):
        last_change = max((t for t in changes if t <= x.ts_us), default=-float("inf"))
        t0 = max(previous, last_change)
        if t0 == -float("inf"):
            t0 = run.t0_us
        out.samples.append(
            SampleWindow(
                index=i,
                fusion_threshold_bytes=x.fusion_threshold_bytes,
                cycle_time_ms=x.cycle_time_ms,
                cache_enabled=x.cache_enabled,
                score_mb_per_s=x.score_bytes_per_s / 1e6,
                first_step=x.first_step,
                last_step=x.last_step,
                is_best=x.is_best,
                phase=x.phase,
                t0_us=t0,
                t1_us=x.ts_us,
                role=x.role,
                ratio_to_default=x.ratio_to_default,
                incumbent=x.incumbent,
            )
        )
        previous = x.ts_us
    if not out.samples:
        out.verdict = None
        return out
    best = max(out.samples, key=lambda x: x.score_mb_per_s)
    out.best = best.index
    recorded = [x for x in samples if x.recommendation is not None]
    if recorded:  # the tuner's own recommendation, as it stood at the last sample
        out.paired = True
        out.recommendation = dict(recorded[-1].recommendation or {})
        decided = [x.decision for x in samples if x.decision]
        out.decision = decided[-1] if decided else None
        key = _key(out.recommendation)
        ran = [x for x in out.samples if _params(x) == key]
        # several windows can run the recommended parameters (a candidate equal to the
        # incumbent): name the one the tuner marked best, as its log does (what a warm
        # start reads), so the table, the log and the verdict name the same window
        chosen = [x for x in ran if x.is_best] or ran
        out.recommended = chosen[-1].index if chosen else None
        out.verdict = _paired_verdict(out)
        return out
    marked = [x for x in out.samples if x.is_best]
    out.recommended = marked[-1].index if marked else None
    out.verdict = _verdict(out)
    return out


#: how the tuner's line starts on stderr (dropped in the analysis, which names autotune)
_LINE_PREFIX = "hvdprof autotune: "


def _key(params: dict[str, Any]) -> tuple[int, float, bool]:
    return (
        int(params.get("fusion_threshold_bytes", 0)),
        round(float(params.get("cycle_time_ms", 0.0)), 6),
        bool(params.get("cache_enabled", False)),
    )


def _describe_params(p: dict[str, Any]) -> str:
    return (
        f"fusion threshold {float(p.get('fusion_threshold_bytes', 0)) / 1048576:.3g} MiB, "
        f"cycle time {float(p.get('cycle_time_ms', 0.0)):.3g} ms, response cache "
        f"{'on' if p.get('cache_enabled') else 'off'}"
    )


def _paired_verdict(report: AutotuneReport) -> str:
    """The tuner's own words: the one line it said when its last round ended (the
    variables to set and the confirmed change of step time, or that it kept the default,
    and any pinned knob), or, mid-round, where it stood."""
    rec = report.recommendation or {}
    n = len(report.samples)
    if report.decision:
        line = report.decision.removeprefix(_LINE_PREFIX).rstrip(".")
        return f"Autotune ({n} samples): {line}."
    head = f"Autotune scored {n} samples and was still tuning when the recording ended"
    if rec.get("kept_default", False):
        return f"{head}; nothing is recommended yet: it runs the default ({_describe_params(rec)})."
    ratio = rec.get("ratio_to_default")
    lower = rec.get("ratio_lower_bound")
    text = f"{head}; the tuner so far recommends {_describe_params(rec)}"
    if isinstance(ratio, int | float):
        text += f": {ratio:.3f}x the default's throughput in paired measurements"
        if isinstance(lower, int | float):
            text += f" (at least {lower:.3f}x)"
    return text + "."


def _params(x: SampleWindow) -> tuple[int, float, bool]:
    return (x.fusion_threshold_bytes, round(x.cycle_time_ms, 6), x.cache_enabled)


def _describe(x: SampleWindow) -> str:
    return (
        f"fusion threshold {x.fusion_threshold_bytes / 1048576:.3g} MiB, cycle time "
        f"{x.cycle_time_ms:.3g} ms, response cache {'on' if x.cache_enabled else 'off'}"
    )


def _mean_score(samples: list[SampleWindow], params: tuple[int, float, bool]) -> float:
    scores = [x.score_mb_per_s for x in samples if _params(x) == params]
    return sum(scores) / len(scores) if scores else 0.0


def _verdict(report: AutotuneReport) -> str:
    samples = report.samples
    n = len(samples)
    if report.recommended is None:  # no sample marked: name the highest window only
        best = samples[report.best or 0]
        return (
            f"Autotune scored {n} samples; the highest-scoring window was sample "
            f"{best.index} ({_describe(best)}) at {best.score_mb_per_s:.3g} MB/s."
        )
    rec = samples[report.recommended]
    start = _params(samples[0])
    tuning = samples[-1].phase == "tune"  # the job ended (or the recording) mid-search
    if tuning:
        text = (
            f"Autotune scored {n} samples and was still tuning when the recording ended; "
            f"its recommendation so far is {_describe(rec)}"
        )
    else:
        text = f"Autotune scored {n} samples; the tuner recommends {_describe(rec)}"
    if _params(rec) == start:
        if tuning:
            return text + " (the starting configuration: no candidate confirmed better yet)."
        return text + " (it kept the starting configuration: no candidate beat it)."
    rec_mean, start_mean = _mean_score(samples, _params(rec)), _mean_score(samples, start)
    text += (
        f": its windows averaged {rec_mean:.3g} MB/s against {start_mean:.3g} MB/s for "
        f"the starting configuration"
    )
    if start_mean > 0:
        text += f" ({rec_mean / start_mean:.2f}x)"
    return text + "."


def autotune_table(console: Any, number: int, a: AutotuneReport, run: dict[str, Any]) -> None:
    """Every scored sample, the recommendation starred."""
    from rich.table import Table

    from hvdprof.analysis.table_cells import fitted, size

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
            size(x.fusion_threshold_bytes),
            f"{x.cycle_time_ms:.3g}",
            "on" if x.cache_enabled else "off",
            f"{x.score_mb_per_s:.3g}",
            f"{x.first_step}-{x.last_step}",
            f"{(x.t0_us - t0) / 1e6:.3f}-{(x.t1_us - t0) / 1e6:.3f}",
        )
    console.print(fitted(table))
    if a.recommended is not None:
        console.print("  *: the tuner's recommendation when the recording ended")


ANALYSIS = Analysis(
    "autotune", autotune_report, AutotuneReport,
    "Autotune samples: parameters, score, time window",
    verdict_order=70, table=autotune_table,
)  # fmt: skip
