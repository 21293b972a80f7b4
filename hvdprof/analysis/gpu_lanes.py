"""What ran on each GPU stream of one rank, and where the CPU launched it.

The GPU half of ``timeline_window(run, t0, t1, expand_rank=R, lanes="stream")`` (which
adds the CPU row's slices and bins as it does for a rank row): for a rank with GPU activity (a torch.profiler trace recorded on a GPU), one row for the
rank's CPU side (its collectives: the ``c10d`` ops, the wait before them and the backend
call, as the rank row shows them) and one row per CUDA stream, each kernel, memcpy and
memset coloured by HTA's kind (computation, communication, memory, other). A stream's
label says what runs on it most (compute, NCCL, memcpy). Each kernel carries its launch:
when the runtime call that launched it started on the CPU, the collective it was launched
in, and the launch-to-start delay.

Above ``max_items`` the rows are cut into equal time bins as ``window._bins`` does for
the CPU side: per stream and kind, the kernels are merged into disjoint intervals once
per rank (sorted, with their cumulative length), so a window's busy time per bin is two
binary searches per bin edge and a million kernels answer in milliseconds; a bin carries
the time of each kind, its busy time (at most its width), its dominant kind (``idle``
included) and how many kernels overlap it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hvdprof.analysis.bins import bucket_table
from hvdprof.analysis.gpu_kinds import GPU_KIND_NAMES, short_kernel_name
from hvdprof.trace.model import PHASE_NEGOTIATE, PHASE_OP, Run

#: A kernel's ``phase`` in a stream window (its colour): HTA's kind, prefixed so that it
#: never reads as one of the CPU side's phases ("other" is one of both).
GPU_PHASES: tuple[str, ...] = tuple(f"gpu_{k}" for k in GPU_KIND_NAMES)
#: What a stream is called after the kind that takes most of its time.
STREAM_ROLES: tuple[str, ...] = ("compute", "NCCL", "memcpy", "other")
#: A bin in which the stream (or the CPU side) ran nothing most of the time.
IDLE = "idle"
_KINDS = len(GPU_KIND_NAMES)


@dataclass
class RankKernels:
    """One rank's GPU events sorted by start, with what binning a window needs."""

    start: np.ndarray
    end: np.ndarray
    kind: np.ndarray  # int64, GPU_KIND_NAMES index
    row: np.ndarray  # int64, 1 + index into ``streams`` (row 0 is the CPU side)
    #: position of each in the ``GpuActivity`` (its other columns are read only for the
    #: few events a window shows)
    order: np.ndarray
    gpu: Any
    names: list[str]
    streams: list[int]  # in row order
    roles: list[str]
    max_dur: float
    #: merged intervals per (row, kind) key, each key's laid after the previous one's
    #: (``key * span`` added), with the cumulative length before each
    merged_start: np.ndarray
    merged_len: np.ndarray
    merged_before: np.ndarray
    base: float
    span: float
    #: ``short_kernel_name`` of each of ``names`` (filled on first use)
    short_names: list[str] | None = None


def rank_kernels(gpu: Any) -> RankKernels:
    """Sort one rank's ``GpuActivity`` and merge it per stream and kind (once per run)."""
    order = np.argsort(gpu.start_us, kind="stable")
    start = gpu.start_us[order].astype(np.float64)
    dur = np.maximum(gpu.dur_us[order].astype(np.float64), 0.0)
    end = start + dur
    kind = np.clip(gpu.kind[order].astype(np.int64), 0, _KINDS - 1)
    stream = gpu.stream[order].astype(np.int64)
    ids = np.unique(stream)
    code = np.searchsorted(ids, stream)
    # a stream's role: the kind that takes most of its time; compute streams first
    time = np.bincount(code * _KINDS + kind, weights=dur, minlength=len(ids) * _KINDS)
    time = time.reshape(len(ids), _KINDS)
    role = time.argmax(axis=1) if len(ids) else np.zeros(0, np.int64)
    rank_of = np.lexsort((ids, role))  # by role, then stream id
    row_of_code = np.empty(len(ids), np.int64)
    row_of_code[rank_of] = np.arange(1, len(ids) + 1)
    row = row_of_code[code] if len(ids) else np.zeros(0, np.int64)
    base = float(start[0]) if len(start) else 0.0
    span = (float(end.max()) - base if len(end) else 0.0) + 1.0
    key = row * _KINDS + kind
    # already in time order: a stable sort on the small integer key keeps it per key
    small = np.int16 if (len(ids) + 1) * _KINDS < np.iinfo(np.int16).max else np.int64
    by_key = np.argsort(key.astype(small), kind="stable")
    s = (start[by_key] - base) + key[by_key] * span
    e = (end[by_key] - base) + key[by_key] * span
    if len(s):
        reach = np.maximum.accumulate(e)
        new = np.ones(len(s), bool)
        new[1:] = s[1:] > reach[:-1]
        first = np.flatnonzero(new)
        m_start, m_end = s[first], np.maximum.reduceat(e, first)
    else:
        m_start = m_end = np.zeros(0)
    m_len = m_end - m_start
    return RankKernels(
        start=start, end=end, kind=kind, row=row, order=order, gpu=gpu,
        names=list(gpu.names) or [""],
        streams=[int(ids[c]) for c in rank_of.tolist()],
        roles=[STREAM_ROLES[int(role[c])] for c in rank_of.tolist()],
        max_dur=float(dur.max()) if len(dur) else 0.0,
        merged_start=m_start, merged_len=m_len,
        merged_before=np.concatenate([[0.0], np.cumsum(m_len)]),
        base=base, span=span,
    )  # fmt: skip


def _column(values: np.ndarray, n: int, at: np.ndarray, missing: float) -> np.ndarray:
    """``values[at]``, or ``missing`` throughout when the reader did not fill the column
    (``n`` events)."""
    if len(values) == n:
        return values[at]
    return np.full(len(at), missing)


def _kernels_of(run: Run, rank: int) -> RankKernels:
    return run.memo(
        ("gpu_kernels", rank, id(run.gpu.get(rank))), lambda: rank_kernels(run.gpu[rank])
    )


@dataclass
class StreamLanes:
    """One rank's lanes (its CPU side as row 0, then one row per stream) and the GPU
    events of a window, as positions in ``kernels``."""

    kernels: RankKernels
    rows: list[dict[str, Any]]
    idx: np.ndarray


def stream_lanes(run: Run, rank: int, t0_us: float, t1_us: float) -> StreamLanes:
    """``rank``'s stream rows and the GPU events overlapping ``[t0_us, t1_us]``."""
    if rank not in run.gpu:
        raise ValueError(f"rank {rank} has no GPU activity in this run: no stream lanes")
    k = _kernels_of(run, rank)
    lo = int(np.searchsorted(k.start, t0_us - k.max_dur, side="left"))
    hi = int(np.searchsorted(k.start, t1_us, side="right"))
    idx = lo + np.flatnonzero(k.end[lo:hi] >= t0_us)
    host = f" ({run.hosts[rank]})" if rank in run.hosts else ""
    rows = [
        {"row": 0, "label": f"rank {rank}{host} CPU: collectives", "rank": rank,
         "tensor": None, "phase": None, "stream": None, "role": "cpu"},
    ] + [
        {"row": i + 1, "label": f"stream {sid}: {role}", "rank": rank, "tensor": None,
         "phase": None, "stream": sid, "role": role}
        for i, (sid, role) in enumerate(zip(k.streams, k.roles, strict=True))
    ]  # fmt: skip
    return StreamLanes(k, rows, idx)


def kernel_columns(run: Run, rank: int, lanes: StreamLanes) -> dict[str, list[Any]]:
    """The window's GPU events as columns: where and what (``row``, ``start_us``,
    ``dur_us``, ``phase``: ``gpu_<kind>``, ``kind``, ``stream``, ``name``, ``short_name``,
    ``bytes``) and their launch (``correlation``, ``launch_us``, ``launch_delay_us``, None
    when not recorded, and ``launched_in``: the collective the CPU was in)."""
    k, gpu = lanes.kernels, lanes.idx
    at, n = k.order[gpu], len(k.order)
    launch = _column(k.gpu.launch_us, n, at, np.nan)
    known = np.isfinite(launch).tolist()
    codes = _column(k.gpu.name, n, at, 0).astype(np.int64).tolist()
    if k.short_names is None:  # once per rank: a few hundred names, not one per kernel
        k.short_names = [short_kernel_name(x) for x in k.names]
    start = k.start[gpu].tolist()
    return {
        "row": k.row[gpu].tolist(),
        "start_us": start,
        "dur_us": (k.end[gpu] - k.start[gpu]).tolist(),
        "phase": [GPU_PHASES[c] for c in k.kind[gpu].tolist()],
        "name": [k.names[c] if 0 <= c < len(k.names) else "" for c in codes],
        "short_name": [k.short_names[c] if 0 <= c < len(k.names) else "" for c in codes],
        "bytes": _column(k.gpu.nbytes, n, at, -1).tolist(),
        "kind": [GPU_KIND_NAMES[c] for c in k.kind[gpu].tolist()],
        "stream": [k.streams[r - 1] for r in k.row[gpu].tolist()],
        "correlation": _column(k.gpu.correlation, n, at, -1).tolist(),
        "launch_us": [x if ok else None for x, ok in zip(launch.tolist(), known, strict=True)],
        "launch_delay_us": [
            (a - b) if ok else None for a, b, ok in zip(start, launch.tolist(), known, strict=True)
        ],
        "launched_in": _launched_in(run, rank, launch),
    }


def stream_extent(run: Run, rank: int) -> tuple[float, float]:
    """The run's span widened to ``rank``'s GPU activity: a kernel may run before the
    first CPU event read or after the last (the whole-run view must show every one)."""
    k = _kernels_of(run, rank) if rank in run.gpu else None
    if k is None or not len(k.start):
        return run.t0_us, run.t1_us
    return min(run.t0_us, float(k.start[0])), max(run.t1_us, float(k.end.max()))


def _launched_in(run: Run, rank: int, launch: np.ndarray) -> list[str]:
    """The collective the rank's CPU was in at each launch ("": none), as the rank row
    draws it: its wait (``negotiate``, from the ``c10d`` call on) or its ``c10d`` op.

    The innermost such slice that covers the launch: of the last :data:`_LOOK_BACK`
    slices begun before it, the latest begun that has not ended."""
    s = run.slices
    mine = np.flatnonzero((s.rank == rank) & ((s.phase == PHASE_OP) | (s.phase == PHASE_NEGOTIATE)))
    if not len(mine) or not len(launch):
        return [""] * len(launch)
    order = mine[np.argsort(s.start_us[mine], kind="stable")]
    starts = s.start_us[order]
    ends = starts + s.dur_us[order]
    safe = np.where(np.isfinite(launch), launch, -np.inf)
    last = np.searchsorted(starts, safe, side="right") - 1
    found = np.full(len(launch), -1, np.int64)
    for back in range(_LOOK_BACK):
        j = last - back
        ok = (found < 0) & (j >= 0) & (ends[np.maximum(j, 0)] >= safe)
        found[ok] = j[ok]
    out = []
    for j in found.tolist():
        if j < 0:
            out.append("")
            continue
        i = order[j]
        tensor = run.tensors[s.tensor[i]] if s.tensor[i] >= 0 else ""
        if s.phase[i] == PHASE_NEGOTIATE:
            out.append(f"{tensor or 'a collective'}, waiting for the other ranks")
            continue
        name = run.names[s.name[i]] if s.name[i] >= 0 else ""
        out.append(f"{tensor} ({name})" if tensor and name else tensor or name)
    return out


#: Slices begun before a launch that ``_launched_in`` looks at (collectives overlap a few
#: deep at most: a rank's waits for several tensors at once).
_LOOK_BACK = 8


def kernel_bins(lanes: StreamLanes, t0_us: float, t1_us: float, n_bins: int) -> dict[str, Any]:
    """Each stream row cut into ``n_bins`` bins: time per kind, busy, dominant, count
    (the columns of ``window._bins``, its phases being ``gpu_<kind>`` and ``idle``)."""
    k, idx, n_rows = lanes.kernels, lanes.idx, len(lanes.rows)
    width = (t1_us - t0_us) / n_bins if t1_us > t0_us else 1.0
    rows = k.row[idx]
    a = np.clip(k.start[idx], t0_us, t1_us)
    b = np.clip(k.end[idx], t0_us, t1_us)
    first = np.clip(np.floor((a - t0_us) / width).astype(np.int64), 0, n_bins - 1)
    last = np.clip(np.ceil((b - t0_us) / width).astype(np.int64) - 1, first, n_bins - 1)
    stride = n_bins + 1
    delta = np.bincount(rows * stride + first, minlength=n_rows * stride) - np.bincount(
        rows * stride + last + 1, minlength=n_rows * stride
    )
    counts = np.cumsum(delta.reshape(n_rows, stride), axis=1)[:, :n_bins]
    # covered time of each (row, kind) up to each bin edge, from the merged intervals
    # (clipped to the key's own stretch: an edge before the rank's first kernel or after
    # its last would read the neighbouring key's intervals)
    edges = np.clip(t0_us - k.base + np.arange(stride, dtype=np.float64) * width, 0.0, k.span - 1.0)
    q = (np.arange(n_rows * _KINDS, dtype=np.float64) * k.span)[:, None] + edges[None, :]
    if len(k.merged_start):
        j = np.maximum(np.searchsorted(k.merged_start, q, side="right") - 1, 0)
        covered = k.merged_before[j] + np.clip(q - k.merged_start[j], 0.0, k.merged_len[j])
    else:
        covered = np.zeros_like(q)
    busy = np.clip(np.diff(covered, axis=1).reshape(n_rows, _KINDS, n_bins), 0.0, width)
    return bucket_table(busy, counts, width, t0_us, [*GPU_PHASES, IDLE])


def joined_bins(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """Two bucket tables as one (each's ``phase_us`` padded with zeros for the other's)."""
    n1, n2 = len(first["row"]), len(second["row"])
    out = {
        key: first[key] + second[key]
        for key in ("row", "start_us", "dur_us", "phase", "count", "busy_us")
    }
    phase_us: dict[str, list[float]] = {}
    for name in [*first["phase_us"], *second["phase_us"]]:
        phase_us[name] = first["phase_us"].get(name, [0.0] * n1) + second["phase_us"].get(
            name, [0.0] * n2
        )
    out["phase_us"] = phase_us
    return out
