"""Q2: who is the straggler? The rank that became ready last, and what it cost the others.

For each op (a tensor's n-th negotiation) the readiness marks say when every rank was
ready, as seen by one observer (the lowest rank that recorded marks: rank 0, the
coordinator, when present; Horovod files only have rank 0's view). The rank ready last
made each other rank ``r`` wait ``t_last - t_r``. Per step, a rank's waiting is the union
of those intervals over the step's ops (ops of one step wait concurrently, so summing
them would count the same milliseconds many times).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hvdprof.analysis.intervals import union_by_group
from hvdprof.analysis.model import OPS, Run
from hvdprof.analysis.steps import count_steps

#: Below this mean cost per step a straggler is not worth a verdict (us).
MIN_COST_PER_STEP_US = 500.0
#: A rank is "the" straggler when it was last in at least this share of the ops.
DOMINANT_SHARE = 0.5
#: How far above chance (standard deviations of a binomial share) "last" must be.
CHANCE_SIGMAS = 2.8


@dataclass
class RankStraggle:
    rank: int
    last_count: int  # ops it was ready last in
    last_share: float  # of the ops with marks from every rank
    wait_caused_ms: float  # waiting of the other ranks, summed over them and the run
    cost_per_step_ms: float  # mean waiting of one other rank per step
    last_share_by_op: dict[str, float] = field(default_factory=dict)


@dataclass
class Stragglers:
    """Readiness per op and the ranks ordered by the waiting they caused."""

    observer: int | None = None
    ops_with_marks: int = 0
    steps: int = 0  # steps with readiness marks
    steps_in_run: int = 0
    ranks: list[RankStraggle] = field(default_factory=list)  # most waiting caused first
    # one entry per op: tensor name, step, op, last rank, wait of the others (mean, ms)
    per_op: dict[str, list[Any]] = field(default_factory=dict)
    straggler: int | None = None
    verdict: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "observer": self.observer,
            "ops_with_marks": self.ops_with_marks,
            "steps": self.steps,
            "steps_in_run": self.steps_in_run,
            "straggler": self.straggler,
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
            "verdict": self.verdict,
        }


def _beyond_chance(share: float, n_ranks: int, samples: int) -> bool:
    """Last in more ops than chance gives: on a balanced job each of ``n_ranks`` is last
    about ``1/n_ranks`` of the time, and with few steps one rank can be last in most of
    them by luck (2 ranks, 4 steps, scheduling noise). ``samples``: independent draws
    (steps; ops of one step are late together)."""
    p = 1.0 / max(n_ranks, 2)
    need = p + CHANCE_SIGMAS * (p * (1.0 - p) / max(samples, 1)) ** 0.5
    return share >= min(need, 1.0)


def find_stragglers(run: Run) -> Stragglers:
    """Which rank was ready last per op, and the ranks ranked by the waiting they caused."""
    out = Stragglers()
    m = run.marks
    if not len(m) or len(run.slices) == 0:
        out.verdict = "No readiness marks in this timeline: stragglers cannot be named."
        return out
    observer = int(m.observer.min())
    out.observer = observer
    sel = (m.observer == observer) & (m.slice >= 0)
    slice_row = m.slice[sel]
    ready_rank = m.ready_rank[sel]
    ts = m.ts_us[sel]
    # ops = negotiate slices; keep those with a mark from every rank
    ops, op_index = np.unique(slice_row, return_inverse=True)
    n_ranks = max(run.size, int(ready_rank.max()) + 1)
    counts = np.bincount(op_index, minlength=len(ops))
    full = counts >= n_ranks
    if n_ranks < 2 or not full.any():
        out.verdict = "Fewer than two ranks reported readiness: no straggler to name."
        return out
    keep = full[op_index]
    op_index, ready_rank, ts = op_index[keep], ready_rank[keep], ts[keep]
    ops = ops[full]
    remap = np.cumsum(full) - 1
    op_index = remap[op_index]
    n_ops = len(ops)
    t_last = np.full(n_ops, -np.inf)
    np.maximum.at(t_last, op_index, ts)
    is_max = ts == t_last[op_index]
    n_at_max = np.bincount(op_index, weights=is_max, minlength=n_ops)
    last_rank = np.full(n_ops, -1, dtype=np.int64)
    unique_last = is_max & (n_at_max[op_index] == 1)
    last_rank[op_index[unique_last]] = ready_rank[unique_last]
    wait = t_last[op_index] - ts  # this rank's wait for the last one (0 for the last)
    culprit = last_rank[op_index]
    s = run.slices
    step = s.occurrence[ops].astype(np.int64)
    op_code = s.op[ops].astype(np.int64)
    mean_wait = np.bincount(op_index, weights=wait, minlength=n_ops) / max(n_ranks - 1, 1)
    out.ops_with_marks = n_ops
    n_steps = int(step.max()) + 1 if n_ops else 0
    out.steps = len(np.unique(step))
    out.per_op = {
        "tensor": [run.tensors[t] if t >= 0 else "" for t in s.tensor[ops].tolist()],
        "step": step.tolist(),
        "op": [OPS[c] if c >= 0 else "" for c in op_code.tolist()],
        "last_rank": last_rank.tolist(),
        "wait_ms": (mean_wait / 1000.0).round(6).tolist(),
    }
    # per-step union of waiting intervals, keyed by (culprit, waiting rank, step)
    waiting = (culprit >= 0) & (wait > 0)
    key = (culprit[waiting] * n_ranks + ready_rank[waiting]) * n_steps + step[op_index[waiting]]
    uniq, key_index = np.unique(key, return_inverse=True)
    lengths = union_by_group(
        key_index.reshape(-1), ts[waiting], t_last[op_index[waiting]], len(uniq)
    )
    key_culprit = uniq // (n_ranks * n_steps)
    per_culprit = np.bincount(key_culprit, weights=lengths, minlength=n_ranks)
    ranks: list[RankStraggle] = []
    steps_seen = max(out.steps, 1)
    for r in range(n_ranks):
        last_mask = last_rank == r
        by_op = {}
        for c in np.unique(op_code).tolist():
            of_op = op_code == c
            if of_op.any() and c >= 0:
                by_op[OPS[c]] = float((last_mask & of_op).sum() / of_op.sum())
        ranks.append(
            RankStraggle(
                rank=r,
                last_count=int(last_mask.sum()),
                last_share=float(last_mask.sum() / n_ops),
                wait_caused_ms=float(per_culprit[r]) / 1000.0,
                cost_per_step_ms=float(per_culprit[r]) / 1000.0 / steps_seen / (n_ranks - 1),
                last_share_by_op=by_op,
            )
        )
    ranks.sort(key=lambda x: (-x.wait_caused_ms, x.rank))
    out.ranks = ranks
    top = ranks[0]
    total_wait = sum(r.wait_caused_ms for r in ranks)
    # readiness marks on only some steps (Horovod's response cache records them only at a
    # tensor's first negotiation): say so, and do not present a per-step cost
    run_steps = count_steps(run)
    partial = run_steps > 1 and out.steps < 0.5 * run_steps
    out.steps_in_run = run_steps
    enough = (
        top.wait_caused_ms * 1000.0 >= MIN_COST_PER_STEP_US
        if partial
        else (top.cost_per_step_ms * 1000.0 >= MIN_COST_PER_STEP_US)
    )
    consistent = _beyond_chance(top.last_share, n_ranks, n_ops if partial else out.steps)
    if (
        enough
        and consistent
        and top.last_share >= DOMINANT_SHARE
        and top.wait_caused_ms >= 0.5 * total_wait
    ):
        out.straggler = top.rank
        main_op = max(top.last_share_by_op, key=lambda k: (op_code == OPS.index(k)).sum())
        share = top.last_share_by_op[main_op]
        if partial:
            out.verdict = (
                f"rank {top.rank} is the straggler: it arrived last in {share:.0%} of the "
                f"{main_op.lower()}s with readiness marks ({n_ops} ops in {out.steps} of "
                f"{run_steps} steps: the timeline records readiness only there), costing the "
                f"others {top.wait_caused_ms:.1f} ms of waiting in those ops."
            )
        else:
            out.verdict = (
                f"rank {top.rank} is the straggler: it arrived last in {share:.0%} of "
                f"{main_op.lower()}s, costing the others {top.cost_per_step_ms:.1f} ms per step "
                f"({top.wait_caused_ms / 1000.0:.2f} s of waiting over the run)."
            )
    else:
        out.verdict = (
            f"No single straggler: the rank most often last (rank {top.rank}, "
            f"{top.last_share:.0%} of {n_ops} ops) costs the others "
            f"{top.cost_per_step_ms:.2f} ms per step."
        )
    return out
