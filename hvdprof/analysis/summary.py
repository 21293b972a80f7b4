"""A run's summary: what ``hvdprof diff`` and its gate need, in kilobytes, not the trace.

A CI job that fails a pull request on a slower step keeps a baseline. Keeping the
baseline's traces costs megabytes per run; this keeps the per-step series the gate tests
(each rank's step lengths, each phase averaged over ranks, each rank's own work) and the
means the diff's rows and verdict come from. ``diff`` always works on summaries, also
when given two trace directories, so diffing against a summary file gives the same
verdict as diffing against the trace it was written from, to the last digit.

Written by ``hvdprof analyze DIR --summary FILE`` as JSON (msgspec checks every field's
type when it is read back, so a damaged or foreign file is refused with the field named).
"""

from __future__ import annotations

import math
import os
from typing import Any

import msgspec
import numpy as np

from hvdprof.analysis.breakdown import Breakdown, time_breakdown
from hvdprof.analysis.phases import CATEGORIES
from hvdprof.analysis.steps import (
    count_steps,
    one_time_tensors,
    step_starts,
    typical_step_ms,
    warmup_steps,
)
from hvdprof.analysis.stragglers import OwnWorkSeries, find_stragglers, own_work_series
from hvdprof.errors import HvdprofError
from hvdprof.trace.model import PHASE_NEGOTIATE, PHASE_OP, Run

SUMMARY_FORMAT = "hvdprof-summary"
SUMMARY_VERSION = 1
#: A rank's own runtime phases (the rest of its own work is compute).
RUNTIME_PHASES: tuple[str, ...] = ("collective", "memcpy_in", "memcpy_out", "queue", "other")
#: A file larger than this is not a summary (summaries are kilobytes): read as a trace.
MAX_SUMMARY_BYTES = 64 << 20
#: Per-step values are kept to the microsecond: the timelines' own resolution.
DIGITS = 3
#: A time in a summary above this (ms: a week) is no step's: the file is refused.
MAX_TIME_MS = 7 * 24 * 3600 * 1000.0
#: Ranks are below this (the readers' own bound on a rank number).
MAX_RANK = 1 << 24
#: a run's start must fall before this (the year 2286): anything later is damage
MAX_UNIX_NS = 10**19 - 1
_RANGE = f"that is negative or non-finite, or above {MAX_TIME_MS:.0f} ms (a week)"


class Series(msgspec.Struct, forbid_unknown_fields=True):
    """Per-step values (ms), the warm-up step left out: what the gate resamples."""

    step: list[list[float]] = []  # per step, each rank's step length (steps x ranks)
    phase: dict[str, list[float]] = {}  # breakdown category -> mean over ranks
    work: dict[int, list[float]] = {}  # rank -> its own work (every rank's stamps only)


class RunSummary(msgspec.Struct, forbid_unknown_fields=True):
    """One run, as ``diff`` compares it. ``source`` is the directory summarised."""

    format: str
    version: int
    source: str
    trace_format: str
    ranks: list[int]
    steps_in_run: int
    step_ms: float  # the step time analyze quotes (median, warm-up left out)
    phase_ms: dict[str, float]  # each breakdown category per step, mean over ranks
    rank_ms: dict[int, dict[str, float]]  # per rank: compute, runtime phases, wait
    own_work_known: bool  # every rank's submission stamps (else the breakdown stands in)
    tensor_ms: dict[str, float]  # per-step tensors: negotiation + op per rank and step
    one_time: list[str]  # tensors reduced once (start-up broadcasts): no per-step row
    series: Series
    straggler: int | None = None
    straggler_verdict: str | None = None
    problems: list[str] = []
    #: per rank, ms per step in each of the trace's own ``record_function`` ranges
    #: (Kineto traces that have them), so the diff names the user's own phase
    range_ms: dict[int, dict[str, float]] = {}
    #: the file this summary was read from ("" when made from a trace in memory)
    path: str = ""
    #: when the run started (Unix seconds, the earliest rank's manifest): ``diff`` says
    #: when two runs were recorded far apart. None for traces without a manifest
    recorded_unix_s: int | None = None


class SummaryError(HvdprofError):
    """A summary file that cannot be used: the message names the file and the problem."""


def _per_step_phases(b: Breakdown) -> dict[str, float]:
    """Each phase's mean wall time per step, averaged over ranks, the warm-up step (the
    start-up broadcasts) left out as in the step time."""
    out = {}
    for c in CATEGORIES:
        values = [r.mean_step_ms(c) for r in b.ranks if r.per_step_ms.get(c)]
        out[c] = float(np.mean(values)) if values else 0.0
    return out


def _tensor_ms(run: Run, breakdown: Breakdown) -> dict[str, float]:
    """Each tensor's negotiation + op time per rank and step (ms)."""
    s = run.slices
    mask = ((s.phase == PHASE_NEGOTIATE) | (s.phase == PHASE_OP)) & (s.tensor >= 0)
    rank_steps = sum(r.steps for r in breakdown.ranks)  # (rank, step) pairs
    if not mask.any() or rank_steps <= 0:
        return {}
    t = s.tensor[mask]
    total = np.bincount(t, weights=s.dur_us[mask], minlength=len(run.tensors))
    ops = np.bincount(t, weights=(s.phase[mask] == PHASE_OP), minlength=len(run.tensors))
    return {
        run.tensors[i]: float(total[i]) / rank_steps / 1000.0
        for i in np.flatnonzero(ops > 0).tolist()
    }


def _rank_ms(b: Breakdown, own: OwnWorkSeries | None) -> dict[int, dict[str, float]]:
    """Per rank, ms per step: ``wait`` and its own work as ``compute`` + runtime phases
    (the means of ``own``, as :func:`own_work` gives them). Without every rank's stamps the
    negotiation wait stands in for the waiting and the idle time for compute."""
    out: dict[int, dict[str, float]] = {}
    for r in b.ranks:
        phases = {c: r.mean_step_ms(c) for c in RUNTIME_PHASES}
        if own is not None and r.rank < own.step_ms.shape[1]:
            step_ms = float(own.step_ms[:, r.rank].mean())
            wait = float(own.wait_ms[:, r.rank].mean())
            compute = max(max(step_ms - wait, 0.0) - sum(phases.values()), 0.0)
        else:
            wait, compute = r.mean_step_ms("negotiate"), r.mean_step_ms("idle")
        out[r.rank] = {"compute": compute, **phases, "wait": wait}
    return out


def _rounded(x: np.ndarray) -> list[float]:
    return [round(float(v), DIGITS) for v in x]


def _series(run: Run, b: Breakdown, own: OwnWorkSeries | None) -> Series:
    out = Series()
    spans = []
    for starts in step_starts(run).values():
        spans.append(np.diff(starts[warmup_steps(len(starts)) :]) / 1000.0)
    n = min((len(x) for x in spans), default=0)
    if n:
        out.step = [_rounded(row) for row in np.stack([x[:n] for x in spans], axis=1)]
    per_rank = [r for r in b.ranks if r.steps]
    for c in CATEGORIES:
        rows = []
        for r in per_rank:
            values = r.per_step_ms.get(c) or []
            rows.append(values[warmup_steps(len(values)) :])
        m = min((len(x) for x in rows), default=0)
        if m:
            out.phase[c] = _rounded(np.mean([x[:m] for x in rows], axis=0))
    if own is not None:  # columns are ranks, as in own_work
        for rank in range(own.step_ms.shape[1]):
            out.work[rank] = _rounded(own.work_ms[:, rank])
    return out


def summarize(run: Run) -> RunSummary:
    """The run as ``diff`` compares it: means for the rows, per-step series for the gate.

    Every number ``diff`` uses comes from here, whether the summary is written to a file or
    made from a trace on the spot, so both give the same answer.
    """
    b = time_breakdown(run)
    own = own_work_series(run)  # once: the rows' means and the gate's series
    rank_ms, known = _rank_ms(b, own), own is not None
    ta = _tensor_ms(run, b)
    once = sorted({run.tensors[i] for i in one_time_tensors(run).tolist()} & set(ta))
    stragglers = find_stragglers(run)
    summary = RunSummary(
        format=SUMMARY_FORMAT,
        version=SUMMARY_VERSION,
        source=run.path,
        trace_format=run.source_format,
        ranks=list(run.ranks),
        steps_in_run=count_steps(run),
        step_ms=typical_step_ms(run),
        phase_ms=_per_step_phases(b),
        rank_ms=rank_ms,
        own_work_known=known,
        tensor_ms=ta,
        one_time=once,
        series=_series(run, b, own),
        straggler=stragglers.straggler,
        straggler_verdict=stragglers.verdict,
        problems=[str(p) for p in run.problems],
        range_ms={r.rank: {n: r.mean_ms(n) for n in r.per_step_ms} for r in b.user.ranks},
        recorded_unix_s=_recorded_unix_s(run),
    )
    # JSON holds no NaN or infinity, and read_summary refuses a time that is negative or
    # above a week: a time a damaged trace made so is 0, and said
    plain = msgspec.to_builtins(summary)
    bad: list[str] = []
    plain = _finite(plain, "$", bad)
    if bad:
        plain["problems"].append(
            f"summary: {len(bad)} non-finite, negative or week-long time(s) read as 0 "
            f"({', '.join(bad[:3])})"
        )
    # what a file written and read back would hold, to the bit (one answer either way)
    return msgspec.json.decode(msgspec.json.encode(plain), type=RunSummary)


def _recorded_unix_s(run: Run) -> int | None:
    """The earliest rank's start, from the manifests (whole seconds; None without one)."""
    starts = [
        t
        for m in run.manifests.values()
        if (t := m.start_unix_ns) is not None and 0 < t < MAX_UNIX_NS
    ]
    return min(starts) // 1_000_000_000 if starts else None


def _finite(value: Any, where: str, bad: list[str]) -> Any:
    """``value`` with every float that is no time (every float of a summary is one) 0."""
    if isinstance(value, float) and _bad_time(value):
        bad.append(where)
        return 0.0
    if isinstance(value, dict):
        return {k: _finite(v, f"{where}.{k}", bad) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v, f"{where}[{i}]", bad) for i, v in enumerate(value)]
    return value


def write_summary(summary: RunSummary, path: str) -> int:
    """Write ``summary`` to ``path`` as JSON (atomically: a CI job killed mid-write leaves
    the old baseline), only to a new path or over a regular file that is not a trace
    (:mod:`hvdprof.analysis.output_file`). Returns the bytes written."""
    from hvdprof.analysis.output_file import write_atomically

    data = msgspec.json.encode(msgspec.structs.replace(summary, path=""))
    write_atomically(path, data)
    return len(data)


def _head(f: Any, size: int) -> bytes:
    """The first bytes of ``f`` after any leading whitespace (a summary padded with blank
    lines is still a summary), up to 256 of them; b"" for a file of only whitespace."""
    while f.tell() < size:
        chunk = f.read(1 << 16)
        if not chunk:
            break
        body = chunk.lstrip(b" \t\r\n")
        if body:
            f.seek(f.tell() - len(body))
            return f.read(256)
    return b""


def read_summary(path: str) -> RunSummary | None:
    """The summary in ``path``; None when ``path`` is not a summary file (a directory, a
    trace). A file that says it is a summary but is damaged, truncated or of another
    version raises :class:`SummaryError` naming the file and what is wrong."""
    if not os.path.isfile(path):
        return None
    try:
        size = os.path.getsize(path)
        if size > MAX_SUMMARY_BYTES:
            return None
        with open(path, "rb") as f:
            head = _head(f, size)
            if b'"format":"hvdprof-summary"' not in head.replace(b" ", b""):
                return None
            data = head + f.read()
    except OSError as exc:
        raise SummaryError(f"{path}: cannot read the summary: {exc.strerror}") from None
    try:
        probe = msgspec.json.decode(data)
    except RecursionError:
        raise SummaryError(f"{path}: not a valid summary: nested too deeply") from None
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:  # (a string not UTF-8)
        raise SummaryError(
            f"{path}: not a whole summary ({exc}); write it again with "
            "'hvdprof analyze DIR --summary FILE'"
        ) from None
    version = probe.get("version") if isinstance(probe, dict) else None
    if version != SUMMARY_VERSION:
        raise SummaryError(
            f"{path}: summary version {version!r}, this hvdprof reads version "
            f"{SUMMARY_VERSION}; write it again with 'hvdprof analyze DIR --summary FILE'"
        )
    try:
        summary = msgspec.json.decode(data, type=RunSummary)
    except RecursionError:
        raise SummaryError(f"{path}: not a valid summary: nested too deeply") from None
    except msgspec.ValidationError as exc:
        raise SummaryError(f"{path}: not a valid summary: {exc}") from None
    problem = _shape_problem(summary)
    if problem:
        raise SummaryError(f"{path}: not a valid summary: {problem}")
    return msgspec.structs.replace(summary, path=path)


def _bad_time(v: float) -> bool:
    return not (math.isfinite(v) and 0 <= v <= MAX_TIME_MS)


def _shape_problem(s: RunSummary) -> str | None:
    """What is wrong with the series' shapes or values (types msgspec has checked): every
    time finite, not negative and below :data:`MAX_TIME_MS`, every rank one of the run's."""
    ranks = set(s.ranks)
    if len(ranks) != len(s.ranks) or any(not 0 <= r < MAX_RANK for r in ranks):
        return f"`$.ranks` must list distinct ranks from 0 to {MAX_RANK - 1}"
    if s.steps_in_run < 0:
        return "`$.steps_in_run` is negative"
    widths = {len(row) for row in s.series.step}
    if len(widths) > 1:
        return f"`$.series.step` rows have {sorted(widths)} values: one per rank in every step"
    if widths and not 1 <= min(widths) <= len(ranks):
        return f"`$.series.step` rows have {min(widths)} values for {len(ranks)} rank(s)"
    groups = {"phase": s.series.phase, "work": s.series.work}
    for name, series in groups.items():
        for key, values in series.items():
            if any(_bad_time(v) for v in values):
                return f"`$.series.{name}.{key}` holds a time {_RANGE}"
    if any(_bad_time(v) for row in s.series.step for v in row):
        return f"`$.series.step` holds a time {_RANGE}"
    if _bad_time(s.step_ms):
        return f"`$.step_ms` is {s.step_ms!r}: {_RANGE.removeprefix('that is ')}"
    for name, table in (("phase_ms", s.phase_ms), ("tensor_ms", s.tensor_ms)):
        bad = next((k for k, v in table.items() if _bad_time(v)), None)
        if bad is not None:
            return f"`$.{name}.{bad}` is {table[bad]!r}: {_RANGE.removeprefix('that is ')}"
    for name, per_rank in (("rank_ms", s.rank_ms), ("range_ms", s.range_ms)):
        for rank, table in per_rank.items():
            if rank not in ranks:
                return f"`$.{name}` names rank {rank}, not one of the run's ranks {_ranks(s)}"
            bad = next((k for k, v in table.items() if _bad_time(v)), None)
            if bad is not None:
                return (
                    f"`$.{name}.{rank}.{bad}` is {table[bad]!r}: {_RANGE.removeprefix('that is ')}"
                )
    stray = next((r for r in s.series.work if r not in ranks), None)
    if stray is not None:
        return f"`$.series.work` names rank {stray}, not one of the run's ranks {_ranks(s)}"
    if s.recorded_unix_s is not None and not 0 < s.recorded_unix_s < MAX_UNIX_NS // 10**9:
        return f"`$.recorded_unix_s` is {s.recorded_unix_s}: not a time since 1970"
    if s.straggler is not None and s.straggler not in ranks:
        return f"`$.straggler` is rank {s.straggler}, not one of the run's ranks {_ranks(s)}"
    return None


def _ranks(s: RunSummary) -> str:
    r = sorted(s.ranks)
    if not r:
        return "(none)"
    return f"({r[0]}-{r[-1]})" if r == list(range(r[0], r[-1] + 1)) and len(r) > 1 else str(r)
