"""Q2: who is the straggler, what does it cost, where did its time go, and since when?

**Arrivals at the source.** Every rank writes its own timeline, and its ``NEGOTIATE_<OP>``
slice begins when *it* submitted the tensor, on its own clock mapped onto rank 0's (the
clock offsets the runtime estimates). That submission is the rank's readiness, measured
where it happened: an op's arrivals are the submissions of the same tensor's n-th
negotiation on every rank. (A rank writes only its own mark, so a run missing a rank's
file cannot be compared, and the verdict names the rank.) Horovod files only have one
observer's view, the moment rank 0 *learned* each rank was ready, rounded to a
negotiation cycle and biased towards the observer; they are read that way, and the
result says so (``source``).

**Cost = what the job would save.** Per step and per rank ``s``, the others were blocked
on ``s`` during each op ``s`` reached last, from the others' latest submission at or
before ``s``'s (the rank that arrived just before it, or a later submission of theirs that
shows they were still working) to ``s``'s arrival. The step's cost is the *union* of those
intervals, not their sum: a rank late by ``d`` for every gradient costs ``d`` per step,
whether the step reduces one gradient or fifty, and a rank whose gradients are all late
while the others are still computing their own costs nothing until the others are done.

**No false alarms.** A rank is the straggler only when it was last in at least
:data:`LAST_SHARE` of the steps (from the onset on), both its mean cost per step and its
cost in that share of the steps (the lower quartile) reach the most of
:data:`MIN_COST_MS`, one negotiation cycle (the run's configured cycle time) and
:data:`MIN_STEP_SHARE` of the step, and its mean cost exceeds :data:`NOISE_FACTOR` times
the run's step-to-step noise (the robust spread of the step times or of their changes,
whichever is larger). Consistent *and* material: a rank last by a hair in every step, or
late by a lot in a few, is not named. Otherwise the verdict says there is none and gives
the spread.

**Where the time went.** The straggler's lateness at its first gradient of the step
against its lateness at the end: late from the first gradient on means the time went
before backward produced anything (data loading or forward); on time at first and late at
the end means backward (its later gradients are late).

**Onset.** A fault that starts mid-run shows as a step in the straggler's per-step cost:
the split that best fits two levels (least squares) is the onset when the cost before it
is under half the cost after it and the jump exceeds three times the spread around the
two levels.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hvdprof.analysis.intervals import merge
from hvdprof.analysis.model import OPS, Run
from hvdprof.analysis.steps import count_steps

#: Smallest cost per step worth a verdict (ms).
MIN_COST_MS = 0.5
#: A straggler's cost must be at least this share of the step.
MIN_STEP_SHARE = 0.05
#: ... and more than this many times the step-to-step noise.
NOISE_FACTOR = 2.0
#: A rank is "the" straggler when it was last in at least this share of the steps.
LAST_SHARE = 0.75
#: Lateness at the first gradient at least this share of the lateness at the end: the
#: time went before backward (data loading or forward).
BEFORE_BACKWARD_SHARE = 0.5
#: Steps needed before the first one (warm-up) is left out of the statistics.
MIN_STEPS_TO_SKIP_WARMUP = 5

PHASE_BEFORE_BACKWARD = "before_first_gradient"
PHASE_BACKWARD = "backward"
PHASE_WORDS = {
    PHASE_BEFORE_BACKWARD: "before its first gradient (data loading or forward)",
    PHASE_BACKWARD: "during backward (its later gradients are late)",
}


@dataclass
class RankStraggle:
    rank: int
    last_count: int  # steps (from the onset on) in which it arrived last
    last_share: float  # of those steps
    wait_caused_ms: float  # its cost summed over those steps
    cost_per_step_ms: float  # mean cost per step: what the job would save without it
    last_share_by_op: dict[str, float] = field(default_factory=dict)  # of the ops


@dataclass
class Stragglers:
    """Arrivals per op and step, the ranks' lateness and the verdict."""

    #: "source": each rank's own submission stamps; "observer": one rank's view (Horovod)
    source: str = ""
    observer: int | None = None  # the observing rank when source == "observer"
    ops_with_marks: int = 0
    steps: int = 0  # steps with every rank's arrival
    steps_in_run: int = 0
    first_step: int = 0  # first step counted (the warm-up step is left out)
    onset_step: int | None = None  # first step of the straggler's lateness
    step_ms: float = 0.0  # median step time over the steps counted
    noise_ms: float = 0.0  # step-to-step noise (robust standard deviation)
    threshold_ms: float = 0.0  # the smallest cost that can name a straggler
    cycle_time_ms: float = 0.0  # the run's negotiation cycle (manifest), 0 unknown
    spread_ms: float = 0.0  # median gap between the first and the last rank to finish
    ranks: list[RankStraggle] = field(default_factory=list)  # most waiting caused first
    most_often_last: int | None = None
    straggler: int | None = None
    phase: str | None = None  # PHASE_BEFORE_BACKWARD | PHASE_BACKWARD
    late_at_first_ms: float = 0.0  # the straggler's lateness at its first gradient
    late_at_end_ms: float = 0.0  # ... and at its last one
    # one entry per op: tensor name, step, op, last rank, wait of the others (mean, ms)
    per_op: dict[str, list[Any]] = field(default_factory=dict)
    # one entry per step counted: step, last rank, cost of the last rank (ms), step (ms)
    per_step: dict[str, list[Any]] = field(default_factory=dict)
    verdict: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "observer": self.observer,
            "ops_with_marks": self.ops_with_marks,
            "steps": self.steps,
            "steps_in_run": self.steps_in_run,
            "first_step": self.first_step,
            "onset_step": self.onset_step,
            "step_ms": self.step_ms,
            "noise_ms": self.noise_ms,
            "threshold_ms": self.threshold_ms,
            "cycle_time_ms": self.cycle_time_ms,
            "spread_ms": self.spread_ms,
            "most_often_last": self.most_often_last,
            "straggler": self.straggler,
            "phase": self.phase,
            "late_at_first_ms": self.late_at_first_ms,
            "late_at_end_ms": self.late_at_end_ms,
            "ranks": [
                {
                    "rank": r.rank,
                    "last_count": r.last_count,
                    "last_share": r.last_share,
                    "last_share_by_op": r.last_share_by_op,
                    "wait_caused_ms": r.wait_caused_ms,
                    "cost_per_step_ms": r.cost_per_step_ms,
                }
                for r in self.ranks
            ],
            "per_op": self.per_op,
            "per_step": self.per_step,
            "verdict": self.verdict,
        }


@dataclass
class Arrivals:
    """When each rank arrived at each op: ``t_us[op, rank]`` on rank 0's clock."""

    t_us: np.ndarray  # (ops, ranks)
    step: np.ndarray  # (ops,) the op's step (the tensor's n-th negotiation)
    op: np.ndarray  # (ops,) op code
    tensor: np.ndarray  # (ops,) index into Run.tensors
    source: str
    observer: int | None


def arrivals(run: Run) -> Arrivals | None:
    """Every rank's arrival at every op it shares with all the others.

    Each rank's own readiness mark (its submission, on its own timeline) when every rank
    wrote one; else the view of the lowest rank that recorded marks.
    """
    m, s = run.marks, run.slices
    if not len(m) or not len(s):
        return None
    valid = m.slice >= 0
    n_ranks = max(run.size, int(m.ready_rank.max()) + 1, 1)
    own = valid & (m.observer == m.ready_rank)
    if own.any() and len(np.unique(m.ready_rank[own])) >= n_ranks:
        sel, source, observer = own, "source", None
    else:
        observer = int(m.observer.min())
        sel, source = valid & (m.observer == observer), "observer"
    rank = m.ready_rank[sel].astype(np.int64)
    ts = m.ts_us[sel]
    rows = m.slice[sel]
    tensor = s.tensor[rows].astype(np.int64)
    occ = s.occurrence[rows].astype(np.int64)
    op = s.op[rows].astype(np.int64)
    keep = (tensor >= 0) & (occ >= 0) & (rank < n_ranks)
    rank, ts, tensor, occ, op = rank[keep], ts[keep], tensor[keep], occ[keep], op[keep]
    if not len(ts):
        return None
    key = tensor * (int(occ.max()) + 1) + occ
    keys, index = np.unique(key, return_inverse=True)
    t = np.full((len(keys), n_ranks), np.nan)
    t[index, rank] = ts
    full = ~np.isnan(t).any(axis=1)
    first = np.zeros(len(keys), dtype=np.int64)
    first[index[::-1]] = np.arange(len(index))[::-1]  # a row of each op
    first = first[full]
    return Arrivals(
        t_us=t[full],
        step=occ[first],
        op=op[first],
        tensor=tensor[first],
        source=source,
        observer=observer,
    )


def _blocked_us(t: np.ndarray, s: int) -> float:
    """The others' time blocked on rank ``s`` in one step (union, us); see the module doc."""
    b = t[:, s]
    others = np.delete(t, s, axis=1)
    late = b > others.max(axis=1)
    if not late.any():
        return 0.0
    seen = np.sort(others.ravel())
    b = b[late]
    start = seen[np.searchsorted(seen, b, side="right") - 1]
    starts, ends = merge(start, b)
    return float((ends - starts).sum())


def _lateness_us(t: np.ndarray, s: int) -> tuple[float, float]:
    """Rank ``s``'s lateness at its first gradient of the step and at its last (us)."""
    others = np.delete(t, s, axis=1)
    first = int(np.argmin(others.min(axis=1)))  # the op the others submitted first
    at_first = float(t[first, s] - others[first].max())
    at_end = float(t[:, s].max() - others.max())
    return at_first, at_end


def _robust_std(x: np.ndarray) -> float:
    if len(x) < 2:
        return 0.0
    return float(1.4826 * np.median(np.abs(x - np.median(x))))


def _onset(cost: np.ndarray, min_len: int = 3) -> int:
    """Index where ``cost`` steps up (0: no step up, the fault is there from the start).

    The steps after the onset must be at least a third of them: a short burst at the end
    is a hiccup, not a fault to report.
    """
    n = len(cost)
    tail = max(min_len, n // 3)
    if n < min_len + tail:
        return 0
    c1 = np.concatenate([[0.0], np.cumsum(cost)])
    c2 = np.concatenate([[0.0], np.cumsum(cost * cost)])
    k = np.arange(min_len, n - tail + 1)
    sse_a = c2[k] - c1[k] ** 2 / k
    sse_b = (c2[n] - c2[k]) - (c1[n] - c1[k]) ** 2 / (n - k)
    best = int(k[np.argmin(sse_a + sse_b)])
    before, after = float(np.mean(cost[:best])), float(np.mean(cost[best:]))
    spread = _robust_std(np.concatenate([cost[:best] - before, cost[best:] - after]))
    if after > 0 and before < 0.5 * after and after - before > 3.0 * spread:
        return best
    return 0


def _cycle_time_ms(run: Run) -> float:
    values = [
        float(v)
        for m in run.manifests.values()
        if isinstance(v := (m.get("config") or {}).get("cycle_time_ms"), (int, float))
    ]
    return max(values) if values else 0.0


def _lateness(ms: float) -> str:
    """'late by 2.2 ms', or 'early by 3.1 ms' (never 'late by -3.1 ms')."""
    if ms >= 0.05:
        return f"late by {ms:.1f} ms"
    if ms <= -0.05:
        return f"early by {-ms:.1f} ms"
    return "on time"


def _ranks_without_marks(run: Run, n_ranks: int) -> list[int]:
    """Ranks of the job that marked no readiness of their own (their file is missing)."""
    m = run.marks
    own = (m.slice >= 0) & (m.observer == m.ready_rank)
    seen = set(np.unique(m.ready_rank[own]).tolist())
    return [r for r in range(n_ranks) if r not in seen]


def _rank_list(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"


def find_stragglers(run: Run) -> Stragglers:
    """Who was last, what it cost per step, from which step on, and in which phase."""
    out = Stragglers()
    arr = arrivals(run) if len(run.slices) else None
    if arr is None:
        out.verdict = "No readiness marks in this timeline: stragglers cannot be named."
        return out
    out.source, out.observer = arr.source, arr.observer
    n_ranks = arr.t_us.shape[1]
    if n_ranks < 2 or not len(arr.t_us):
        missing = _ranks_without_marks(run, n_ranks)
        if n_ranks >= 2 and missing:
            out.verdict = (
                f"No readiness marks from {_rank_list(missing)} (no timeline of "
                f"{'its' if len(missing) == 1 else 'their'} own was read): arrivals cannot be "
                "compared, so stragglers cannot be named."
            )
        else:
            out.verdict = "Fewer than two ranks reported readiness: no straggler to name."
        return out
    t = arr.t_us
    n_ops = len(t)
    out.ops_with_marks = n_ops
    order = np.argsort(arr.step, kind="stable")
    t, step, op_code, tensor = t[order], arr.step[order], arr.op[order], arr.tensor[order]
    # per op: the last rank (unique) and the mean wait of the others for it
    t_last = t.max(axis=1)
    unique_last = (t == t_last[:, None]).sum(axis=1) == 1
    last_rank = np.where(unique_last, np.argmax(t, axis=1), -1)
    out.per_op = {
        "tensor": [run.tensors[i] for i in tensor.tolist()],
        "step": step.tolist(),
        "op": [OPS[c] if c >= 0 else "" for c in op_code.tolist()],
        "last_rank": last_rank.tolist(),
        "wait_ms": ((t_last[:, None] - t).sum(axis=1) / (n_ranks - 1) / 1000.0).round(6).tolist(),
    }

    # per step: who finished last, what each rank cost, how long the step took
    steps, bounds = np.unique(step, return_index=True)
    bounds = np.append(bounds, n_ops)
    n_steps = len(steps)
    cost = np.zeros((n_steps, n_ranks))
    at_first = np.zeros((n_steps, n_ranks))
    at_end = np.zeros((n_steps, n_ranks))
    finish = np.zeros((n_steps, n_ranks))
    begin = np.zeros(n_steps)
    for k in range(n_steps):
        tk = t[bounds[k] : bounds[k + 1]]
        finish[k] = tk.max(axis=0)
        begin[k] = float(np.median(tk.min(axis=0)))
        for r in range(n_ranks):
            cost[k, r] = _blocked_us(tk, r)
            at_first[k, r], at_end[k, r] = _lateness_us(tk, r)
    # the rank that finished last (-1 when several finished at the same instant)
    tied = (finish == finish.max(axis=1)[:, None]).sum(axis=1) > 1
    last_of_step = np.where(tied, -1, np.argmax(finish, axis=1))
    step_us = np.append(np.diff(begin), np.nan)
    first = 1 if n_steps >= MIN_STEPS_TO_SKIP_WARMUP else 0
    counted = slice(first, n_steps)
    out.first_step = int(steps[first])
    out.steps = n_steps - first
    run_steps = count_steps(run)
    out.steps_in_run = run_steps
    out.cycle_time_ms = _cycle_time_ms(run)
    durations = step_us[counted]
    durations = durations[np.isfinite(durations)]
    out.step_ms = float(np.median(durations)) / 1000.0 if len(durations) else 0.0
    spread = (finish.max(axis=1) - finish.min(axis=1))[counted]
    out.spread_ms = float(np.median(spread)) / 1000.0 if len(spread) else 0.0
    out.per_step = {
        "step": steps[counted].tolist(),
        "last_rank": last_of_step[counted].tolist(),
        "cost_ms": [
            round(float(cost[k, r]) / 1000.0, 6) if r >= 0 else 0.0
            for k, r in zip(range(first, n_steps), last_of_step[counted].tolist(), strict=True)
        ],
        "step_ms": [round(float(x) / 1000.0, 6) if np.isfinite(x) else None for x in step_us][
            first:
        ],
    }

    # the candidate: the rank that cost the most; from its onset on
    total = cost[counted].sum(axis=0)
    candidate = int(np.argmax(total))
    onset = first + _onset(cost[counted, candidate] / 1000.0)
    window = slice(onset, n_steps)
    n_window = n_steps - onset
    in_window = step_us[window]
    in_window = in_window[np.isfinite(in_window)]
    if len(in_window):
        out.step_ms = float(np.median(in_window)) / 1000.0
    # step-to-step noise over the steps judged: the robust spread of the step times, or of
    # their changes from one step to the next, whichever is larger
    if len(in_window) > 2:
        out.noise_ms = (
            max(_robust_std(in_window), _robust_std(np.diff(in_window)) / np.sqrt(2.0)) / 1000.0
        )
    ranks: list[RankStraggle] = []
    op_codes = [c for c in np.unique(op_code).tolist() if c >= 0]
    for r in range(n_ranks):
        last_steps = int((last_of_step[window] == r).sum())
        by_op = {OPS[c]: float((last_rank[op_code == c] == r).mean()) for c in op_codes}
        ranks.append(
            RankStraggle(
                rank=r,
                last_count=last_steps,
                last_share=last_steps / n_window if n_window else 0.0,
                wait_caused_ms=float(cost[window, r].sum()) / 1000.0,
                cost_per_step_ms=float(cost[window, r].mean()) / 1000.0 if n_window else 0.0,
                last_share_by_op=by_op,
            )
        )
    most_last = max(ranks, key=lambda x: (x.last_share, x.cost_per_step_ms, -x.rank))
    out.most_often_last = most_last.rank
    ranks.sort(key=lambda x: (-x.wait_caused_ms, x.rank))
    out.ranks = ranks
    top = next(x for x in ranks if x.rank == candidate)
    bar = max(MIN_COST_MS, out.cycle_time_ms, MIN_STEP_SHARE * out.step_ms)
    out.threshold_ms = max(bar, NOISE_FACTOR * out.noise_ms)
    # readiness marks on only some steps (Horovod's response cache records them only at a
    # tensor's first negotiation): say so, and judge by the ops and the waiting there
    partial = run_steps > 1 and n_steps < 0.5 * run_steps
    if partial:
        share = top.last_share_by_op.get(_main_op(op_code), 0.0)
        named = share >= LAST_SHARE and top.wait_caused_ms >= MIN_COST_MS
    else:
        # consistent and material: late by the bar in LAST_SHARE of the steps (a few long
        # hiccups of an otherwise punctual rank do not make it the straggler, nor does a
        # rank last by a hair in every step), and on average beyond the noise
        steady = (
            float(np.quantile(cost[window, candidate], 1.0 - LAST_SHARE)) / 1000.0
            if n_window
            else 0.0
        )
        named = (
            top.last_share >= LAST_SHARE
            and min(top.cost_per_step_ms, steady) >= bar
            and top.cost_per_step_ms > NOISE_FACTOR * out.noise_ms
        )
    where = (
        ""
        if out.source == "source"
        else f" (as rank {out.observer} saw each rank's readiness, rounded to its cycles)"
    )
    if named:
        out.straggler = candidate
        out.onset_step = int(steps[onset])
        out.late_at_first_ms = float(np.median(at_first[window, candidate])) / 1000.0
        out.late_at_end_ms = float(np.median(at_end[window, candidate])) / 1000.0
        if out.late_at_end_ms > 0:
            before = out.late_at_first_ms >= BEFORE_BACKWARD_SHARE * out.late_at_end_ms
            out.phase = PHASE_BEFORE_BACKWARD if before else PHASE_BACKWARD
        if partial:
            main_op = _main_op(op_code)
            out.verdict = (
                f"rank {top.rank} is the straggler{where}: it arrived last in "
                f"{top.last_share_by_op.get(main_op, 0.0):.0%} of the {main_op.lower()}s with "
                f"readiness marks ({n_ops} ops in {n_steps} of {run_steps} steps: the "
                f"timeline records readiness only there), costing the others "
                f"{top.wait_caused_ms:.1f} ms of waiting in those steps."
            )
            return out
        since = (
            f"from step {out.onset_step} on (it started mid-run)"
            if onset > first
            else f"of {n_window} steps"
        )
        out.verdict = (
            f"rank {top.rank} is the straggler{where}: it arrived last in {top.last_share:.0%} "
            f"{since}; without its lateness a step would take about "
            f"{top.cost_per_step_ms:.1f} ms less (step {out.step_ms:.1f} ms, step-to-step "
            f"noise {out.noise_ms:.1f} ms)."
        )
        if out.phase is not None:
            out.verdict += (
                f" Its time went {PHASE_WORDS[out.phase]}: "
                f"{_lateness(out.late_at_first_ms)} at its first gradient, "
                f"{_lateness(out.late_at_end_ms)} at its last."
            )
        return out
    m = next(x for x in ranks if x.rank == most_last.rank)
    shares = ", ".join(f"rank {x.rank} {x.last_share:.0%}" for x in sorted(ranks, key=_rank))
    out.verdict = (
        f"No straggler{where}: the rank most often last, rank {m.rank}, was last in "
        f"{m.last_share:.0%} of {n_window} steps ({shares}) and would save "
        f"{m.cost_per_step_ms:.2f} ms per step; naming one takes being last in "
        f"{LAST_SHARE:.0%} of the steps by {out.threshold_ms:.2f} ms or more (the most of "
        f"{MIN_COST_MS:g} ms, one cycle, {MIN_STEP_SHARE:.0%} of the {out.step_ms:.1f} ms "
        f"step and {NOISE_FACTOR:g}x its {out.noise_ms:.2f} ms noise). The ranks finish each step within "
        f"{out.spread_ms:.2f} ms of each other (median)."
    )
    return out


def _rank(x: RankStraggle) -> int:
    return x.rank


def _main_op(op_code: np.ndarray) -> str:
    codes = op_code[op_code >= 0]
    if not len(codes):
        return "op"
    return OPS[int(np.bincount(codes).argmax())]


@dataclass
class RankWork:
    """One rank's step split into its own work and its waiting for the others (ms/step)."""

    rank: int
    steps: int
    step_ms: float  # between its first submissions of consecutive steps
    wait_ms: float  # blocked on later ranks: union over the step, as the straggler's cost
    work_ms: float  # step_ms - wait_ms: its own compute, data loading and runtime work


def own_work(run: Run) -> dict[int, RankWork]:
    """Per rank, mean per step of its own work and of its waiting for the others.

    A rank waits on an op it reached before the last rank from its latest submission
    before the last arrival (it had nothing more to submit) until that arrival; the union
    of those intervals per step is its waiting, the rest of the step its own work. Empty
    when the run has no arrivals of every rank.
    """
    arr = arrivals(run) if len(run.slices) else None
    if arr is None or arr.t_us.shape[1] < 2 or not len(arr.t_us):
        return {}
    n_ranks = arr.t_us.shape[1]
    order = np.argsort(arr.step, kind="stable")
    t, step = arr.t_us[order], arr.step[order]
    steps, bounds = np.unique(step, return_index=True)
    bounds = np.append(bounds, len(t))
    n_steps = len(steps)
    wait = np.zeros((n_steps, n_ranks))
    begin = np.zeros((n_steps, n_ranks))
    for k in range(n_steps):
        tk = t[bounds[k] : bounds[k + 1]]
        begin[k] = tk.min(axis=0)
        t_last = tk.max(axis=1)
        for r in range(n_ranks):
            mine = np.sort(tk[:, r])
            waits = t_last > tk[:, r]
            if not waits.any():
                continue
            ends = t_last[waits]
            starts = mine[np.searchsorted(mine, ends, side="right") - 1]
            s0, s1 = merge(starts, ends)
            wait[k, r] = float((s1 - s0).sum())
    first = 1 if n_steps >= MIN_STEPS_TO_SKIP_WARMUP else 0
    if n_steps - first < 2:
        return {}
    spans = np.diff(begin[first:], axis=0)  # step k: from its start to step k+1's
    waits = wait[first:-1]
    out = {}
    for r in range(n_ranks):
        step_ms = float(spans[:, r].mean()) / 1000.0
        wait_ms = float(waits[:, r].mean()) / 1000.0
        out[r] = RankWork(r, len(spans), step_ms, wait_ms, max(step_ms - wait_ms, 0.0))
    return out
