"""Q3: is fusion working? Tensors per fused op, buffer fill, and why ops ran unfused.

A fused op is a fusion group (``group`` in the op's args) of more than one tensor. An op
alone in its group ran unfused; the reason is read from what else was negotiated in the
same cycle on that rank (ops negotiated together start their ``<OP>`` slice at the same
instant): nothing else (``alone``), only tensors of another dtype (``dtype``) or another
collective (``op``), or same-kind tensors that would not fit under the threshold
(``threshold``). Broadcasts, allgathers and the like are never fused (``not_fusable``).
Horovod timelines do not record groups; ops whose backend call began at the same instant
are taken as one group, and the threshold is Horovod's default (64 MiB) unless known.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from hvdprof.analysis.registry import Analysis
from hvdprof.analysis.result import Result
from hvdprof.trace.model import OPS, PHASE_OP, Run

REASONS: tuple[str, ...] = ("alone", "dtype", "op", "threshold", "not_fusable", "unknown")
REASON_WORDS = {
    "alone": "nothing else was ready in the same cycle",
    "dtype": "the others ready had another dtype",
    "op": "the others ready were another collective",
    "threshold": "they would not fit in the fusion buffer with the others (threshold)",
    "not_fusable": "they are broadcasts, allgathers or other collectives never fused",
    "unknown": "reason not recorded",
}
#: Fill bands of fused groups (bytes / threshold): lower edges, and their labels. A
#: threshold that fused groups never come near is a larger buffer than the job needs; one
#: they all fill is the one holding tensors back.
FILL_EDGES = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9)
FILL_LABELS = ("<10%", "10-25%", "25-50%", "50-75%", "75-90%", ">=90%")
_ALLREDUCE = OPS.index("ALLREDUCE")


class RankFusion(Result):
    rank: int
    groups: int  # collectives run (fusion groups)
    fused: int  # groups of more than one tensor
    unfused: int
    tensors: int  # ops (tensors) in all groups
    tensors_per_fused_op: float
    fill_mean: float  # fused groups' bytes / threshold
    unfused_reasons: dict[str, int] = msgspec.field(default_factory=dict)
    group_size_histogram: dict[str, int] = msgspec.field(default_factory=dict)  # tensors -> groups
    #: fused groups by fill band (bytes / threshold), every band present, in order
    fill_histogram: dict[str, int] = msgspec.field(default_factory=dict)


class FusionReport(Result):
    threshold_bytes: int | None = None
    #: what each reason in ``unfused_reasons`` means, in words
    reason_words: dict[str, str] = msgspec.field(default_factory=lambda: dict(REASON_WORDS))
    ranks: list[RankFusion] = msgspec.field(default_factory=list)
    verdict: str | None = None


def fusion_report(run: Run) -> FusionReport:
    """Fusion groups per rank: sizes, fill against the threshold, and unfused reasons."""
    s = run.slices
    threshold = run.fusion_threshold_bytes()
    if threshold is None:  # the recording tool's default (Horovod's), when it has one
        threshold = run.capabilities.default_fusion_threshold_bytes
    out = FusionReport(threshold_bytes=threshold)
    ops_mask = (s.phase == PHASE_OP) & (s.group >= 0)
    for rank in run.ranks:
        rows = np.flatnonzero(ops_mask & (s.rank == rank))
        if not len(rows):
            continue
        group = s.group[rows]
        # a group id can come back after a restart: key on (group, op start)
        keys = np.stack([group.astype(np.float64), s.start_us[rows]], axis=1)
        _, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
        n_in_group = np.bincount(inverse)
        g_rows = rows[first]
        sizes = np.maximum(s.group_tensors[g_rows], n_in_group)
        fused = sizes > 1
        gbytes = np.where(s.group_bytes[g_rows] >= 0, s.group_bytes[g_rows], 0)
        fill = float(np.mean(gbytes[fused] / threshold)) if threshold and fused.any() else 0.0
        bands = dict.fromkeys(FILL_LABELS, 0)
        if threshold and fused.any():
            band = np.searchsorted(FILL_EDGES, gbytes[fused] / threshold, side="right") - 1
            for b, n in zip(*np.unique(band, return_counts=True), strict=True):
                bands[FILL_LABELS[int(b)]] = int(n)
        hist = {
            str(int(k)): int(v) for k, v in zip(*np.unique(sizes, return_counts=True), strict=True)
        }
        reasons = _unfused_reasons(run, rows, g_rows[~fused], threshold)
        out.ranks.append(
            RankFusion(
                rank=rank,
                groups=len(g_rows),
                fused=int(fused.sum()),
                unfused=int((~fused).sum()),
                tensors=len(rows),
                tensors_per_fused_op=float(sizes[fused].mean()) if fused.any() else 0.0,
                fill_mean=fill,
                unfused_reasons=reasons,
                group_size_histogram=hist,
                fill_histogram=bands,
            )
        )
    out.verdict = _verdict(out)
    return out


def _unfused_reasons(
    run: Run, rows: np.ndarray, singles: np.ndarray, threshold: int | None
) -> dict[str, int]:
    s = run.slices
    reasons = dict.fromkeys(REASONS, 0)
    if not len(singles):
        return {}
    # ops negotiated in the same cycle start their <OP> slice at the same instant
    starts = s.start_us[rows]
    order = np.argsort(starts, kind="stable")
    sorted_starts = starts[order]
    lo = np.searchsorted(sorted_starts, s.start_us[singles], side="left")
    hi = np.searchsorted(sorted_starts, s.start_us[singles], side="right")
    for row, a, b in zip(singles.tolist(), lo.tolist(), hi.tolist(), strict=True):
        if s.op[row] != _ALLREDUCE:
            reasons["not_fusable"] += 1
            continue
        peers = rows[order[a:b]]
        peers = peers[peers != row]
        if not len(peers):
            reasons["alone"] += 1
            continue
        same_op = s.op[peers] == s.op[row]
        same_dtype = s.dtype[peers] == s.dtype[row]
        if not same_op.any():
            reasons["op"] += 1
        elif not (same_op & same_dtype).any():
            reasons["dtype"] += 1
        elif threshold is not None and threshold > 0:
            peers_bytes = s.bytes[peers[same_op & same_dtype]]
            if int(s.bytes[row]) + int(peers_bytes.min()) > threshold:
                reasons["threshold"] += 1
            else:
                reasons["unknown"] += 1
        else:
            reasons["threshold"] += 1  # threshold 0: fusion off
    return {k: v for k, v in reasons.items() if v}


def _verdict(report: FusionReport) -> str | None:
    if not report.ranks:
        return "No fusion groups recorded."
    r = report.ranks[0]
    text = (
        f"Rank {r.rank} ran {r.groups} collectives for {r.tensors} tensors: {r.fused} fused "
        f"({r.tensors_per_fused_op:.1f} tensors each on average"
    )
    if report.threshold_bytes:
        text += (
            f", filling {r.fill_mean:.1%} of the {report.threshold_bytes / 1048576:g} MiB "
            "threshold"  # the table's and the page's precision: one number per fact
        )
    text += f"), {r.unfused} unfused"
    if r.unfused and r.unfused_reasons:
        top = max(r.unfused_reasons, key=lambda k: r.unfused_reasons[k])
        n = r.unfused_reasons[top]
        share = "all of them" if n == r.unfused else f"{n} of them"
        text += f" ({share} because {REASON_WORDS[top]})"
    return text + "."


def fusion_table(console: Any, number: int, f: FusionReport, run: dict[str, Any]) -> None:
    """Fused ops per rank, their fill, and why the rest ran alone."""
    from rich.table import Table

    from hvdprof.analysis.table_cells import fitted

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


ANALYSIS = Analysis(
    "fusion", fusion_report, FusionReport, "Tensors per fused op and buffer fill",
    verdict_order=40, table=fusion_table,
)  # fmt: skip
