"""Merging a run's per-rank timelines, and torch.profiler traces, into one file.

Per-rank files are already on rank 0's clock, so ranks only need distinct, ordered process
ids (``pid = rank``). torch.profiler (Kineto) traces carry wall-clock time instead:
``baseTimeNanoseconds`` (top level, Unix ns) plus ``ts`` in microseconds relative to it
(checked against torch 2.13's ``export_chrome_trace``; a trace without the key is taken to
hold absolute Unix microseconds, as older Kineto wrote). Each rank's manifest pairs a wall
clock reading with a reading of that rank's own clock, which maps the profiler's events
onto the same timeline as the collectives, so the backward pass and its allreduces line up.

Which rank a torch.profiler trace belongs to, in order of precedence:

1. an explicit ``RANK=PATH`` argument (e.g. ``--kineto 1=trace.json``);
2. the trace's own ``distributedInfo.rank`` (present when torch.distributed was initialised);
3. the file name: ``rank`` or ``worker`` followed by the number, e.g. ``*rank1*``,
   ``*rank_1*``, ``*Rank.1*``, ``*worker-1*`` (case-insensitive,
   :data:`hvdprof.trace.manifest.RANK_IN_NAME`);
4. the only rank, when the run has a single rank.

A trace that matches none, or a rank without a manifest, is left out and reported.
"""

from __future__ import annotations

import gzip
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hvdprof.common import activities as act
from hvdprof.timeline.writer import dumps_event
from hvdprof.trace import manifest as trace_manifest
from hvdprof.trace.chrome_json import Trace, TraceDirectory, load_trace, load_traces
from hvdprof.trace.manifest import RANK_IN_NAME

#: torch.profiler processes of rank r get pids KINETO_PID_BASE + r * KINETO_PIDS_PER_RANK + i.
KINETO_PID_BASE = 1_000_000
KINETO_PIDS_PER_RANK = 1000

_EXPLICIT = re.compile(r"^(\d+)=(.+)$")
_DROPPED_META = {"process_name", "process_sort_index", "process_labels"}


@dataclass
class MergeResult:
    """What :func:`merge_directory` wrote, and what it had to leave out."""

    output: str
    ranks: list[int] = field(default_factory=list)
    events: int = 0
    events_per_rank: dict[int, int] = field(default_factory=dict)
    #: torch.profiler trace path -> (rank, events merged)
    kineto: dict[str, tuple[int, int]] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    #: (file, line, reason) for every event not merged
    skipped: list[tuple[str, int, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    #: largest clock-offset error bound over the ranks, in microseconds (None: unknown)
    max_clock_error_us: float | None = None

    def __str__(self) -> str:
        lines = [
            f"merged {len(self.ranks)} rank timeline(s)"
            + (f" and {len(self.kineto)} torch.profiler trace(s)" if self.kineto else "")
            + f" into {self.output}",
            f"  events: {self.events}",
        ]
        for rank, count in sorted(self.events_per_rank.items()):
            lines.append(f"    rank {rank}: {count}")
        for path, (rank, count) in self.kineto.items():
            lines.append(f"    rank {rank} torch.profiler ({os.path.basename(path)}): {count}")
        if self.max_clock_error_us is not None:
            lines.append(
                f"  ranks aligned to rank 0's clock within +/- {self.max_clock_error_us:.1f} us"
            )
        lines.append(f"  inputs: {len(self.files)} file(s)")
        lines.append(f"  skipped: {len(self.skipped)}")
        for path, line, reason in self.skipped[:20]:
            where = f":{line}" if line else ""
            lines.append(f"    {os.path.basename(path)}{where}: {reason}")
        if len(self.skipped) > 20:
            lines.append(f"    ... and {len(self.skipped) - 20} more")
        for problem in self.problems:
            lines.append(f"  note: {problem}")
        return "\n".join(lines)


def kineto_rank(path: str, trace: Trace, run: TraceDirectory) -> int | None:
    """The rank a torch.profiler trace belongs to (rules 2 to 4 of the module docstring)."""
    info = trace.metadata.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        return info["rank"]
    match = RANK_IN_NAME.search(os.path.basename(path))
    if match:
        return int(match.group(1))
    if len(run.ranks) == 1:
        return next(iter(run.ranks))
    return None


def kineto_shift_us(trace: Trace, manifest: dict[str, Any]) -> float:
    """Microseconds to add to a torch.profiler ``ts`` to put it on the run's timeline."""
    base_ns = int(trace.metadata.get("baseTimeNanoseconds", 0) or 0)
    return trace_manifest.kineto_shift_us(base_ns, manifest)


def merge_directory(
    directory: str,
    output: str,
    kineto_traces: Sequence[str] = (),
) -> MergeResult:
    """Merge ``directory``'s per-rank timelines (and torch.profiler traces) into ``output``.

    ``output`` is one strictly valid JSON trace (gzipped when it ends in ``.gz``) with one
    process per rank, ``pid = rank``, then each rank's torch.profiler processes right below
    it. Nothing is dropped silently: unreadable events and unmatched traces are listed in
    the result.
    """
    run = load_traces(directory)
    result = MergeResult(output=os.fspath(output))
    result.problems += run.problems
    merged: list[dict[str, Any]] = []
    errors = []

    for rank, rank_trace in sorted(run.ranks.items()):
        result.ranks.append(rank)
        result.files.append(rank_trace.trace_path)
        result.skipped += [
            (rank_trace.trace_path, s.line, s.reason) for s in rank_trace.trace.skipped
        ]
        result.problems += [
            f"{os.path.basename(rank_trace.trace_path)}: {n}" for n in rank_trace.trace.notes
        ]
        count = 0
        for event in rank_trace.trace.events:
            if event.get("ph") == "M" and event.get("name") == "process_sort_index":
                continue
            event["pid"] = rank
            merged.append(event)
            count += 1
        merged.append(_meta("process_sort_index", rank, {"sort_index": 2 * rank}))
        result.events_per_rank[rank] = count
        clock = rank_trace.manifest.clock if rank_trace.manifest is not None else None
        if rank == 0 or (clock is not None and clock.samples):
            errors.append((clock.error_ns if clock is not None else 0) / 1000.0)
        elif rank_trace.manifest is not None:
            result.problems.append(
                f"rank {rank}: its clock offset to rank 0 was never estimated; assumed zero"
                " (right when all ranks share one host's monotonic clock)"
            )
    if errors:
        result.max_clock_error_us = max(errors)

    for spec in kineto_traces:
        _merge_kineto(os.fspath(spec), run, merged, result)

    _write_trace(result.output, merged, _other_data(run, result))
    result.events = len(merged)
    return result


def _meta(name: str, pid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": pid, "tid": 0, "args": args}


def _merge_kineto(
    spec: str, run: TraceDirectory, merged: list[dict[str, Any]], result: MergeResult
) -> None:
    explicit = _EXPLICIT.match(spec)
    path = explicit.group(2) if explicit and not os.path.exists(spec) else spec
    try:
        trace = load_trace(path)
    except OSError as exc:
        result.problems.append(f"torch.profiler trace {path}: cannot read ({exc.strerror or exc})")
        return
    result.files.append(path)
    result.skipped += [(path, s.line, s.reason) for s in trace.skipped]
    rank = int(explicit.group(1)) if explicit and path != spec else kineto_rank(path, trace, run)
    if rank is None:
        result.problems.append(
            f"torch.profiler trace {path}: cannot tell its rank (no distributedInfo, no 'rank<r>' "
            "in the file name); pass it as RANK=PATH. Not merged."
        )
        return
    rank_trace = run.ranks.get(rank)
    if rank_trace is None or rank_trace.manifest is None:
        result.problems.append(
            f"torch.profiler trace {path}: rank {rank} has no timeline manifest to align it with. Not merged."
        )
        return
    if "baseTimeNanoseconds" not in trace.metadata:
        result.problems.append(
            f"torch.profiler trace {path}: no baseTimeNanoseconds; assuming ts are Unix microseconds"
        )
    shift = kineto_shift_us(trace, rank_trace.manifest)
    pids: dict[Any, int] = {}
    names: dict[Any, str] = {}
    count = 0
    for event in trace.events:
        old_pid = event.get("pid", 0)
        if old_pid not in pids:
            pids[old_pid] = KINETO_PID_BASE + rank * KINETO_PIDS_PER_RANK + len(pids)
        if event.get("ph") == "M" and event.get("name") in _DROPPED_META:
            if event.get("name") == "process_name":
                names[old_pid] = str((event.get("args") or {}).get("name", old_pid))
            continue
        event["pid"] = pids[old_pid]
        ts = event.get("ts")
        if isinstance(ts, (int, float)) and not isinstance(ts, bool):
            event["ts"] = round(ts + shift, 3)
        merged.append(event)
        count += 1
    for old_pid, new_pid in pids.items():
        name = act.profiler_process_name(rank)
        if len(pids) > 1:
            name += f" ({names.get(old_pid, old_pid)})"
        merged.append(_meta("process_name", new_pid, {"name": name}))
        merged.append(_meta("process_sort_index", new_pid, {"sort_index": 2 * rank + 1}))
    result.kineto[path] = (rank, count)


def _other_data(run: TraceDirectory, result: MergeResult) -> dict[str, Any]:
    return {
        "merged_by": "hvdprof timeline merge",
        "ranks": result.ranks,
        "clock_error_us": {
            str(r): (rt.manifest.clock.error_ns if rt.manifest is not None else 0) / 1000.0
            for r, rt in sorted(run.ranks.items())
        },
        "kineto": {path: rank for path, (rank, _) in result.kineto.items()},
    }


def _write_trace(path: str, events: list[dict[str, Any]], other: dict[str, Any]) -> None:
    """Write ``{"traceEvents": [...]}`` with one event per line, atomically."""
    tmp = f"{path}.tmp.{os.getpid()}"
    opener = gzip.open if path.endswith(".gz") else open
    with opener(tmp, "wt", encoding="utf-8") as f:  # type: ignore[operator]
        f.write('{"displayTimeUnit":"ms","otherData":')
        f.write(json.dumps(other, separators=(",", ":"), default=str))
        f.write(',"traceEvents":[\n')
        last = len(events) - 1
        for i, event in enumerate(events):
            f.write(dumps_event(event))
            f.write(",\n" if i != last else "\n")
        f.write("]}\n")
    os.replace(tmp, path)
