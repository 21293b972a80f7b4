"""Q7: what changed between two runs? Causes (each rank's own work) before effects (waiting).

A rank that computes 15 ms longer makes every other rank wait 15 ms longer, and a diff of
wall time per phase shows the waiting ranks as the biggest regression: the victims. So
each rank's step is first split into its own work and its waiting for the others (from
the ranks' own submission stamps, :func:`hvdprof.analysis.stragglers.own_work`), and its
own work into the runtime's phases (backend collective, fusion-buffer copies, queue, other)
and compute (the rest: data loading, forward, backward, optimizer). The rows that grew in
a rank's own work are the causes and lead; the waiting they made the others do follows,
labelled as its consequence. Without every rank's stamps (Horovod files) the breakdown's
negotiation wait stands in for the waiting and its idle time for compute.

Runs differ in length, so everything is compared per step: a rank's work and waiting per
step, a phase's mean wall time per step (averaged over ranks), a tensor's time per step
(its negotiation + op time over the run, per rank and step). One unit for every row;
one-time ops (start-up broadcasts) are left
out of the tensor rows, and the step time is the one ``analyze`` quotes
(:func:`hvdprof.analysis.steps.typical_step_ms`). Rows come as: work (causes), then waiting
(consequences), then phases and tensors, each by how much slower run B is than run A
(``delta_ms = b_ms - a_ms``), biggest regression first.
"""

from __future__ import annotations

import msgspec

from hvdprof.analysis.phases import CATEGORIES, LABELS
from hvdprof.analysis.result import Result
from hvdprof.analysis.summary import RUNTIME_PHASES, RunSummary, summarize
from hvdprof.trace.model import Run

#: A cause must add at least this much per step (ms) ...
MIN_CAUSE_MS = 0.5
#: ... and this share of run A's step to be named.
MIN_CAUSE_SHARE = 0.05


class DiffRow(Result):
    kind: str  # "work" (a rank's own work: cause) | "wait" (consequence) | "phase" | "tensor"
    key: str
    a_ms: float
    b_ms: float
    #: from the two above: B - A, and B / A (None where A is 0)
    delta_ms: float = 0.0
    ratio: float | None = None

    def __post_init__(self) -> None:
        self.delta_ms = self.b_ms - self.a_ms
        self.ratio = self.b_ms / self.a_ms if self.a_ms > 0 else None


class RunDiff(Result):
    a: str
    b: str
    step_ms_a: float
    step_ms_b: float
    rows: list[DiffRow] = msgspec.field(default_factory=list)  # biggest regression first
    only_in_a: list[str] = msgspec.field(default_factory=list)  # tensors run B never reduced
    only_in_b: list[str] = msgspec.field(default_factory=list)  # tensors new in run B
    one_time: list[str] = msgspec.field(default_factory=list)  # reduced once (no per-step row)
    cause: DiffRow | None = None  # the work row that grew most, when it is material
    effects: list[DiffRow] = msgspec.field(default_factory=list)  # the waiting it caused
    verdict: str | None = None
    straggler_a: int | None = None  # the rank find_stragglers names in each run
    straggler_b: int | None = None


def _work_label(rank: int, part: str) -> str:
    return f"rank {rank}: {'compute' if part == 'compute' else LABELS.get(part, part)}"


def diff_runs(run_a: Run | RunSummary, run_b: Run | RunSummary) -> RunDiff:
    """Compare run B with run A: the causes (own work that grew) first, then waiting.

    Either may be a trace (a loaded :class:`Run`) or a summary (:func:`summarize`, or one
    read back with ``read_summary``): a trace is summarised first, so both give one answer.
    """
    a = run_a if isinstance(run_a, RunSummary) else summarize(run_a)
    b = run_b if isinstance(run_b, RunSummary) else summarize(run_b)
    return diff_summaries(a, b)


def diff_summaries(a: RunSummary, b: RunSummary) -> RunDiff:
    """:func:`diff_runs` of two summaries."""
    pa, pb = a.phase_ms, b.phase_ms
    # the step time analyze quotes for each run (one number per fact)
    step_a = a.step_ms or sum(pa.values())
    step_b = b.step_ms or sum(pb.values())
    out = RunDiff(a.path or a.source, b.path or b.source, step_a, step_b)
    sa, sb = a.rank_ms, b.rank_ms
    zero: dict[str, float] = {}
    work: list[DiffRow] = []
    wait: list[DiffRow] = []
    # a rank only one run had is no cause of anything in the other: rows for the ranks
    # both runs had (a world-size change is said first, below)
    resized = set(a.ranks) != set(b.ranks)
    compared = set(sa) & set(sb) if resized else set(sa) | set(sb)
    for rank in sorted(compared):
        ra, rb = sa.get(rank, zero), sb.get(rank, zero)
        for part in ("compute", *RUNTIME_PHASES):
            work.append(
                DiffRow("work", _work_label(rank, part), ra.get(part, 0.0), rb.get(part, 0.0))
            )
        wait.append(DiffRow("wait", f"rank {rank}", ra.get("wait", 0.0), rb.get("wait", 0.0)))
    work.sort(key=lambda r: -r.delta_ms)
    wait.sort(key=lambda r: -r.delta_ms)
    others: list[DiffRow] = [
        DiffRow("phase", c, pa.get(c, 0.0), pb.get(c, 0.0)) for c in CATEGORIES
    ]
    ta, tb = a.tensor_ms, b.tensor_ms
    # one-time ops (start-up broadcasts) in either run are not per-step work: no row
    once = set(a.one_time) | set(b.one_time)
    out.one_time = sorted(once & (set(ta) | set(tb)))
    for name in sorted((set(ta) & set(tb)) - once):
        others.append(DiffRow("tensor", name, ta[name], tb[name]))
    others.sort(key=lambda r: -r.delta_ms)
    out.rows = work + wait + others
    out.only_in_a = sorted(set(ta) - set(tb))
    out.only_in_b = sorted(set(tb) - set(ta))
    change = (step_b / step_a - 1.0) if step_a > 0 else 0.0
    text = _world_size_change(a, b) + (
        f"Step time {step_a:.2f} ms -> {step_b:.2f} ms ({change:+.0%})."
    )
    text += recorded_apart(a, b)
    floor = max(MIN_CAUSE_MS, MIN_CAUSE_SHARE * step_a)
    grew = work[0] if work and work[0].delta_ms >= floor else None
    slower = step_b > step_a
    mean_a, mean_b = _mean_step(a), _mean_step(b)
    if not slower and mean_a is not None and mean_b is not None and mean_b - mean_a >= floor:
        # the median step hides a cost paid in fewer than half the steps (a rank 40 ms
        # late in a quarter of them): the mean shows it
        slower = True
        text += (
            f" The mean step grew, though: {mean_a:.2f} -> {mean_b:.2f} ms "
            f"({mean_b / mean_a - 1.0:+.0%}): some steps got much slower, which the median "
            "does not show."
        )
    cause = grew if slower else None  # a cause is a cause of a slowdown only
    if grew is not None and not slower:
        text += (
            f" B is not slower, so no cause is named (own work grew most in {grew.key}: "
            f"{grew.delta_ms:+.1f} ms per step)."
        )
    elif cause is not None:
        out.cause = cause
        # every rank whose own work grew as much is a cause too (two slow ranks on one
        # host): the time one of them waits for the other is not an effect of the first
        grown: dict[str, DiffRow] = {}
        for r in work:
            if r.delta_ms >= floor:
                grown.setdefault(r.key.split(":", 1)[0], r)
        out.effects = [r for r in wait if r.key not in grown and r.delta_ms >= floor]
        text += f" Cause: {cause.key} {cause.delta_ms:+.1f} ms per step"
        text += _in_user_range(a, b, cause, floor)
        also = [r for rank, r in grown.items() if r is not cause][:3]
        if also:
            text += " (also " + ", ".join(f"{r.key} {r.delta_ms:+.1f}" for r in also) + ")"
        if out.effects:
            ranks = ", ".join(r.key.removeprefix("rank ") for r in out.effects)
            deltas = ", ".join(f"{r.delta_ms:+.1f}" for r in out.effects)
            who = "rank" if len(out.effects) == 1 else "ranks"
            text += f"; {who} {ranks} wait{'s' if len(out.effects) == 1 else ''} {deltas} ms as a result."
        else:
            text += "."
    else:
        worst = next((r for r in others if r.delta_ms > 0), None)
        if worst is not None:
            label = LABELS.get(worst.key, worst.key) if worst.kind == "phase" else worst.key
            text += (
                f" No rank's own work grew by {floor:.2f} ms per step; biggest change: "
                f"{worst.kind} {label}, {worst.a_ms:.2f} -> {worst.b_ms:.2f} ms per step "
                f"({worst.delta_ms:+.2f} ms)."
            )
        elif slower:
            text += " No phase or tensor grew per step."
        else:
            text += " Nothing got slower."
    if out.only_in_a or out.only_in_b:
        text += (
            f" Tensors only in A: {len(out.only_in_a)}, only in B: {len(out.only_in_b)}"
            " (not compared)."
        )
    out.verdict = text + _straggler_change(a, b, out)
    return out


def _mean_step(s: RunSummary) -> float | None:
    """The mean step (ms, mean over ranks per step), None without a per-step series."""
    rows = [sum(row) / len(row) for row in s.series.step if row]
    return sum(rows) / len(rows) if rows else None


def _world_size_change(a: RunSummary, b: RunSummary) -> str:
    """First words of the verdict when the runs had different ranks: their rows compare
    only the ranks both had, and the step times come from different jobs."""
    if set(a.ranks) == set(b.ranks):
        return ""
    both = sorted(set(a.ranks) & set(b.ranks))
    rows = f"rank rows compare the {len(both)} rank(s) both had" if both else "no rank in both"
    return f"World size changed: A had {len(a.ranks)} rank(s), B {len(b.ranks)} ({rows}). "


#: runs recorded further apart than this get a sentence on what that means
APART_S = 600


def recorded_apart(a: RunSummary, b: RunSummary) -> str:
    """A sentence when the runs started far apart: a machine's speed drifts between runs
    (on a shared 2-core VM the same job's median step was 3.8 ms one hour and 9.5 ms the
    next), and no interval computed inside each run can see that. Empty otherwise, and
    when either run's start is unknown (traces without a manifest)."""
    ta, tb = a.recorded_unix_s, b.recorded_unix_s
    if ta is None or tb is None or abs(tb - ta) < APART_S:
        return ""
    apart = abs(tb - ta)
    if apart < 2 * 3600:
        when = f"{apart / 60:.0f} minutes"
    elif apart < 2 * 86400:
        when = f"{apart / 3600:.0f} hours"
    else:
        when = f"{apart / 86400:.0f} days"
    order = "after" if tb >= ta else "before"
    return (
        f" B was recorded {when} {order} A: the machine's speed can change between "
        "recordings (other jobs, frequency, noisy neighbours), which no interval within "
        "one run sees, so a difference is weak evidence; 'hvdprof ab' runs both "
        "interleaved in one job."
    )


def _in_user_range(a: RunSummary, b: RunSummary, cause: DiffRow, floor: float) -> str:
    """Where in the trace's own ranges a rank's compute grew: the user's word for it
    ("in its 'forward' range: +12.0 ms"), when both runs have ranges for that rank."""
    if not cause.key.endswith(": compute"):
        return ""
    rank = int(cause.key.split(":", 1)[0].removeprefix("rank "))
    ra, rb = a.range_ms.get(rank), b.range_ms.get(rank)
    if not ra or not rb:
        return ""
    grown = sorted(((rb.get(n, 0.0) - ra.get(n, 0.0), n) for n in set(ra) | set(rb)), reverse=True)
    delta, name = grown[0]
    if delta < floor:
        return ""
    new = " (new in B)" if name not in ra else ""
    return f" (in its '{name}' range{new}: {delta:+.1f} ms)"


def _straggler_change(a: RunSummary, b: RunSummary, out: RunDiff) -> str:
    """A rank that became (or stopped being) the straggler: waiting shows up on the
    *other* ranks' rows, so the rows alone would name the wrong rank."""
    out.straggler_a, out.straggler_b = a.straggler, b.straggler
    if b.straggler is not None and b.straggler != a.straggler:
        return f" In B, rank {b.straggler} is the straggler (not in A): {b.straggler_verdict}"
    if a.straggler is not None and b.straggler is None:
        return f" Rank {a.straggler}, the straggler in A, is no longer one in B."
    return ""
