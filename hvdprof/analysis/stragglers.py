"""Q2: who held the job, by how much, where did their time go, and since when?

**Arrivals at the source.** Every rank writes its own timeline, and its ``NEGOTIATE_<OP>``
slice begins when *it* submitted the tensor, on its own clock mapped onto rank 0's (the
clock offsets the runtime estimates). That submission is the rank's readiness, measured
where it happened: an op's arrivals are the submissions of the same tensor's n-th
negotiation on every rank. (A rank writes only its own mark, so a run missing a rank's
file cannot be compared, and the verdict names the rank.) Horovod files only have one
observer's view, the moment rank 0 *learned* each rank was ready, rounded to a
negotiation cycle and biased towards the observer; they are read that way, and the
result says so (``source``).

**torch.profiler traces.** Each traced rank's own file, so the traced ranks are compared:
a trace of some of a job's ranks (2 of 128) says so once, in words (a rank without a
trace is unknown, not late), and never lists the others. On NCCL a rank's arrival at a
collective is its kernel's start on the run's clock (never before its launch: on one
rank's clock a kernel starts after it is enqueued): the CPU launch only enqueues the
collective (it returns at once) and the GPU stream comes to it after the kernels before
it, so a rank whose CPU was late (data loading) and one whose GPU was (slower kernels)
both start it late; the kernel then spins inside NCCL until every rank's has started, so
the late rank's peers have the long kernels and all of them end together. That end is
how a collective is matched across ranks (``kineto_format._pairs_by_end``: a sampled trace
or another thread shifts the lanes) and how clocks without ``baseTimeNanoseconds`` are
aligned; the others wait from their kernel's start to the late rank's, which is the hold
below. Without GPU kernels (Gloo on CPU) the arrival is the launch, counted from the
rank's own ``ProfilerStep`` start (a rank woken last by the previous step's collective is
not taken for a straggler). A trace holds a few profiled steps: with fewer than
:data:`MIN_STEPS`, a rank that held the others by the bar in every one of them is named
for those steps, and the verdict says how few they were.

**One model: who held each step, and by how much.** Per step and rank ``r``, its *hold*
is the time the pack (the other ranks' median arrival at each op) was blocked on ``r``:
the union over the ops ``r`` reached after the pack of the intervals from the pack's
latest submission at or before ``r``'s to ``r``'s arrival (a union, not a sum: a rank late
by ``d`` for every gradient holds the job ``d``, whether the step reduces one gradient or
fifty). Its *cost* is as much of that as its own work explains (below). A rank *held* a
step when its cost there reached the bar below, what the ranks not named reach in 95% of
the steps, and a third of its own mean cost in the steps it held (so a busy machine's
noise, the culprit's included, is not counted as holding). Persistent,
intermittent and several culprits are then cases of one model: the share of steps a rank
held, its hold when it did, and its mean hold per step with a 95% interval (a moving-block
bootstrap over the steps, since neighbouring steps correlate; seeded, so deterministic).
The named ranks' joint cost is what the job would save if their code kept pace with the
pack: the same union, of the named ranks' latest arrival against the rest's median, up to
the excess of their slowest own work over the rest's median, less what the job would pay
even then: the rest's spread (their latest arrival against their median) and, on a busy
machine, the culprits' own noise (their cost in the steps their fault spared).

**The user's code, not hvdprof's protocol.** A rank can be late because its own work
(data loading, forward, backward, its optimizer step) took longer, or because the runtime
released it later from the previous step's last collective (the coordinator's extra work,
the order in which ranks learn a response), or because its training thread, woken, waited
for a CPU (on a busy machine that wake-up takes milliseconds, and an oversubscribed rank
pays it step after step). Each rank's *own work* in a step is measured on its own clock,
from the moment its training thread got control back after the previous step's last
collective (``COUNTER_WAITED``; older timelines and other formats: from that collective's
end) to its last submission of this one; its *excess* is that minus the others' mean. Only
the excess can name a rank: a rank that is late with no excess was held back by the
runtime or the machine, and the verdict says so instead of blaming its code.

**Decisions that hold on a busy machine.** A rank is named when its mean excess per step
is above the bar with confidence: the one-sided p-value of "mean excess at or below the
bar" (from the bootstrap's standard error), Holm-corrected over the ranks tested at
:data:`ALPHA`, and its mean hold is at least the bar. The bar is absolute and relative: the most of :data:`MIN_COST_MS`, one
negotiation cycle (only where waiting ranks negotiated at the cycle's pace: Horovod, and
hvdprof timelines whose manifest lacks ``negotiates_on_wait``) and :data:`MIN_STEP_SHARE`
of the step. The uncertainty that decides is
that of a mean over ``n`` steps, not the noise of one step, so a loaded machine's noisy
steps widen the interval rather than hide or invent a culprit; with fewer than
:data:`MIN_STEPS` steps, or an excess whose interval reaches below the bar, the verdict
says the evidence is too thin. A rank above the bar on average but not named is explained
in plain words: the confidence that Holm's correction asks for that many ranks (99.4% with
8) beside the one it had, or, for an excess that is sure, how little it held the others.

**Slow in every step, last in some.** On ranks that share fewer cores than there are of
them, a rank that waits every step (sleeps, reads data) frees a core for the others, so it
holds the job only where it still finishes last (21% of the steps for a rank 20 ms late
in every step of 8 ranks on 2 loaded cores). Where a named rank's own work exceeded the
others' median in the steps it did not hold too (:data:`SLOW_SHARE_OF_HOLD`), the verdict
says it was slow in every step and last in some, so a persistent fault does not read as
an intermittent one.

**Where the time went.** The top culprit's lateness at its first gradient of the step
against its lateness at the end: late from the first gradient on means the time went
before backward produced anything (data loading or forward); on time at first and late at
the end means backward (its later gradients are late).

**Onset.** A fault that starts mid-run shows as a step in the top candidate's per-step
hold: the split that best fits two levels (least squares) is the onset when the median
hold before it is under half the median after it and the jump exceeds three standard
errors of the two medians (medians: an intermittent fault has no onset).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import msgspec
import numpy as np

from hvdprof.analysis.bootstrap import block_bootstrap_means
from hvdprof.analysis.intervals import merge
from hvdprof.analysis.registry import Analysis
from hvdprof.analysis.result import Result
from hvdprof.analysis.steps import count_steps, typical_step_ms, warmup_steps
from hvdprof.common import activities as act
from hvdprof.trace.gpu import kernel_arrivals
from hvdprof.trace.model import OPS, PHASE_OP, Run

#: Smallest cost per step worth a verdict (ms).
MIN_COST_MS = 0.5
#: A culprit's cost must be at least this share of the step.
MIN_STEP_SHARE = 0.1
#: Family-wise error rate of the per-rank tests (Holm over the ranks): with 2 ranks, a
#: rank is named when its 95% interval's lower end is above the bar.
ALPHA = 0.05
#: Fewer steps than this (after the warm-up) are too thin a basis to name anyone ...
MIN_STEPS = 3
#: ... and a verdict on fewer than this many says its basis is thin.
FEW_STEPS = 10
#: With readiness marks in only some steps (Horovod's response cache), a rank last in at
#: least this share of the main op's marks is named.
PARTIAL_LAST_SHARE = 0.75
#: Lateness at the first gradient at least this share of the lateness at the end: the
#: time went before backward (data loading or forward).
BEFORE_BACKWARD_SHARE = 0.5
#: A named rank is *slow in every step* when, in the steps it did not hold the job, its own
#: work still exceeded the others' median by at least this share of its excess in the
#: steps it held (median of each). Measured: an intermittent fault's quiet steps 0.004 of
#: its slow ones (0.15 against 41 ms, tests/data/intermittent-2-loaded); a rank 20 ms
#: late in every step of 8 ranks on 2 cores, 0.30 beside two spin loops (8.1 against
#: 26.7 ms) and 0.51 without them ...
SLOW_SHARE_OF_HOLD = 0.2
#: ... and it held at most 1 - this share of the steps: then the verdict says both (on
#: 8 ranks sharing 2 cores a rank 20 ms late in every step held the job in 21% of them: a
#: rank that sleeps frees a CPU for the others).
SLOW_BEYOND_HELD = 0.25

#: Arrivals in torch.profiler traces: each rank's NCCL kernel's start (when its GPU reached
#: the collective), or, without GPU kernels (Gloo), its launch timed from its own step's
#: start. See the module doc.
SOURCE_KERNELS = "nccl_kernels"
SOURCE_LAUNCHES = "launches"
#: How the verdict says where the arrivals come from (after "rank 1 is the straggler").
SOURCE_WHERE = {
    SOURCE_KERNELS: " (by its NCCL kernels' starts: when its GPU reached each collective)",
    SOURCE_LAUNCHES: " (by when it launched each collective, timed from its step's start)",
}
#: ... after "ranks 1 and 2 are the stragglers" ...
SOURCE_WHERE_PLURAL = {
    SOURCE_KERNELS: " (by their NCCL kernels' starts: when their GPUs reached each collective)",
    SOURCE_LAUNCHES: " (by when they launched each collective, timed from their steps' start)",
}
#: ... and after "No straggler" (no rank is meant).
SOURCE_WHERE_NONE = {
    SOURCE_KERNELS: " (by the NCCL kernels' starts: when each GPU reached each collective)",
    SOURCE_LAUNCHES: " (by when each rank launched each collective, from its step's start)",
}

#: What torch.profiler traces whose collectives could not be matched across ranks can say
#: (one sentence, no list of ranks: a 128-rank job's list said nothing).
KINETO_ARRIVALS = (
    "No collective in these torch.profiler traces could be matched across the traced "
    "ranks, so arrivals cannot be compared and no straggler can be named from them; the "
    "time breakdown still shows each rank's communication time."
)

#: The verdict when every collective with readiness marks ran in a process set (given the
#: ``process_sets`` answer): the job-wide answer defers to each set's, told after it.
JUDGED_IN_SETS = (
    "Every collective with readiness marks ran in a process set: each set's "
    "straggler is judged among its members below."
)


class SetsAnswer(Protocol):
    """The ``process_sets`` analysis's answer, as much of it as this one reads (that
    module imports this one: its answer is passed in, never imported)."""

    @property
    def sets(self) -> Sequence[object]: ...


#: Missing ranks are named up to this many; past it, counted (never a list of 127).
MAX_LISTED = 8

PHASE_BEFORE_BACKWARD = "before_first_gradient"
PHASE_BACKWARD = "backward"
PHASE_WORDS = {
    PHASE_BEFORE_BACKWARD: "before its first gradient (data loading or forward)",
    PHASE_BACKWARD: "during backward (its later gradients are late)",
}
#: ... where the arrivals are NCCL kernels' starts (a collective need not be a gradient's)
KERNEL_PHASE_WORDS = {
    PHASE_BEFORE_BACKWARD: "before the step's first collective (data loading, forward, or "
    "the kernels before it)",
    PHASE_BACKWARD: "between the step's collectives (its later ones are late)",
}
GROUP_PHASE_WORDS = {
    PHASE_BEFORE_BACKWARD: "before their first gradient (data loading or forward)",
    PHASE_BACKWARD: "during backward (their later gradients are late)",
}


class RankStraggle(Result):
    rank: int
    host: str | None = None
    last_count: int = 0  # steps (from the onset on) in which it finished last
    last_share: float = 0.0  # of those steps
    held_count: int = 0  # steps in which its cost reached the bar
    held_share: float = 0.0  # of those steps
    held_ms: float = 0.0  # its mean cost in the steps it held
    wait_caused_ms: float = 0.0  # its cost summed over the steps judged
    cost_per_step_ms: float = 0.0  # mean cost per step: its hold, as far as its own work
    lateness_ms: float = 0.0  # mean hold per step, the runtime's part included
    cost_low_ms: float = 0.0  # 95% interval of the mean cost (block bootstrap)
    cost_high_ms: float = 0.0
    own_excess_ms: float = 0.0  # mean excess of its own work over the others' (ms/step)
    own_excess_low_ms: float = 0.0  # its 95% interval
    own_excess_high_ms: float = 0.0
    release_late_ms: float = 0.0  # mean lateness of its release by the runtime (ms/step)
    p_value: float = 1.0  # one-sided: mean excess at or below the bar
    #: median excess of its own work over the others' median in the steps it held, and in
    #: those it did not (a persistent fault is slow in both; an intermittent one's quiet
    #: steps are not): ms, 0 where unknown
    excess_held_ms: float = 0.0
    excess_not_held_ms: float = 0.0
    named: bool = False
    last_share_by_op: dict[str, float] = msgspec.field(default_factory=dict)  # of the ops


class Stragglers(Result, dict=True):
    """Arrivals per op and step, who held each step, and the verdict."""

    #: the bar's cycle term (0: a rank's wait starts a cycle at once); the verdict's
    #: working, not in the JSON (``dict=True`` lets an instance set it)
    pace_ms: ClassVar[float] = 0.0

    #: "source": each rank's own submission stamps; "observer": one rank's view (Horovod)
    source: str = ""
    observer: int | None = None  # the observing rank when source == "observer"
    ops_with_marks: int = 0
    steps: int = 0  # steps with every rank's arrival
    steps_in_run: int = 0
    first_step: int = 0  # first step counted (the warm-up step is left out)
    onset_step: int | None = None  # first step of the culprits' lateness
    steps_judged: int = 0  # steps from the onset on
    step_ms: float = 0.0  # median step time over the steps judged
    noise_ms: float = 0.0  # step-to-step noise (robust standard deviation)
    threshold_ms: float = 0.0  # the bar: the smallest cost per step that can name a rank
    held_floor_ms: float = 0.0  # a step is held when a cost reaches this (bar and noise)
    noise_floor_ms: float = 0.0  # what the job pays even with the culprits at pace: taken off
    cycle_time_ms: float = 0.0  # the run's negotiation cycle (manifest), 0 unknown
    spread_ms: float = 0.0  # median gap between the first and the last rank to finish
    own_work_known: bool = False  # each rank's own work measured (else lateness decides)
    ranks: list[RankStraggle] = msgspec.field(default_factory=list)  # most hold first
    most_often_last: int | None = None
    straggler: int | None = None  # the culprit that held the job most (None: none named)
    culprits: list[int] = msgspec.field(default_factory=list)  # every rank named, most hold first
    cost_ms: float = 0.0  # what the job would save if the culprits' code kept pace (ms/step)
    lateness_ms: float = 0.0  # their whole lateness per step: cost + the runtime's part
    cost_low_ms: float = 0.0  # 95% interval (block bootstrap)
    cost_high_ms: float = 0.0
    held_share: float = 0.0  # share of the steps judged in which the culprits held the job
    thin: bool = False  # too few steps, or an interval too wide, to decide
    phase: str | None = None  # PHASE_BEFORE_BACKWARD | PHASE_BACKWARD
    late_at_first_ms: float = 0.0  # the top culprit's lateness at its first gradient
    late_at_end_ms: float = 0.0  # ... and at its last one
    # one entry per op: tensor name, step, op, last rank, wait of the others (mean, ms)
    per_op: dict[str, list[Any]] = msgspec.field(default_factory=dict)
    # one entry per step counted: step, last rank, cost of the last rank (ms), step (ms)
    per_step: dict[str, list[Any]] = msgspec.field(default_factory=dict)
    verdict: str | None = None


@dataclass
class Arrivals:
    """When each rank arrived at each op: ``t_us[op, column]`` on rank 0's clock."""

    t_us: np.ndarray  # (ops, columns)
    step: np.ndarray  # (ops,) the op's step (the tensor's n-th negotiation)
    op: np.ndarray  # (ops,) op code
    tensor: np.ndarray  # (ops,) index into Run.tensors
    source: str
    observer: int | None
    #: the rank of each column (None: column r is rank r). torch.profiler traces of some
    #: ranks of a job (2 of 128) have a column per traced rank, never one per absent rank
    ranks: list[int] | None = None

    def rank_of(self, column: int) -> int:
        return self.ranks[column] if self.ranks is not None else column


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
    columns: list[int] | None = None
    if run.capabilities.readiness_matched_across_files:
        # every rank's own trace, its marks filed under the lowest rank's collectives: the
        # traced ranks are compared, whatever the job's size
        observer = int(m.observer.min())
        sel = valid & (m.observer == observer)
        source = SOURCE_KERNELS if kernel_arrivals(run) else SOURCE_LAUNCHES
        traced = np.unique(m.ready_rank[sel]).astype(np.int64)
        n_ranks = len(traced)
        if not np.array_equal(traced, np.arange(n_ranks)):
            columns = traced.tolist()
    elif own.any() and len(np.unique(m.ready_rank[own])) >= n_ranks:
        sel, source, observer = own, "source", None
    else:
        observer = int(m.observer.min())
        sel, source = valid & (m.observer == observer), "observer"
    rank = m.ready_rank[sel].astype(np.int64)
    if columns is not None:
        rank = np.searchsorted(np.array(columns), rank)
    ts = m.ts_us[sel]
    rows = m.slice[sel]
    tensor = s.tensor[rows].astype(np.int64)
    occ = s.occurrence[rows].astype(np.int64)
    op = s.op[rows].astype(np.int64)
    keep = (tensor >= 0) & (occ >= 0) & (rank < n_ranks)
    if act.SHUTDOWN_BARRIER in run.tensors:  # the runtime's own wait at shutdown
        keep &= tensor != run.tensors.index(act.SHUTDOWN_BARRIER)
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
        ranks=columns,
    )


def _blocked_us(b: np.ndarray, others: np.ndarray) -> float:
    """Time (us) the ``others`` (ops, m) were blocked on arrivals ``b`` (ops,) in one step:
    the union, over the ops ``b`` reached after all of them, of the intervals from their
    latest submission at or before ``b``'s to ``b``'s (see the module doc)."""
    late = b > others.max(axis=1)
    if not late.any():
        return 0.0
    seen = np.sort(others.ravel())
    b = b[late]
    start = seen[np.searchsorted(seen, b, side="right") - 1]
    starts, ends = merge(start, b)
    return float((ends - starts).sum())


def _hold_us(t: np.ndarray, r: int) -> float:
    """Rank ``r``'s hold on the pack (the others' median arrival per op) in one step."""
    pack = np.median(np.delete(t, r, axis=1), axis=1)
    return _blocked_us(t[:, r], pack[:, None])


def _group_cost_us(t: np.ndarray, group: list[int]) -> float:
    """The hold of ``group`` on the pack (the rest's median arrival per op): its latest
    arrival per op against that, as :func:`_hold_us` for one rank (us)."""
    pack = np.median(np.delete(t, group, axis=1), axis=1)
    return _blocked_us(t[:, group].max(axis=1), pack[:, None])


def _lateness_us(t: np.ndarray, s: int) -> tuple[float, float]:
    """Rank ``s``'s lateness at its first gradient of the step and at its last (us)."""
    others = np.delete(t, s, axis=1)
    first = int(np.argmin(others.min(axis=1)))  # the op the others submitted first
    at_first = float(t[first, s] - others[first].max())
    at_end = float(t[:, s].max() - others.max())
    return at_first, at_end


def _group_lateness_us(t: np.ndarray, group: list[int]) -> tuple[float, float]:
    """``_lateness_us`` of a group: its latest arrival per op against the rest's."""
    rest = np.delete(t, group, axis=1)
    merged = np.column_stack([t[:, group].max(axis=1), rest])
    return _lateness_us(merged, 0)


def held_cut(cost: np.ndarray, floor: float) -> float:
    """The cost (ms) from which a named rank *held* a step: the floor, or a third of its
    mean cost in the steps it held, whichever is more (to a fixed point).

    On a busy machine a culprit is also late by its ordinary noise in the steps its fault
    spared: a rank slowed by 40 ms in a quarter of 199 steps was late by a median 3 ms in
    the others and passed the floor in 78 steps, not 43, so "held the job in 39%" was
    really 22%. A third of the held steps' mean separates those modes and keeps every
    step of a persistent fault (its steps lie around that mean, far above a third of it).
    """
    cut = floor
    for _ in range(20):
        above = cost[cost >= cut]
        if not len(above):
            return cut
        nxt = max(floor, float(above.mean()) / 3.0)
        if nxt <= cut:
            return cut
        cut = nxt
    return cut


def _robust_std(x: np.ndarray) -> float:
    if len(x) < 2:
        return 0.0
    return float(1.4826 * np.median(np.abs(x - np.median(x))))


def _onset(cost: np.ndarray, min_len: int = 3, min_before: int = 5) -> int:
    """Index where ``cost`` (ms) steps up (0: no step up, the fault is there from the start).

    "It started mid-run" says the rank held the job far less before: nine in ten of the
    steps before the onset must cost less than half the median after it (a median alone
    let a loaded CI run whose fault ran from step 0, partly masked in its first steps,
    split off 3 low steps and 2 faulty ones; three in four let a loaded run's 25%-of-steps
    fault, 36 ms in 20% of the steps before step 113, be reported as starting there when
    the other rank sped up and its ordinary hold rose from ~0 to ~16 ms: by the ranks' own
    clocks the fault had not changed). The steps before must be at least
    ``min_before`` and a tenth (a 500-step run's first 7 steps were its warm-up), those
    after at least a third (a short burst at the end is a hiccup, not a fault to report).
    A fault in some steps only (intermittent) has no onset, and the mean must say so too:
    the rank's mean hold before the onset must be under half its mean after (a loaded CI
    run's 25%-of-steps fault, whose ordinary lateness rose from ~0 to ~3 ms after step 134,
    passed the medians' test and was reported as starting there).
    """
    n = len(cost)
    tail = max(min_len, n // 3)
    head = max(min_before, n // 10)
    if n < head + tail:
        return 0
    c1 = np.concatenate([[0.0], np.cumsum(cost)])
    c2 = np.concatenate([[0.0], np.cumsum(cost * cost)])
    k = np.arange(head, n - tail + 1)
    sse_a = c2[k] - c1[k] ** 2 / k
    sse_b = (c2[n] - c2[k]) - (c1[n] - c1[k]) ** 2 / (n - k)
    best = int(k[np.argmin(sse_a + sse_b)])
    before, after = float(np.median(cost[:best])), float(np.median(cost[best:]))
    quiet = float(np.quantile(cost[:best], 0.9)) < 0.5 * after
    quiet = quiet and float(np.mean(cost[:best])) < 0.5 * float(np.mean(cost[best:]))
    # the step up against the uncertainty of the two medians (each segment's robust
    # spread over its length; a median's error is 1.25 times a mean's), not against one
    # step's spread: a loaded CI run's 100 ms fault from step 8 of 24, held 89 ms in each
    # step after, failed the one-step test and was reported as there from the start
    se_b = _robust_std(cost[:best] - before) ** 2 / best
    se_a = _robust_std(cost[best:] - after) ** 2 / (n - best)
    if quiet and after - before > 3.0 * 1.25 * math.sqrt(se_b + se_a):
        return best
    return 0


def _p_above(mean: np.ndarray, sd: np.ndarray, bar: float) -> np.ndarray:
    """One-sided p-values of "the true mean is at or below ``bar``", from each mean and
    its bootstrap standard error (normal approximation: p-values far below 1/samples,
    which Holm needs with many ranks)."""
    z = (mean - bar) / np.maximum(sd, 1e-12)
    z = np.where(sd > 0, z, np.where(mean > bar, np.inf, -np.inf))
    return np.array([0.5 * math.erfc(float(x) / math.sqrt(2.0)) for x in z])


def holm(p: np.ndarray, alpha: float = ALPHA) -> np.ndarray:
    """Which of the hypotheses with p-values ``p`` Holm's step-down procedure rejects."""
    order = np.argsort(p, kind="stable")
    reject = np.zeros(len(p), dtype=bool)
    for i, j in enumerate(order):
        if p[j] > alpha / (len(p) - i):
            break
        reject[j] = True
    return reject


def _cycle_time_ms(run: Run) -> float:
    values = [v for m in run.manifests.values() if (v := m.config.cycle_time_ms) is not None]
    return max(values) if values else 0.0


def _pace_ms(run: Run) -> float:
    """The bar's cycle term: a rank late by less than a cycle held nobody where waiting
    ranks negotiated at the cycle's pace (Horovod, hvdprof before its manifests said
    ``negotiates_on_wait``); where a wait starts a cycle at once, lateness is not rounded."""
    manifests = list(run.manifests.values())
    if manifests and all(m.negotiates_on_wait for m in manifests):
        return 0.0
    return _cycle_time_ms(run)


def _lateness(ms: float) -> str:
    """'late by 2.2 ms', or 'early by 3.1 ms' (never 'late by -3.1 ms')."""
    if ms >= 0.05:
        return f"late by {ms:.1f} ms"
    if ms <= -0.05:
        return f"early by {-ms:.1f} ms"
    return "on time"


def _ms_pair(a: float, b: float) -> tuple[str, str]:
    """``a`` and ``b`` in ms with enough decimals that different values read differently
    (never "0.50 ms is under 0.50 ms")."""
    for digits in (1, 2, 3):
        x, y = f"{a:.{digits}f}", f"{b:.{digits}f}"
        if x != y or a == b:
            return x, y
    return f"{a:.3f}", f"{b:.3f}"


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


def _releases_us(
    run: Run, n_ranks: int, n_occ: int, columns: list[int] | None = None
) -> np.ndarray:
    """``[occurrence, column]``: when the rank's last collective of that step ended on its
    clock (NaN where it recorded none): the moment the runtime released it. ``columns``:
    the rank of each column (None: column r is rank r)."""
    s = run.slices
    out = np.full((n_occ, n_ranks), -np.inf)
    col = s.rank.astype(np.int64)
    if columns is not None:
        col = np.searchsorted(np.array(columns), col)
        col = np.where(np.isin(s.rank, columns), col, -1)
    sel = (s.phase == PHASE_OP) & (s.occurrence >= 0) & (s.occurrence < n_occ)
    sel &= (col >= 0) & (col < n_ranks)
    np.maximum.at(out, (s.occurrence[sel], col[sel]), s.end_us[sel])
    out[~np.isfinite(out)] = np.nan
    return out


def _resumed_us(
    run: Run, n_ranks: int, after: np.ndarray, until: np.ndarray, columns: list[int] | None = None
) -> np.ndarray:
    """``[step, rank]``: the first moment in ``(after, until]`` that the rank's training
    thread got control back from waiting on ops (:data:`~hvdprof.common.activities.COUNTER_WAITED`),
    NaN where it noted none (older timelines, other formats, a step it never waited in)."""
    out = np.full(after.shape, np.nan)
    waited = run.counters.get(act.COUNTER_WAITED)
    if waited is None:
        return out
    ranks, ts, _ = waited
    for r in range(n_ranks):
        x = np.sort(ts[ranks == (columns[r] if columns is not None else r)])
        if not len(x):
            continue
        i = np.searchsorted(x, after[:, r], side="right")  # NaN: past the end
        found = i < len(x)
        first = np.where(found, x[np.minimum(i, len(x) - 1)], np.nan)
        found &= first <= until[:, r]
        out[found, r] = first[found]
    return out


def _host_words(ranks: list[int], hosts: dict[int, str]) -> str:
    """'ranks 1 and 2, both on host b', or 'ranks 1 (host a) and 5 (host b)', or '' hosts
    unknown or all ranks of the run on one host (nothing to tell)."""
    if any(r not in hosts for r in ranks) or len(set(hosts.values())) < 2:
        return _rank_list(ranks)
    on = {hosts[r] for r in ranks}
    if len(on) == 1:
        both = "both" if len(ranks) == 2 else "all"
        host = next(iter(on))
        return _rank_list(ranks) + (
            f", {both} on host {host}," if len(ranks) > 1 else f" (host {host})"
        )
    by_host: dict[str, list[int]] = {}
    for r in ranks:
        by_host.setdefault(hosts[r], []).append(r)
    return "; ".join(f"{_rank_list(rs)} on host {h}" for h, rs in by_host.items())


def find_stragglers(run: Run, *, process_sets: SetsAnswer | None = None) -> Stragglers:
    """Who held the job, what it cost per step, from which step on, and in which phase.

    torch.profiler traces of some of a job's ranks (2 of 128) compare the traced ranks and
    say so once, in words: the others' arrivals are unknown, not late. Given the run's
    ``process_sets`` (its analysis, which ``analyze()`` computes first: this one declares
    it needs it), an answer with no job-wide op to judge defers to each set's."""
    out = _find_stragglers(run)
    _subset_traced(run, out)
    if process_sets is not None and process_sets.sets and not out.ops_with_marks:
        out.verdict = JUDGED_IN_SETS
    return out


def _subset_traced(run: Run, out: Stragglers) -> None:
    """A torch.profiler trace of some of the job's ranks: the verdict says only they were
    compared."""
    traced = len(run.ranks)
    if run.capabilities.ranks_may_be_a_subset and 0 < traced < run.size and out.verdict:
        v = out.verdict
        if v.startswith("No "):
            v = "no " + v[3:]
        out.verdict = (
            f"{traced} of the job's {run.size} ranks were traced, so only "
            f"{'they are' if traced > 1 else 'it is'} compared: {v}"
        )


def _find_stragglers(run: Run) -> Stragglers:
    """The stages: the arrivals per op and step (:func:`_step_table`), the decision over
    every step counted (:func:`_decide`), each rank's cost from the onset on
    (:func:`_rank_straggles`), then the verdict."""
    out = Stragglers()
    arr = arrivals(run) if len(run.slices) else None
    n_ranks = arr.t_us.shape[1] if arr is not None else 0
    matched = run.capabilities.readiness_matched_across_files
    if matched and len(run.ranks) >= 2 and (arr is None or not len(arr.t_us)):
        out.verdict = KINETO_ARRIVALS
        return out
    if arr is None:
        out.verdict = "No readiness marks in this timeline: stragglers cannot be named."
        return out
    out.source, out.observer = arr.source, arr.observer
    if n_ranks < 2 or not len(arr.t_us):
        out.verdict = _no_comparison_verdict(run, n_ranks)
        return out
    s = _step_table(run, arr, out)
    d = _decide(run, out, s)
    ranks = _rank_straggles(run, arr, out, s, d)
    out.ranks = ranks
    if out.source in SOURCE_WHERE:
        where = SOURCE_WHERE[out.source]
    elif out.source == "source":
        where = ""
    else:
        where = f" (as rank {out.observer} saw each rank's readiness, rounded to its cycles)"
    # readiness marks on only some steps (Horovod's response cache records them only at a
    # tensor's first negotiation): say so, and judge by the ops and the waiting there
    n_steps = len(s.steps)
    if out.steps_in_run > 1 and n_steps < 0.5 * out.steps_in_run:
        _partial_verdict(
            out,
            ranks,
            arr.rank_of(d.candidate),
            s.op_code,
            len(s.t),
            n_steps,
            out.steps_in_run,
            where,
        )
        return out
    named = [x for x in ranks if x.named]
    if named:
        _name_culprits(run, arr, out, s, d, named, where)
        return out
    out.verdict = _no_culprit_verdict(
        out, ranks, d.n_all, d.bar_all, SOURCE_WHERE_NONE.get(out.source, where)
    )
    return out


def _no_comparison_verdict(run: Run, n_ranks: int) -> str:
    """Why arrivals cannot be compared: fewer than two ranks, or ranks with no marks."""
    missing = _ranks_without_marks(run, n_ranks)
    if n_ranks >= 2 and len(missing) > MAX_LISTED:
        return (
            f"No readiness marks from {len(missing)} of the job's {n_ranks} ranks (no "
            "timeline of their own was read): arrivals cannot be compared, so "
            "stragglers cannot be named."
        )
    if n_ranks >= 2 and missing:
        return (
            f"No readiness marks from {_rank_list(missing)} (no timeline of "
            f"{'its' if len(missing) == 1 else 'their'} own was read): arrivals cannot be "
            "compared, so stragglers cannot be named."
        )
    return "Fewer than two ranks reported readiness: no straggler to name."


@dataclass
class _StepTable:
    """What the stages of :func:`_find_stragglers` share. Ops with readiness marks sorted
    by step; per step (rows) and rank column: each rank's hold on the pack, lateness,
    finish and own work (microseconds)."""

    t: np.ndarray  # [op, column]: arrival
    op_code: np.ndarray  # per op
    last_rank: np.ndarray  # per op: the column that arrived last (-1: a tie)
    steps: np.ndarray  # the step numbers
    bounds: np.ndarray  # the ops of row k: t[bounds[k] : bounds[k + 1]]
    hold: np.ndarray
    at_first: np.ndarray
    at_end: np.ndarray
    finish: np.ndarray
    work: np.ndarray  # from the release (or the wake-up) to the last submission
    excess: np.ndarray  # own work over the others' mean (the hold's, when work is unknown)
    release_late: np.ndarray
    last_of_step: np.ndarray  # per row: the column that finished last (-1: a tie)
    step_us: np.ndarray  # per row: to the next step's begin (NaN: the last)
    first: int  # the first row counted (the first step is warm-up when there are enough)
    known: bool = False  # own work known (every rank's collectives in every step counted)

    @property
    def counted(self) -> slice:
        return slice(self.first, len(self.steps))


def _step_table(run: Run, arr: Arrivals, out: Stragglers) -> _StepTable:
    """Per op and per step: who arrived last, each rank's hold, lateness, finish and own
    work; fills the per-op and per-step tables of ``out``."""
    n_ranks = arr.t_us.shape[1]
    n_ops = len(arr.t_us)
    out.ops_with_marks = n_ops
    order = np.argsort(arr.step, kind="stable")
    t, step, op_code, tensor = arr.t_us[order], arr.step[order], arr.op[order], arr.tensor[order]
    # per op: the last rank (unique) and the mean wait of the others for it
    t_last = t.max(axis=1)
    unique_last = (t == t_last[:, None]).sum(axis=1) == 1
    last_rank = np.where(unique_last, np.argmax(t, axis=1), -1)
    job_rank = np.array([arr.rank_of(c) for c in range(n_ranks)] + [-1])  # [-1]: -1
    out.per_op = {
        "tensor": [run.tensors[i] for i in tensor.tolist()],
        "step": step.tolist(),
        "op": [OPS[c] if c >= 0 else "" for c in op_code.tolist()],
        "last_rank": job_rank[last_rank].tolist(),
        "wait_ms": ((t_last[:, None] - t).sum(axis=1) / (n_ranks - 1) / 1000.0).round(6).tolist(),
    }

    # per step: each rank's hold, finish, own work; who finished last; the step's length
    steps, bounds = np.unique(step, return_index=True)
    bounds = np.append(bounds, n_ops)
    n_steps = len(steps)
    hold = np.zeros((n_steps, n_ranks))
    at_first = np.zeros((n_steps, n_ranks))
    at_end = np.zeros((n_steps, n_ranks))
    finish = np.zeros((n_steps, n_ranks))
    begin = np.zeros(n_steps)
    for k in range(n_steps):
        tk = t[bounds[k] : bounds[k + 1]]
        finish[k] = tk.max(axis=0)
        begin[k] = float(np.median(tk.min(axis=0)))
        for r in range(n_ranks):
            hold[k, r] = _hold_us(tk, r)
            at_first[k, r], at_end[k, r] = _lateness_us(tk, r)
    work, excess, release_late = _own_work_us(run, arr, steps, finish)
    # the rank that finished last (-1 when several finished at the same instant)
    tied = (finish == finish.max(axis=1)[:, None]).sum(axis=1) > 1
    last_of_step = np.where(tied, -1, np.argmax(finish, axis=1))
    step_us = np.append(np.diff(begin), np.nan)
    first = warmup_steps(n_steps)
    s = _StepTable(
        t, op_code, last_rank, steps, bounds, hold, at_first, at_end, finish, work, excess,
        release_late, last_of_step, step_us, first,
    )  # fmt: skip
    counted = s.counted
    out.first_step = int(steps[first])
    out.steps = n_steps - first
    out.steps_in_run = count_steps(run)
    out.cycle_time_ms = _cycle_time_ms(run)
    spread = (finish.max(axis=1) - finish.min(axis=1))[counted]
    out.spread_ms = float(np.median(spread)) / 1000.0 if len(spread) else 0.0
    out.per_step = {
        "step": steps[counted].tolist(),
        "last_rank": job_rank[last_of_step[counted]].tolist(),
        "cost_ms": [
            round(float(hold[k, r]) / 1000.0, 6) if r >= 0 else 0.0
            for k, r in zip(range(first, n_steps), last_of_step[counted].tolist(), strict=True)
        ],
        "step_ms": [round(float(x) / 1000.0, 6) if np.isfinite(x) else None for x in step_us][
            first:
        ],
    }
    # own work is known when every rank recorded its collectives in every step judged;
    # else (one observer's file) the hold's excess over the others' mean hold stands in
    s.known = out.own_work_known = (
        bool(np.isfinite(excess[counted]).all()) and out.source == "source"
    )
    if not s.known:
        s.excess = hold - (hold.sum(axis=1, keepdims=True) - hold) / (n_ranks - 1)
        s.release_late = np.zeros_like(hold)
    return s


def _own_work_us(
    run: Run, arr: Arrivals, steps: np.ndarray, finish: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(work, excess, release_late)`` per step and rank column: own work runs from the
    rank's release by the previous step's last collective to its last submission, on its
    own clock; its excess over the others' mean, and the release's lateness (the
    runtime's part)."""
    n_steps, n_ranks = finish.shape
    release = _releases_us(run, n_ranks, int(steps.max()) + 1, arr.ranks)
    prev = steps - 1
    rel = np.full((n_steps, n_ranks), np.nan)
    rel[prev >= 0] = release[prev[prev >= 0]]
    # where the rank noted it, own work starts when its training thread got control back
    # (on a busy machine the wake-up after the release takes milliseconds: not its code)
    prev_finish = np.full((n_steps, n_ranks), np.nan)
    follows = np.flatnonzero(np.diff(steps) == 1) + 1
    prev_finish[follows] = finish[follows - 1]
    resumed = _resumed_us(run, n_ranks, prev_finish, finish, arr.ranks)
    rel = np.where(np.isfinite(resumed), resumed, rel)
    work = finish - rel
    others_mean = (work.sum(axis=1, keepdims=True) - work) / (n_ranks - 1)
    excess = work - others_mean
    rel_mean = (rel.sum(axis=1, keepdims=True) - rel) / (n_ranks - 1)
    return work, excess, rel - rel_mean


@dataclass
class _Decision:
    """Which ranks' excess is above the bar with confidence, over every step counted, and
    the window judged from then on."""

    e: np.ndarray  # [step counted, column]: excess, ms
    n_all: int
    bar_all: float
    boot_e: np.ndarray
    p: np.ndarray
    reject: np.ndarray
    candidate: int  # the column that held the job most
    onset: int  # the first row judged
    bar: float  # the cost a rank must reach (ms), from the onset on


def _decide(run: Run, out: Stragglers, s: _StepTable) -> _Decision:
    """The decision, over every step counted (an onset found in the data and then tested
    on the steps it picked would name a rank for a busy machine's burst of noise), then
    the window judged: from the candidate's onset on, when any rank is named."""
    n_steps, n_ranks = s.hold.shape
    first, counted = s.first, s.counted
    e = s.excess[counted] / 1000.0
    n_all = n_steps - first
    pace_ms = out.pace_ms = _pace_ms(run)
    bar_all = max(MIN_COST_MS, pace_ms, MIN_STEP_SHARE * typical_step_ms(run))
    boot_e = block_bootstrap_means(e) if n_all else np.zeros((1, n_ranks))
    p = _p_above(e.mean(axis=0) if n_all else np.zeros(n_ranks), boot_e.std(axis=0), bar_all)
    reject = holm(p) if n_all >= MIN_STEPS else np.zeros(n_ranks, dtype=bool)
    if run.capabilities.steps_sampled and 0 < n_all < MIN_STEPS:
        # torch.profiler records a few steps: a rank the others waited for by the bar in
        # every one of them is named for those steps (the verdict says how few they were)
        reject = (s.hold[counted] / 1000.0 >= bar_all).all(axis=0)

    # the candidate: the rank that held the job most; from its onset on (when any is named)
    candidate = int(np.argmax(s.hold[counted].sum(axis=0)))
    onset = first + _onset(s.hold[counted, candidate] / 1000.0) if reject.any() else first
    out.steps_judged = n_steps - onset
    in_window = s.step_us[onset:n_steps]
    in_window = in_window[np.isfinite(in_window)]
    # the run's step time, as analyze and diff quote it (from the onset on)
    out.step_ms = typical_step_ms(run, int(s.steps[onset]) if onset > first else None)
    if len(in_window) > 2:
        out.noise_ms = (
            max(_robust_std(in_window), _robust_std(np.diff(in_window)) / np.sqrt(2.0)) / 1000.0
        )
    bar = max(MIN_COST_MS, pace_ms, MIN_STEP_SHARE * out.step_ms)
    out.threshold_ms = bar
    return _Decision(e, n_all, bar_all, boot_e, p, reject, candidate, onset, bar)


def _rank_straggles(
    run: Run, arr: Arrivals, out: Stragglers, s: _StepTable, d: _Decision
) -> list[RankStraggle]:
    """Each rank's cost and interval from the onset on, sorted by the wait it caused."""
    n_steps, n_ranks = s.hold.shape
    window = slice(d.onset, n_steps)
    n_window = n_steps - d.onset
    n_all, e, boot_e, bar = d.n_all, d.e, d.boot_e, d.bar
    # each rank's cost per step: its hold, up to the excess of its own work over the
    # others' median (the rest of the hold is the runtime's)
    h = s.hold[window] / 1000.0
    if s.known:
        med = np.array(
            [np.median(np.delete(s.work[window], r, axis=1), axis=1) for r in range(n_ranks)]
        ).T
        h = np.clip(np.minimum(h, (s.work[window] - med) / 1000.0), 0.0, None)
    boot_h = block_bootstrap_means(h) if n_window else np.zeros((1, n_ranks))
    ranks: list[RankStraggle] = []
    op_codes = [c for c in np.unique(s.op_code).tolist() if c >= 0]
    for r in range(n_ranks):
        last_steps = int((s.last_of_step[window] == r).sum())
        held = h[:, r] >= bar
        x = RankStraggle(
            rank=arr.rank_of(r),
            host=run.hosts.get(arr.rank_of(r)),
            last_count=last_steps,
            last_share=last_steps / n_window if n_window else 0.0,
            held_count=int(held.sum()),
            held_share=float(held.mean()) if n_window else 0.0,
            held_ms=float(h[held, r].mean()) if held.any() else 0.0,
            wait_caused_ms=float(h[:, r].sum()),
            cost_per_step_ms=float(h[:, r].mean()) if n_window else 0.0,
            lateness_ms=float(s.hold[window, r].mean()) / 1000.0 if n_window else 0.0,
            cost_low_ms=float(np.quantile(boot_h[:, r], 0.025)),
            cost_high_ms=float(np.quantile(boot_h[:, r], 0.975)),
            own_excess_ms=float(e[:, r].mean()) if n_all else 0.0,
            own_excess_low_ms=float(np.quantile(boot_e[:, r], 0.025)),
            own_excess_high_ms=float(np.quantile(boot_e[:, r], 0.975)),
            release_late_ms=float(np.nanmean(s.release_late[window, r]) / 1000.0)
            if n_window
            else 0.0,
            p_value=float(d.p[r]),
            last_share_by_op={
                OPS[c]: float((s.last_rank[s.op_code == c] == r).mean()) for c in op_codes
            },
        )
        x.named = bool(d.reject[r]) and x.cost_per_step_ms >= bar
        ranks.append(x)
    # a rank "held" a step when its cost there beat the bar and what the ranks not named
    # reach in 95% of the steps (a busy machine's noise: an intermittent culprit's slow
    # steps stand out of it, its ordinary ones do not)
    bystanders = [c for c, x in enumerate(ranks) if not x.named]  # columns
    out.held_floor_ms = bar
    if bystanders and n_window:
        out.held_floor_ms = max(bar, float(np.quantile(h[:, bystanders], 0.95)))
    for c, x in enumerate(ranks):
        cut = held_cut(h[:, c], out.held_floor_ms) if x.named else out.held_floor_ms
        held = h[:, c] >= cut
        x.held_count = int(held.sum())
        x.held_share = float(held.mean()) if n_window else 0.0
        x.held_ms = float(h[held, c].mean()) if held.any() else 0.0
        if s.known and held.any() and not held.all():
            over = (s.work[window, c] - med[:, c]) / 1000.0
            x.excess_held_ms = float(np.median(over[held]))
            x.excess_not_held_ms = float(np.median(over[~held]))
    most_last = max(ranks, key=lambda x: (x.last_share, x.cost_per_step_ms, -x.rank))
    out.most_often_last = most_last.rank
    ranks.sort(key=lambda x: (-x.wait_caused_ms, x.rank))
    return ranks


def _name_culprits(
    run: Run,
    arr: Arrivals,
    out: Stragglers,
    s: _StepTable,
    d: _Decision,
    named: list[RankStraggle],
    where: str,
) -> None:
    """The named ranks' joint cost, the steps they held, the phase they were late in and
    the verdict."""
    n_steps, n_ranks = s.hold.shape
    onset = d.onset
    window = slice(onset, n_steps)
    column = {arr.rank_of(c): c for c in range(n_ranks)}
    out.culprits = [x.rank for x in named]
    out.straggler = out.culprits[0]
    group = [column[x.rank] for x in named]  # their columns
    out.onset_step = int(s.steps[onset])
    lateness = (
        np.array(
            [
                _group_cost_us(s.t[s.bounds[k] : s.bounds[k + 1]], group)
                for k in range(onset, n_steps)
            ]
        )
        / 1000.0
    )
    # what their code costs: the lateness, up to the excess of their slowest own work
    # over the rest's (the remainder is the runtime's, e.g. a later release)
    rest = [r for r in range(n_ranks) if r not in group]
    if s.known and rest:
        e_group = s.work[window][:, group].max(axis=1) - np.median(s.work[window][:, rest], axis=1)
        cost = np.clip(np.minimum(lateness, e_group / 1000.0), 0.0, None)
    else:
        cost = lateness
    out.lateness_ms = float(lateness.mean())
    # a step is held from here on: the floor, or a third of their mean in the held steps
    out.held_floor_ms = held_cut(cost, out.held_floor_ms)
    persistent = out.own_work_known and any(_slow_in_every_step(x) for x in named)
    floor = _noise_floor(s, cost, group, rest, onset, out.held_floor_ms, persistent)
    out.noise_floor_ms = floor
    for x in named:
        x.cost_per_step_ms = max(x.cost_per_step_ms - floor, 0.0)
        x.cost_low_ms = max(x.cost_low_ms - floor, 0.0)
        x.cost_high_ms = max(x.cost_high_ms - floor, 0.0)
    boot = block_bootstrap_means(cost[:, None])[:, 0]
    out.cost_ms = max(float(cost.mean()) - floor, 0.0)
    out.cost_low_ms = max(float(np.quantile(boot, 0.025)) - floor, 0.0)
    out.cost_high_ms = max(float(np.quantile(boot, 0.975)) - floor, 0.0)
    out.held_share = float((cost >= out.held_floor_ms).mean())
    top = group[0]
    # the phase from the steps they held (all of them for a persistent fault, the
    # slow ones of an intermittent fault)
    held = cost >= out.held_floor_ms
    held_steps = np.arange(onset, n_steps)[held] if held.any() else window
    if len(group) == 1:
        first_ms, end_ms = s.at_first[held_steps, top], s.at_end[held_steps, top]
    else:  # the group's latest arrival against the rest's
        late = [_group_lateness_us(s.t[s.bounds[k] : s.bounds[k + 1]], group) for k in held_steps]
        first_ms, end_ms = np.array([x[0] for x in late]), np.array([x[1] for x in late])
    out.late_at_first_ms = float(np.median(first_ms)) / 1000.0
    out.late_at_end_ms = float(np.median(end_ms)) / 1000.0
    if out.late_at_end_ms > 0:
        before = out.late_at_first_ms >= BEFORE_BACKWARD_SHARE * out.late_at_end_ms
        out.phase = PHASE_BEFORE_BACKWARD if before else PHASE_BACKWARD
    if len(named) > 1:
        where = SOURCE_WHERE_PLURAL.get(out.source, where)
    out.verdict = _culprit_verdict(out, named, cost, run.hosts, onset > s.first, where)


def _noise_floor(
    s: _StepTable,
    cost: np.ndarray,
    group: list[int],
    rest: list[int],
    onset: int,
    held_ms: float,
    persistent: bool,
) -> float:
    """What the job would still pay per step if the culprits' code kept pace (ms): taken
    off their cost.

    Their cost is their latest arrival against the rest's *median*; kept pace, the job
    would still wait for the rest's *latest* (their spread, measured in each step: none
    with one other rank), and for the culprits' own noise, which a busy machine puts on
    every rank and which a fix of their code would not remove (their mean cost in the
    steps their fault spared: an intermittent fault's, nothing for a persistent one, which
    :func:`_slow_in_every_step` tells apart by the own work in the steps not held).
    The ranks not named are not the measure: on a busy 2-rank job rank 0 held rank 1 a
    mean 3.5 ms per step, which is already in the pack's arrival that the culprit's
    lateness is counted from, and taking it off as well put a 40 ms fault in 22% of the
    steps (8.1 ms per step by the step times) at 4.8 ms; counted so, 7.5.
    """
    n = len(cost)
    spread = np.zeros(n)
    if len(rest) > 1:
        for i, k in enumerate(range(onset, onset + n)):
            t = s.t[s.bounds[k] : s.bounds[k + 1]]
            pack = np.median(t[:, rest], axis=1)[:, None]
            spread[i] = max(_blocked_us(t[:, r], pack) for r in rest) / 1000.0
    # a persistent fault spared no step: the ones a busy machine masked (under the cut)
    # are its own low tail, which a fix saves too, and their mean is the fault's, not
    # noise (a 3.3 ms fault in every step, held in 32% of 499 loaded steps, its own work
    # 2.6 ms over the other's: 1.1 ms per step counted as intermittent)
    held = np.ones(n, dtype=bool) if persistent else cost >= held_ms
    own = float(cost[~held].mean()) if (~held).sum() >= MIN_STEPS else 0.0
    saved = np.where(held, np.clip(cost - spread - own, 0.0, None), 0.0)
    return float(cost.mean() - saved.mean())


def _culprit_verdict(
    out: Stragglers,
    named: list[RankStraggle],
    cost: np.ndarray,
    hosts: dict[int, str],
    mid_run: bool,
    where: str,
) -> str:
    n = out.steps_judged
    since = f"from step {out.onset_step} on (it started mid-run)" if mid_run else f"of {n} steps"
    interval = f"95% interval {out.cost_low_ms:.1f}-{out.cost_high_ms:.1f}"
    held = cost >= out.held_floor_ms
    each = float(cost[held].mean()) if held.any() else 0.0
    if len(named) == 1:
        x = named[0]
        text = (
            f"rank {x.rank} is the straggler{where}: it held the job in {out.held_share:.0%} "
            f"{since}, by {each:.1f} ms each time: {out.cost_ms:.1f} ms per step on average "
            f"({interval}; step {out.step_ms:.1f} ms)."
        )
    else:
        who = _host_words(sorted(x.rank for x in named), hosts)
        text = (
            f"{who} are the stragglers{where}: together they held the job in "
            f"{out.held_share:.0%} {since}, by {each:.1f} ms each time: {out.cost_ms:.1f} ms "
            f"per step on average ({interval}; step {out.step_ms:.1f} ms). "
            + "; ".join(
                f"rank {x.rank}: held {x.held_share:.0%} of the steps, by {x.held_ms:.1f} ms, "
                f"{x.cost_per_step_ms:.1f} ms per step"
                for x in named
            )
            + "."
        )
    text += _slow_beyond_held(out, named)
    runtime = out.lateness_ms - out.cost_ms - out.noise_floor_ms
    if out.own_work_known and runtime >= max(MIN_COST_MS, 0.1 * out.lateness_ms):
        text += (
            f" Beyond that, hvdprof's runtime held {'it' if len(named) == 1 else 'them'} "
            f"{runtime:.1f} ms per step, or the machine did, not the code (its training "
            "thread got control back later after the previous step's last collective: a "
            "later release, or a wait for a CPU to wake up on)."
        )
    if any(x.rank == 0 for x in named) and out.own_work_known:
        # measured on busy 2-core machines: a balanced job's rank 0 computed 1.2 ms per
        # step slower (backward 1.8 vs 0.9 ms), as timed by the training loop itself
        text += (
            " Rank 0 also coordinates the negotiation: where the cores are oversubscribed its "
            "coordinator thread takes CPU from its training, so part of its slower own work "
            "can be hvdprof's."
        )
    if n < FEW_STEPS:
        out.thin = True
        text += f" Only {n} steps were judged: a longer run would make this surer."
    if out.phase is not None:
        kernels = out.source == SOURCE_KERNELS
        if len(named) == 1 or kernels:
            phase = KERNEL_PHASE_WORDS if kernels else PHASE_WORDS
            text += f" {'Its' if len(named) == 1 else 'Their'} time went {phase[out.phase]}: "
        else:
            text += f" Their time went {GROUP_PHASE_WORDS[out.phase]}: "
        text += (
            f"{_lateness(out.late_at_first_ms)} at the first "
            f"{'collective' if kernels else 'gradient'}, "
            f"{_lateness(out.late_at_end_ms)} at the last."
        )
    return text


def _slow_in_every_step(x: RankStraggle) -> bool:
    """Its own work exceeded the others' in the steps it did not hold too: a persistent
    fault that a busy machine masked there, not an intermittent one that spared them."""
    return x.excess_not_held_ms >= max(MIN_COST_MS, SLOW_SHARE_OF_HOLD * x.excess_held_ms)


def _slow_beyond_held(out: Stragglers, named: list[RankStraggle]) -> str:
    """Slow in every step but holding the job in far fewer: say both, and why, so that a
    persistent fault does not read as an intermittent one."""
    slow = [x for x in named if x.held_share <= 1.0 - SLOW_BEYOND_HELD and _slow_in_every_step(x)]
    if not out.own_work_known or not slow:
        return ""
    parts = [
        f"rank {x.rank}'s own work was longer than the others' median in the steps it did "
        f"not hold the job too (by {x.excess_not_held_ms:.1f} ms, median; "
        f"{x.excess_held_ms:.1f} ms in those it held), and it finished last in "
        f"{x.last_share:.0%} of the steps"
        for x in slow
    ]
    return (
        " Slow in every step is not holding the job in every step: "
        + "; ".join(parts)
        + f". A step counts as held only where its cost stands out of the machine's noise "
        f"({out.held_floor_ms:.1f} ms or more here), and where ranks share fewer CPU cores "
        "than there are ranks, a rank that waits (sleeps, reads data) frees a core for the "
        "others, so they catch up and it is last only in some steps."
    )


def _holm_need(ranks: list[RankStraggle], top: RankStraggle) -> float:
    """The p-value ``top`` had to reach in Holm's step-down procedure over ``ranks``."""
    before = sum(1 for x in ranks if x.p_value < top.p_value)
    return ALPHA / max(len(ranks) - before, 1)


def _holm_words(ranks: list[RankStraggle], top: RankStraggle) -> str:
    """Why a rank whose excess passed the bar on average was not named, in plain words:
    the correction for testing every rank at once, with the numbers it used."""
    m, need = len(ranks), _holm_need(ranks, top)
    return (
        f"{m} ranks were tested at once, and one of {m} can look slow by chance: to keep "
        f"the chance of naming any rank wrongly under {ALPHA:.0%} (Holm's correction for "
        f"testing {m} ranks), rank {top.rank} had to be above the bar with "
        f"{1.0 - need:.1%} confidence, and it was with {1.0 - top.p_value:.1%} (one-sided "
        f"p {top.p_value:.2g}, needed {need:.2g} or less)"
    )


def _no_culprit_verdict(
    out: Stragglers, ranks: list[RankStraggle], n: int, bar: float, where: str
) -> str:
    m = next(x for x in ranks if x.rank == out.most_often_last)
    top = max(ranks, key=lambda x: (x.own_excess_ms, -x.rank))
    text = f"No straggler{where}"
    if n < MIN_STEPS and where in SOURCE_WHERE_NONE.values():
        out.thin = True
        text += (
            f": no rank held the others {bar:.1f} ms or more (the most of {MIN_COST_MS:g} ms "
            f"and {MIN_STEP_SHARE:.0%} of the {out.step_ms:.1f} ms step) in each of the {n} "
            f"step{'s' if n != 1 else ''} traced"
        )
    elif n < MIN_STEPS:
        out.thin = True
        text += f": {n} step{'s' if n != 1 else ''} are too few to name anyone with confidence"
    elif top.own_excess_ms >= bar and holm(np.array([x.p_value for x in ranks]))[ranks.index(top)]:
        text += (
            f": rank {top.rank}'s own work took {top.own_excess_ms:.1f} ms per step more than "
            f"the others' on average over {n} steps ({1.0 - top.p_value:.1%} confidence, "
            f"allowing for {len(ranks)} ranks tested), but it held the others only "
            f"{top.cost_per_step_ms:.2f} ms per step on average, under the {bar:.2f} ms it "
            "takes to name a rank: the others were seldom kept waiting by it"
        )
    elif top.own_excess_ms >= bar:
        out.thin = True
        text += (
            f": the evidence is too thin. Rank {top.rank}'s own work took "
            f"{top.own_excess_ms:.1f} ms per step more than the others' on average over {n} "
            f"steps (95% interval {top.own_excess_low_ms:.2f}-{top.own_excess_high_ms:.2f} ms "
            f"for that rank alone), and naming a rank takes more than {bar:.2f} ms per step; "
            f"but {_holm_words(ranks, top)}; more steps would settle it"
        )
    else:
        part = "own work" if out.own_work_known else "hold on the others"
        a, b = _ms_pair(top.own_excess_ms, bar)
        text += (
            f": no rank's {part} was material over {n} steps (the most, rank {top.rank}, "
            f"{a} ms per step more than the others' on average; material is {b} ms: the "
            f"most of {MIN_COST_MS:g} ms{', one cycle' if out.pace_ms else ''} and "
            f"{MIN_STEP_SHARE:.0%} of the "
            f"{out.step_ms:.1f} ms step)"
        )
    text += (
        f". The rank most often last, rank {m.rank}, was last in {m.last_count} of {n} steps "
        f"and held the job {m.cost_per_step_ms:.2f} ms per step on average."
    )
    late = [
        x
        for x in ranks
        if out.own_work_known and x.lateness_ms >= bar and x.release_late_ms > 0.5 * x.lateness_ms
    ]
    if late:
        x = late[0]
        text += (
            f" hvdprof's runtime held rank {x.rank} by {x.release_late_ms:.2f} ms per step, "
            "or the machine did, not its code: its training thread got control back from "
            "the previous step's last collective that much after the others' on average (a "
            "later release, or a wait for a CPU to wake up on)."
        )
    text += f" The ranks finish each step within {out.spread_ms:.2f} ms of each other (median)."
    return text


def _partial_verdict(
    out: Stragglers,
    ranks: list[RankStraggle],
    candidate: int,
    op_code: np.ndarray,
    n_ops: int,
    n_steps: int,
    run_steps: int,
    where: str,
) -> None:
    """Readiness marks on only some steps: judge by the share of ops each rank was last."""
    top = next(x for x in ranks if x.rank == candidate)
    main_op = _main_op(op_code)
    share = top.last_share_by_op.get(main_op, 0.0)
    if share >= PARTIAL_LAST_SHARE and top.wait_caused_ms >= MIN_COST_MS:
        top.named = True
        out.straggler, out.culprits = top.rank, [top.rank]
        out.onset_step = out.first_step
        out.verdict = (
            f"rank {top.rank} is the straggler{where}: it arrived last in {share:.0%} of the "
            f"{main_op.lower()}s with readiness marks ({n_ops} ops in {n_steps} of "
            f"{run_steps} steps: the timeline records readiness only there), costing the "
            f"others {top.wait_caused_ms:.1f} ms of waiting in those steps."
        )
        return
    out.thin = True
    out.verdict = (
        f"No straggler{where}: readiness marks in only {n_steps} of {run_steps} steps, and "
        f"no rank was last in {PARTIAL_LAST_SHARE:.0%} of the {main_op.lower()}s there "
        f"(rank {top.rank}: {share:.1%})."
    )


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


@dataclass
class OwnWorkSeries:
    """Each counted step's length and waiting per rank (ms; rows: steps from
    ``first_step`` on, the warm-up left out as in the step time; columns: ranks)."""

    first_step: int
    step_ms: np.ndarray
    wait_ms: np.ndarray

    @property
    def work_ms(self) -> np.ndarray:
        return np.maximum(self.step_ms - self.wait_ms, 0.0)


def own_work_series(run: Run) -> OwnWorkSeries | None:
    """Per step and rank, the step's length and the rank's waiting for the others.

    A rank waits on an op it reached before the last rank from its latest submission
    before the last arrival (it had nothing more to submit) until that arrival; the union
    of those intervals per step is its waiting, the rest of the step its own work. None
    when the run has no arrivals of every rank, or fewer than two steps to count.
    """
    arr = arrivals(run) if len(run.slices) else None
    if arr is None or arr.t_us.shape[1] < 2 or not len(arr.t_us) or arr.ranks is not None:
        return None  # (its columns are ranks 0..n-1: some traced ranks of a job are not)
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
    first = warmup_steps(n_steps)
    if n_steps - first < 2:
        return None
    spans = np.diff(begin[first:], axis=0)  # step k: from its start to step k+1's
    return OwnWorkSeries(int(steps[first]), spans / 1000.0, wait[first:-1] / 1000.0)


def own_work(run: Run) -> dict[int, RankWork]:
    """Per rank, mean per step of its own work and of its waiting for the others
    (:func:`own_work_series` averaged). Empty when the run has no arrivals of every rank.
    """
    series = own_work_series(run)
    if series is None:
        return {}
    out = {}
    for r in range(series.step_ms.shape[1]):
        step_ms = float(series.step_ms[:, r].mean())
        wait_ms = float(series.wait_ms[:, r].mean())
        out[r] = RankWork(r, len(series.step_ms), step_ms, wait_ms, max(step_ms - wait_ms, 0.0))
    return out


def straggler_table(console: Any, number: int, s: Stragglers, run: dict[str, Any]) -> None:
    """Who is late, by how much, and what it costs per step."""
    from rich.table import Table

    from hvdprof.analysis.table_cells import fitted, ms

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
            ms(x.held_ms),
            f"{ms(x.cost_per_step_ms)} ({ms(x.cost_low_ms)}-{ms(x.cost_high_ms)})",
            ms(x.lateness_ms),
        )
    console.print(fitted(table))
    console.print(
        "  late = the time the others were blocked on this rank per step (union over the "
        "step's ops); cost = as much of it as the rank's own work (data, forward, "
        "backward) took longer than the others': what the job would save if its code "
        "kept pace (the rest is the runtime's); held = steps whose cost reached "
        f"{ms(s.held_floor_ms)} ms (the bar, or the noise of the ranks not named)",
        highlight=False,
    )


ANALYSIS = Analysis(
    "stragglers", find_stragglers, Stragglers,
    "Who made the others wait: negotiation wait per rank and step",
    verdict_order=10, table=straggler_table,
    # a job whose every judged collective ran in a process set: told by each set's answer
    needs=("process_sets",),
)  # fmt: skip
