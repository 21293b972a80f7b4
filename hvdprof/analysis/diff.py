"""Q7: what changed between two runs? Per phase, per rank and per tensor, worst first.

Runs differ in length, so everything is compared per step: a phase's mean wall time per
step (averaged over ranks), a rank's busy time per step, a tensor's time per step (its
negotiation + op time over the run, per rank and step). One unit for every row, so a
once-only op (a start-up broadcast that waited for a slow rank) weighs what it costs a
step on average rather than its whole wait. Rows are sorted by how much slower run B is
than run A (``delta_ms = b_ms - a_ms``), biggest regression first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hvdprof.analysis.breakdown import CATEGORIES, LABELS, Breakdown, time_breakdown
from hvdprof.analysis.model import PHASE_NEGOTIATE, PHASE_OP, Run
from hvdprof.analysis.stragglers import find_stragglers


@dataclass
class DiffRow:
    kind: str  # "phase" | "rank" | "tensor"
    key: str
    a_ms: float
    b_ms: float

    @property
    def delta_ms(self) -> float:
        return self.b_ms - self.a_ms

    @property
    def ratio(self) -> float | None:
        return self.b_ms / self.a_ms if self.a_ms > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "key": self.key,
            "a_ms": self.a_ms,
            "b_ms": self.b_ms,
            "delta_ms": self.delta_ms,
            "ratio": self.ratio,
        }


@dataclass
class RunDiff:
    a: str
    b: str
    step_ms_a: float
    step_ms_b: float
    rows: list[DiffRow] = field(default_factory=list)  # biggest regression first
    only_in_a: list[str] = field(default_factory=list)  # tensors run B never reduced
    only_in_b: list[str] = field(default_factory=list)  # tensors new in run B
    verdict: str | None = None
    straggler_a: int | None = None  # the rank find_stragglers names in each run
    straggler_b: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "a": self.a,
            "b": self.b,
            "step_ms_a": self.step_ms_a,
            "step_ms_b": self.step_ms_b,
            "rows": [r.to_dict() for r in self.rows],
            "only_in_a": self.only_in_a,
            "only_in_b": self.only_in_b,
            "verdict": self.verdict,
            "straggler_a": self.straggler_a,
            "straggler_b": self.straggler_b,
        }


def _per_step(b: Breakdown) -> dict[str, float]:
    out = {}
    for c in CATEGORIES:
        values = [r.mean_step_ms(c) for r in b.ranks if r.steps]
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


def diff_runs(run_a: Run, run_b: Run) -> RunDiff:
    """Compare run B with run A; the rows most slowed down in B come first."""
    ba, bb = time_breakdown(run_a), time_breakdown(run_b)
    pa, pb = _per_step(ba), _per_step(bb)
    step_a = sum(pa.values())
    step_b = sum(pb.values())
    out = RunDiff(run_a.path, run_b.path, step_a, step_b)
    for c in CATEGORIES:
        out.rows.append(DiffRow("phase", c, pa[c], pb[c]))
    ra = {r.rank: r for r in ba.ranks}
    rb = {r.rank: r for r in bb.ranks}
    for rank in sorted(set(ra) | set(rb)):
        busy = [c for c in CATEGORIES if c != "idle"]
        a = sum(ra[rank].mean_step_ms(c) for c in busy) if rank in ra else 0.0
        b = sum(rb[rank].mean_step_ms(c) for c in busy) if rank in rb else 0.0
        out.rows.append(DiffRow("rank", f"rank {rank}", a, b))
    ta, tb = _tensor_ms(run_a, ba), _tensor_ms(run_b, bb)
    for name in sorted(set(ta) & set(tb)):
        out.rows.append(DiffRow("tensor", name, ta[name], tb[name]))
    out.only_in_a = sorted(set(ta) - set(tb))
    out.only_in_b = sorted(set(tb) - set(ta))
    out.rows.sort(key=lambda r: -r.delta_ms)
    worst = out.rows[0] if out.rows else None
    change = (step_b / step_a - 1.0) if step_a > 0 else 0.0
    text = f"Step time {step_a:.2f} ms -> {step_b:.2f} ms ({change:+.0%})."
    if worst is not None and worst.delta_ms > 0:
        label = LABELS.get(worst.key, worst.key) if worst.kind == "phase" else worst.key
        kind = "" if worst.kind == "rank" else f"{worst.kind} "
        text += (
            f" Biggest regression: {kind}{label}, {worst.a_ms:.2f} -> "
            f"{worst.b_ms:.2f} ms per step ({worst.delta_ms:+.2f} ms)."
        )
    else:
        text += " Nothing got slower."
    if out.only_in_a or out.only_in_b:
        text += (
            f" Tensors only in A: {len(out.only_in_a)}, only in B: {len(out.only_in_b)}"
            " (not compared)."
        )
    out.verdict = text + _straggler_change(run_a, run_b, out)
    return out


def _straggler_change(run_a: Run, run_b: Run, out: RunDiff) -> str:
    """A rank that became (or stopped being) the straggler: waiting shows up on the
    *other* ranks' rows, so the rows alone would name the wrong rank."""
    sa, sb = find_stragglers(run_a), find_stragglers(run_b)
    out.straggler_a, out.straggler_b = sa.straggler, sb.straggler
    if sb.straggler is not None and sb.straggler != sa.straggler:
        return f" In B, rank {sb.straggler} is the straggler (not in A): {sb.verdict}"
    if sa.straggler is not None and sb.straggler is None:
        return f" Rank {sa.straggler}, the straggler in A, is no longer one in B."
    return ""
