"""Q4: how fast is the communication? Algorithm and bus bandwidth by message size.

Definitions follow NCCL-tests: ``algbw = bytes / time`` with ``bytes`` the message
(a fusion group's bytes, as one rank contributes them) and ``time`` the backend call
(``<BACKEND>_<OP>`` slice); ``busbw = algbw x factor`` with factor ``2(n-1)/n`` for
allreduce, ``(n-1)/n`` for allgather, reducescatter and alltoall, and 1 for broadcast,
so that bus bandwidth is comparable with the link speed whatever the op. Units: GB/s
(10^9 bytes per second). Messages are binned by powers of two. One-time ops (start-up
parameter broadcasts) are counted but left out of the calls, the bins and the advice: they
are not the steps' traffic, and fusing them would save nothing per step.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from hvdprof.analysis.registry import Analysis
from hvdprof.analysis.result import Result
from hvdprof.analysis.steps import one_time_tensors
from hvdprof.trace.model import OPS, PHASE_COLLECTIVE, Run


def bus_factor(op: str, n: int) -> float:
    """NCCL-tests' bus bandwidth factor for ``op`` at ``n`` ranks."""
    if n <= 1:
        return 1.0
    if op == "ALLREDUCE":
        return 2.0 * (n - 1) / n
    if op in ("ALLGATHER", "REDUCESCATTER", "ALLTOALL"):
        return (n - 1) / n
    return 1.0


class SizeBin(Result):
    op: str
    min_bytes: int  # bin is [min_bytes, 2 * min_bytes)
    count: int
    median_bytes: float
    median_ms: float
    algbw_gbps: float  # median
    busbw_gbps: float  # median
    best_busbw_gbps: float
    vs_best: float  # median busbw / best busbw of this op in the run


class BandwidthReport(Result):
    ranks: int = 0
    bins: list[SizeBin] = msgspec.field(default_factory=list)
    best_busbw_gbps: dict[str, float] = msgspec.field(default_factory=dict)
    # one entry per collective call: rank, op, bytes, ms, algbw, busbw
    calls: dict[str, list[Any]] = msgspec.field(default_factory=dict)
    one_time_calls: int = 0  # calls of one-time ops (start-up broadcasts), left out
    verdict: str | None = None


def collective_calls(
    run: Run,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Unique backend calls: ``(rank, op code, bytes, duration us, one-time)``.

    Every tensor of a fused group draws the group's backend call on its own lane; one
    call is one (rank, start, name). One-time: the call's tensor is reduced only once in
    a run of several steps (a start-up broadcast).
    """
    s = run.slices
    rows = np.flatnonzero((s.phase == PHASE_COLLECTIVE) & (s.dur_us > 0))
    if not len(rows):
        z = np.zeros(0)
        return z.astype(np.int32), z.astype(np.int8), z.astype(np.int64), z, z.astype(bool)
    keys = np.stack(
        [s.rank[rows].astype(np.float64), s.start_us[rows], s.name[rows].astype(np.float64)],
        axis=1,
    )
    _, first = np.unique(keys, axis=0, return_index=True)
    rows = rows[first]
    nbytes = np.where(s.group_bytes[rows] > 0, s.group_bytes[rows], s.bytes[rows])
    ok = nbytes > 0
    rows = rows[ok]
    once = np.isin(s.tensor[rows], one_time_tensors(run))
    return s.rank[rows], s.op[rows], nbytes[ok], s.dur_us[rows], once


def bandwidth_report(run: Run) -> BandwidthReport:
    """algbw/busbw of every backend call, binned by message size per op."""
    n = run.size or len(run.ranks)
    rank, op, nbytes, dur, once = collective_calls(run)
    out = BandwidthReport(ranks=n)
    if not len(dur):
        out.verdict = "No backend calls with known sizes: bandwidth cannot be measured."
        return out
    if once.any() and not once.all():
        # start-up broadcasts run once: counted, but the calls, bins and advice are the
        # steps' traffic
        out.one_time_calls = int(once.sum())
        keep = ~once
        rank, op, nbytes, dur = rank[keep], op[keep], nbytes[keep], dur[keep]
    algbw = nbytes / dur / 1e3  # bytes/us = MB/s; /1e3 -> GB/s
    factor = np.array([bus_factor(OPS[c] if c >= 0 else "", n) for c in range(-1, len(OPS))])
    busbw = algbw * factor[op.astype(np.int64) + 1]
    out.calls = {
        "rank": rank.tolist(),
        "op": [OPS[c] if c >= 0 else "" for c in op.tolist()],
        "bytes": nbytes.tolist(),
        "ms": (dur / 1000.0).round(6).tolist(),
        "algbw_gbps": algbw.round(6).tolist(),
        "busbw_gbps": busbw.round(6).tolist(),
    }
    size_bin = np.floor(np.log2(nbytes)).astype(np.int64)
    for c in np.unique(op).tolist():
        name = OPS[c] if c >= 0 else "UNKNOWN"
        of_op = op == c
        best = float(busbw[of_op].max())
        out.best_busbw_gbps[name] = best
        for b in np.unique(size_bin[of_op]).tolist():
            sel = of_op & (size_bin == b)
            med_bus = float(np.median(busbw[sel]))
            out.bins.append(
                SizeBin(
                    op=name,
                    min_bytes=1 << b,
                    count=int(sel.sum()),
                    median_bytes=float(np.median(nbytes[sel])),
                    median_ms=float(np.median(dur[sel])) / 1000.0,
                    algbw_gbps=float(np.median(algbw[sel])),
                    busbw_gbps=med_bus,
                    best_busbw_gbps=float(busbw[sel].max()),
                    vs_best=med_bus / best if best > 0 else 0.0,
                )
            )
    out.verdict = _verdict(out)
    return out


def _size(nbytes: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{int(nbytes)} B"


def _share(x: float) -> str:
    return "<1%" if 0 < x < 0.005 else f"{x:.0%}"


def _verdict(report: BandwidthReport) -> str:
    parts = []
    for op, best in sorted(report.best_busbw_gbps.items(), key=lambda kv: -kv[1]):
        bins = [b for b in report.bins if b.op == op]
        top = max(bins, key=lambda b: b.busbw_gbps)
        low = min(bins, key=lambda b: b.min_bytes)
        text = (
            f"{op.lower()} reached {top.busbw_gbps:.3g} GB/s bus bandwidth (median) for "
            f"{_size(top.min_bytes)}-{_size(2 * top.min_bytes)} messages (best single call "
            f"{best:.3g} GB/s)"
        )
        if low is not top and top.busbw_gbps > 0 and low.busbw_gbps < 0.5 * top.busbw_gbps:
            text += (
                f"; messages under {_size(2 * low.min_bytes)} ran at "
                f"{_share(low.busbw_gbps / top.busbw_gbps)} of that (latency-bound: fuse them)"
            )
        parts.append(text)
    text = "; ".join(parts) + "."
    if report.one_time_calls:
        text += f" {report.one_time_calls} one-time call(s) (start-up broadcasts) are left out."
    return text


def bandwidth_table(console: Any, number: int, bw: BandwidthReport, run: dict[str, Any]) -> None:
    """Bandwidth by op and message size against the best seen."""
    from rich.table import Table

    from hvdprof.analysis.table_cells import fitted, size_range

    if not bw.bins:
        return
    table = Table(
        title=f"{number}. Bandwidth by message size ({bw.ranks} ranks; NCCL-tests "
        "algbw/busbw, GB/s = 10^9 B/s)"
    )
    for col in (
        "op",
        "message size",
        "calls",
        "median ms",
        "algbw",
        "busbw",
        "of best busbw",
    ):
        table.add_column(col, justify="right")
    for x in bw.bins:
        table.add_row(
            x.op.lower(),
            size_range(x.min_bytes),
            f"{x.count:,}",
            f"{x.median_ms:.3f}",
            f"{x.algbw_gbps:.3g}",
            f"{x.busbw_gbps:.3g}",
            f"{x.vs_best:.0%}",
        )
    console.print(fitted(table))


ANALYSIS = Analysis(
    "bandwidth", bandwidth_report, BandwidthReport, "Bus bandwidth by message size",
    verdict_order=50, table=bandwidth_table,
)  # fmt: skip
