"""Several runs of one job as one summary, so ``diff`` can name a cause from all of them.

``hvdprof ab`` records a dozen short runs of each side and ``hvdprof history`` a segment
of nightly runs between two shifts. One short run's rows are noisy; the cause of a
slowdown is named from all the runs of each side at once: every per-step series is
joined (the runs' steps, in order), and every per-step mean is the steps-weighted mean
of the runs' (the mean per step over all their steps), so the pooled summary is what
one long run made of these runs would give. The step time is the median of the joined
steps, as ``analyze`` quotes it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from hvdprof.analysis.summary import SUMMARY_FORMAT, SUMMARY_VERSION, RunSummary, Series


def _weights(summaries: Sequence[RunSummary]) -> list[float]:
    """Each run's steps after its warm-up (at least 1, so a run with none still counts)."""
    return [float(max(len(s.series.step), 1)) for s in summaries]


def _mean_of(dicts: Sequence[dict[str, float]], weights: Sequence[float]) -> dict[str, float]:
    """Per key, the weighted mean over the dicts that have it."""
    out: dict[str, float] = {}
    for key in sorted({k for d in dicts for k in d}):
        pairs = [(d[key], w) for d, w in zip(dicts, weights, strict=True) if key in d]
        total = sum(w for _, w in pairs)
        out[key] = sum(v * w for v, w in pairs) / total if total else 0.0
    return out


def _nested_mean(
    dicts: Sequence[dict[int, dict[str, float]]], weights: Sequence[float]
) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    for rank in sorted({r for d in dicts for r in d}):
        have = [(d[rank], w) for d, w in zip(dicts, weights, strict=True) if rank in d]
        out[rank] = _mean_of([h for h, _ in have], [w for _, w in have])
    return out


def _joined_series(summaries: Sequence[RunSummary]) -> Series:
    out = Series()
    widths = Counter(len(s.series.step[0]) for s in summaries if s.series.step)
    if widths:
        width = widths.most_common(1)[0][0]  # runs of another world size are not joined
        out.step = [row for s in summaries for row in s.series.step if len(row) == width]
    for name in sorted({k for s in summaries for k in s.series.phase}):
        out.phase[name] = [v for s in summaries for v in s.series.phase.get(name, [])]
    if all(s.own_work_known for s in summaries):
        for rank in sorted({r for s in summaries for r in s.series.work}):
            out.work[rank] = [v for s in summaries for v in s.series.work.get(rank, [])]
    return out


def _straggler(summaries: Sequence[RunSummary]) -> tuple[int | None, str | None]:
    """The rank most runs name, when more than half of them do."""
    named = Counter(s.straggler for s in summaries if s.straggler is not None)
    if not named:
        return None, None
    rank, count = named.most_common(1)[0]
    if 2 * count <= len(summaries):
        return None, None
    verdict = next(s.straggler_verdict for s in summaries if s.straggler == rank)
    return rank, f"named in {count} of {len(summaries)} runs; e.g. {verdict}"


def pool_summaries(summaries: Sequence[RunSummary], source: str) -> RunSummary:
    """One summary of ``summaries`` (runs of one job), named ``source``."""
    if not summaries:
        raise ValueError("pool_summaries: no summaries")
    w = _weights(summaries)
    series = _joined_series(summaries)
    steps = [v for row in series.step for v in row]
    straggler, verdict = _straggler(summaries)
    return RunSummary(
        format=SUMMARY_FORMAT,
        version=SUMMARY_VERSION,
        source=source,
        trace_format=summaries[0].trace_format,
        ranks=sorted({r for s in summaries for r in s.ranks}),
        steps_in_run=sum(s.steps_in_run for s in summaries),
        step_ms=float(np.median(steps))
        if steps
        else float(np.median([s.step_ms for s in summaries])),
        phase_ms=_mean_of([s.phase_ms for s in summaries], w),
        rank_ms=_nested_mean([s.rank_ms for s in summaries], w),
        own_work_known=all(s.own_work_known for s in summaries),
        tensor_ms=_mean_of([s.tensor_ms for s in summaries], w),
        one_time=sorted({t for s in summaries for t in s.one_time}),
        series=series,
        straggler=straggler,
        straggler_verdict=verdict,
        problems=[f"{s.path or s.source}: {p}" for s in summaries for p in s.problems],
        range_ms=_nested_mean([s.range_ms for s in summaries], w),
        path=source,
    )
