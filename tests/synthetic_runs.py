"""Synthetic hvdprof runs with known answers, for the tests and the benchmarks.

:func:`write_synthetic_run` writes ``rank.<r>.json`` through hvdprof's own trace writer
(:class:`hvdprof.timeline.writer.TimelineWriter`: the file's framing, one event per line
and the closing event are the recorder's, not a copy of them) and ``manifest.rank.<r>.json``
beside it (a typed :class:`hvdprof.trace.manifest.Manifest`, written by the recorder's
:func:`hvdprof.timeline.manifest.write_manifest`), with the events the renderer writes for
a collective, a straggler late by a known amount, a known fusion pattern, collectives at a
known bandwidth and, optionally, torch.profiler (Kineto) traces whose backward compute
overlaps a known fraction of the communication. Everything about the run is chosen here,
so a test can compare an analysis with the truth instead of with a recorded number.

It lives with the tests, not in the package: no command of hvdprof's uses it, and a user
installing hvdprof has no use for it. The tests import it from here (pytest puts
``tests/`` on the path, as for ``dashboard_support``); the benchmarks that need a run of a
chosen size (``analysis_bench.py``, ``dashboard_bench.py``) put ``tests/`` on theirs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import msgspec
import orjson

from hvdprof.common import activities as act
from hvdprof.timeline.manifest import write_manifest
from hvdprof.timeline.writer import TimelineWriter
from hvdprof.trace.manifest import (
    Manifest,
    ManifestClock,
    ManifestConfig,
    manifest_filename,
    trace_filename,
)

#: one event, as the writer takes it
Event = dict[str, Any]

#: A fixed wall-clock instant for the synthetic manifests (ns since the epoch).
START_UNIX_NS = 1_790_000_000_000_000_000
#: The synthetic ranks' local clock at that instant (ns).
START_LOCAL_NS = 1_000_000_000


@dataclass
class SyntheticSpec:
    """What the synthetic run looks like (all times in microseconds)."""

    ranks: int = 4
    steps: int = 20
    tensors: int = 10  # float32 gradients per step, fused in order
    tensor_bytes: int = 1 << 20
    group_size: int = 4  # tensors per fused group (the last group may be smaller)
    odd_dtype_tensor: bool = False  # one float16 tensor per step, alone in its group
    step_us: float = 20_000.0
    submit_gap_us: float = 20.0  # between consecutive tensors' submissions
    late_rank: int | None = None
    late_us: float = 0.0  # late_rank becomes ready this much after the others
    #: write each rank's ``waited for collectives`` counter (its training thread got
    #: control back 10 us before its step's first submission)
    waited: bool = False
    #: late_rank's lateness is its wake-up (its counter is late too): not its own work
    late_wakeup: bool = False
    cycle_us: float = 50.0  # from the last rank ready to negotiated
    queue_us: float = 10.0
    memcpy_us: float = 30.0
    algbw_gbps: float = 2.0  # collective time = group bytes / this
    backend: str = "SHM"
    threshold_bytes: int = 64 << 20
    autotune_samples: int = 0  # AUTOTUNE_PARAMS + AUTOTUNE_SAMPLE pairs on rank 0
    kineto_overlap: float | None = None  # write Kineto traces with this overlap fraction
    host: str = "synth"


@dataclass
class SyntheticTruth:
    """What an analysis should find in the run written."""

    directory: str
    events: int = 0
    groups_per_step: list[int] = field(default_factory=list)  # tensors in each group
    kineto_paths: list[str] = field(default_factory=list)
    sample_windows: list[tuple[float, float]] = field(default_factory=list)


def _groups(spec: SyntheticSpec) -> list[list[int]]:
    idx = list(range(spec.tensors))
    groups = [idx[i : i + spec.group_size] for i in range(0, len(idx), spec.group_size)]
    if spec.odd_dtype_tensor:
        groups.append([spec.tensors])
    return groups


def _t(x: float) -> float:
    """A time as the renderer writes it: microseconds to the nanosecond."""
    return round(x, 3)


def write_synthetic_run(directory: str, spec: SyntheticSpec) -> SyntheticTruth:
    """Write the run into ``directory`` (created); return what is known about it."""
    os.makedirs(directory, exist_ok=True)
    truth = SyntheticTruth(directory)
    groups = _groups(spec)
    truth.groups_per_step = [len(g) for g in groups]
    n_tensors = spec.tensors + (1 if spec.odd_dtype_tensor else 0)
    names = [f"allreduce.layer{i}.grad" for i in range(n_tensors)]
    t_origin = START_LOCAL_NS / 1000.0 + 1000.0
    every = max(spec.steps // spec.autotune_samples, 1) if spec.autotune_samples else 1
    for rank in range(spec.ranks):
        lines = _header_lines(spec, rank, names, t_origin)
        kineto: list[dict[str, object]] = []
        sample = 0
        for step in range(spec.steps):
            t_step = t_origin + step * spec.step_us
            if (
                rank == 0
                and spec.autotune_samples
                and step % every == 0
                and sample < spec.autotune_samples
            ):
                lines += _autotune_lines(spec, step, sample, t_step, truth)
                sample += 1
            if spec.waited and step > 0:
                woke = t_step - 10.0
                if rank == spec.late_rank and spec.late_wakeup:
                    woke += spec.late_us
                lines.append(
                    {
                        "name": act.COUNTER_WAITED,
                        "ph": "C",
                        "ts": _t(woke),
                        "pid": rank,
                        "tid": 0,
                        "args": {"value": _t(spec.step_us / 2000.0)},
                    }
                )
            _step_lines(spec, rank, t_step, step * len(groups), groups, names, lines, kineto)
        truth.events += len(lines) + 1  # (and the writer's closing event)
        _write_rank(directory, spec, rank, lines)
        if spec.kineto_overlap is not None:
            truth.kineto_paths.append(_write_kineto(directory, rank, kineto))
    return truth


def _meta(rank: int, tid: int, what: str, name: str) -> Event:
    return {"name": what, "ph": "M", "pid": rank, "tid": tid, "args": {"name": name}}


def _header_lines(spec: SyntheticSpec, rank: int, names: list[str], t_origin: float) -> list[Event]:
    """A rank file's metadata (process and lane names) and its fusion threshold."""
    lines = [_meta(rank, 0, "process_name", f"rank {rank} ({spec.host})")]
    for tid, lane in act.LANE_NAMES.items():
        lines.append(_meta(rank, tid, "thread_name", lane))
    for i, name in enumerate(names):
        lines.append(_meta(rank, act.FIRST_TENSOR_LANE + i, "thread_name", name))
    mib = float(f"{spec.threshold_bytes / 1048576:.6g}")
    lines.append(
        {
            "name": act.COUNTER_FUSION_THRESHOLD,
            "ph": "C",
            "ts": _t(t_origin),
            "pid": rank,
            "tid": 0,
            "args": {"value": int(mib) if mib.is_integer() else mib},
        }
    )
    return lines


def _autotune_lines(
    spec: SyntheticSpec, step: int, sample: int, t_step: float, truth: SyntheticTruth
) -> list[Event]:
    """Rank 0's parameters and score of one autotune sample (its window into ``truth``)."""
    threshold = (1 << 20) << sample
    t_end = t_step + spec.step_us * max(spec.steps // spec.autotune_samples, 1) - 2
    truth.sample_windows.append((t_step - 1, t_end))
    params = {"fusion_threshold_bytes": threshold, "cycle_time_ms": 1.0, "cache_enabled": True}
    return [
        {
            "name": act.AUTOTUNE_PARAMS,
            "ph": "i",
            "s": "p",
            "ts": _t(t_step - 1),
            "pid": 0,
            "tid": 0,
            "args": {"cycle": step, **params},
        },
        {
            "name": act.AUTOTUNE_SAMPLE,
            "ph": "i",
            "s": "t",
            "ts": _t(t_end),
            "pid": 0,
            "tid": act.LANE_AUTOTUNE,
            "args": {
                **params,
                "score": round(1e6 * (sample + 1), 1),
                "first_step": step,
                "last_step": step + 1,
                "is_best": False,
                "phase": "tune",
            },
        },
    ]


def _step_lines(
    spec: SyntheticSpec,
    rank: int,
    t_step: float,
    group_id: int,
    groups: list[list[int]],
    names: list[str],
    lines: list[Event],
    kineto: list[dict[str, object]],
) -> None:
    """One step's slices on ``rank``: every tensor submitted, negotiated once the last
    rank is ready, then the groups one after another (``group_id``: the step's first)."""
    n_tensors = len(names)
    submit = [t_step + i * spec.submit_gap_us for i in range(n_tensors)]
    ready_all = [
        [submit[i] + (spec.late_us if r == spec.late_rank else 0.0) for r in range(spec.ranks)]
        for i in range(n_tensors)
    ]
    negotiated = max(max(x) for x in ready_all) + spec.cycle_us
    cursor = negotiated
    for group in groups:
        gbytes = sum(
            spec.tensor_bytes // 2 if t == spec.tensors else spec.tensor_bytes for t in group
        )
        fused = len(group) > 1
        q0, q1 = negotiated, cursor + spec.queue_us
        m_in = (q1, q1 + spec.memcpy_us) if fused else None
        c0 = m_in[1] if m_in else q1
        c1 = c0 + gbytes / (spec.algbw_gbps * 1e3)
        m_out = (c1, c1 + spec.memcpy_us) if fused else None
        end = m_out[1] if m_out else c1
        cursor = end
        if spec.kineto_overlap is not None:
            kineto.append({"ts": c0, "dur": (c1 - c0) * spec.kineto_overlap})
        for t in group:
            dtype = "float16" if t == spec.tensors else "float32"
            nbytes = spec.tensor_bytes // 2 if t == spec.tensors else spec.tensor_bytes
            ready = ready_all[t]
            own = ready[rank]
            last = max(range(spec.ranks), key=lambda r, ready=ready: ready[r])
            where = {"pid": rank, "tid": act.FIRST_TENSOR_LANE + t}
            # as the renderer writes them: the rank's own mark, the last rank named
            lines.append(
                {"name": f"{act.READY_PREFIX}{rank}", "ph": "i", "s": "t", "ts": _t(own), **where}
            )
            lines.append(
                _slice(
                    "NEGOTIATE_ALLREDUCE",
                    own,
                    negotiated,
                    where,
                    {
                        "tensor": names[t],
                        "cached": True,
                        "ready_us": {str(rank): _t(own)},
                        "last_ready_rank": last,
                        "last_ready_us": _t(ready[last]),
                    },
                )
            )
            op_args = {
                "tensor": names[t],
                "dtype": dtype,
                "shape": [nbytes // 4],
                "bytes": nbytes,
                "cached": True,
                "group": group_id,
                "group_tensors": len(group),
                "group_bytes": gbytes,
                "group_buffer_bytes": gbytes if fused else 0,
                "backend": spec.backend,
            }
            lines.append(_slice("ALLREDUCE", negotiated, end, where, op_args))
            lines.append(_slice("QUEUE", q0, q1, where))
            if m_in:
                lines.append(_slice("MEMCPY_IN_FUSION_BUFFER", *m_in, where))
            lines.append(_slice(f"{spec.backend}_ALLREDUCE", c0, c1, where))
            if m_out:
                lines.append(_slice("MEMCPY_OUT_FUSION_BUFFER", *m_out, where))
        group_id += 1


def _slice(name: str, t0: float, t1: float, where: Event, args: Event | None = None) -> Event:
    """A complete event (``ph: X``) from ``t0`` to ``t1``, its ``args`` before the lane
    when it has them, as the renderer orders an op's keys."""
    event: Event = {"name": name, "ph": "X", "ts": _t(t0), "dur": _t(t1 - t0)}
    if args is not None:
        event["args"] = args
    return event | where


def _write_rank(directory: str, spec: SyntheticSpec, rank: int, lines: list[Event]) -> None:
    """The rank's trace file, written by the recorder's writer, and its manifest."""
    path = os.path.join(directory, trace_filename(rank))
    writer = TimelineWriter(path, background=False, queue_size=len(lines) + 1)
    for event in lines:
        writer.put_event(event)
    end = {"events_written": len(lines), "events_dropped": 0}
    writer.close({"name": act.TRACE_END, "ph": "M", "pid": rank, "tid": 0, "args": end})
    if writer.events_dropped or writer.write_failed:
        raise OSError(f"{path}: the synthetic run could not be written whole")
    manifest = Manifest(
        run_id="synthetic",
        rank=rank,
        size=spec.ranks,
        hostname=spec.host,
        start_unix_ns=START_UNIX_NS,
        start_local_ns=START_LOCAL_NS,
        clock=ManifestClock(samples=1),
        config=ManifestConfig(fusion_threshold_bytes=spec.threshold_bytes, cycle_time_ms=1.0),
        events_written=len(lines) + 1,
        closed=True,
        trace_file=trace_filename(rank),
    )
    write_manifest(os.path.join(directory, manifest_filename(rank)), msgspec.to_builtins(manifest))


def _write_kineto(directory: str, rank: int, compute: list[dict[str, object]]) -> str:
    """A torch.profiler-style trace whose backward ops cover the given spans."""
    shift = START_LOCAL_NS / 1000.0  # timeline us = kineto ts + shift (see merge.kineto_shift_us)
    events: list[dict[str, object]] = [
        {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "python"}}
    ]
    for i, span in enumerate(compute):
        ts = float(span["ts"]) - shift  # type: ignore[arg-type]
        events.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": f"autograd::engine::evaluate_function: AddmmBackward0 #{i}",
                "pid": 1,
                "tid": 1,
                "ts": round(ts, 3),
                "dur": round(float(span["dur"]), 3),  # type: ignore[arg-type]
            }
        )
        # forward work that must not count: placed right before the collective
        events.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "aten::addmm",
                "pid": 1,
                "tid": 1,
                "ts": round(ts - 5.0, 3),
                "dur": 4.0,
            }
        )
    trace = {
        "schemaVersion": 1,
        "distributedInfo": {"rank": rank, "world_size": 0},
        "baseTimeNanoseconds": START_UNIX_NS,
        "traceEvents": events,
    }
    path = os.path.join(directory, f"kineto.rank{rank}.pt.trace.json")
    with open(path, "wb") as f:
        f.write(orjson.dumps(trace))
    return path
