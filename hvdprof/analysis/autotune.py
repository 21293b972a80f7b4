"""Q6: what did autotune do? Every scored sample, its parameters, score and time window.

The timeline records a sample (``AUTOTUNE_SAMPLE``) when it is scored, i.e. at the end of
its window, and each change of parameters (``AUTOTUNE_PARAMS``) when it is applied. A
sample's window therefore runs from the later of the previous sample and the last change
of parameters before it, to the sample itself. The dashboard jumps from a sample to
that window.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hvdprof.analysis.model import Run


@dataclass
class SampleWindow:
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


@dataclass
class AutotuneReport:
    samples: list[SampleWindow] = field(default_factory=list)
    best: int | None = None  # index into samples of the highest score
    params_changes: int = 0
    verdict: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "samples": [x.__dict__ for x in self.samples],
            "best": self.best,
            "params_changes": self.params_changes,
            "verdict": self.verdict,
        }


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
            )
        )
        previous = x.ts_us
    if not out.samples:
        out.verdict = None
        return out
    best = max(out.samples, key=lambda x: x.score_mb_per_s)
    out.best = best.index
    first = out.samples[0]
    gain = best.score_mb_per_s / first.score_mb_per_s if first.score_mb_per_s > 0 else 0.0
    out.verdict = (
        f"Autotune scored {len(out.samples)} samples; the best (sample {best.index}: fusion "
        f"threshold {best.fusion_threshold_bytes / 1048576:.3g} MiB, cycle time "
        f"{best.cycle_time_ms:.3g} ms, response cache {'on' if best.cache_enabled else 'off'}) "
        f"reduced {best.score_mb_per_s:.3g} MB/s, {gain:.2f}x the first sample."
    )
    return out
