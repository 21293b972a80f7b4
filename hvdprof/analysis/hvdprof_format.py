"""Streaming parser of hvdprof's own per-rank timeline files into columns.

hvdprof's writer emits one event per line, so a file is read in blocks of whole lines:
each block is parsed by orjson as one array (a corrupt block falls back to line by line,
so one bad line costs one line), and each event is appended to plain Python lists of
column values, never kept as a dict. The parser keeps its state (lanes, open ops, the
occurrence count of every tensor) between blocks, which is what lets
:meth:`hvdprof.analysis.Run.refresh` read only the bytes appended since the last read.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from hvdprof.analysis.model import (
    MARK_COLUMNS,
    PHASE_CYCLE,
    PHASE_NEGOTIATE,
    PHASE_OP,
    SLICE_COLUMNS,
    AutotuneSample,
    ParamsChange,
    Problem,
    classify,
)
from hvdprof.timeline import activities as act

_NO_CTX = (-1, -1, -1, -1, 0, -1, -1, -1, -1, -1)


class Interner:
    """A string table: ``code(s)`` gives a stable small int for ``s``."""

    def __init__(self, items: list[str] | None = None) -> None:
        self.items: list[str] = []
        self.index: dict[str, int] = {}
        for item in items or ():
            self.code(item)

    def code(self, text: str) -> int:
        found = self.index.get(text)
        if found is None:
            found = self.index[text] = len(self.items)
            self.items.append(text)
        return found


class Tables:
    """The string tables shared by every file of a run (so codes agree across ranks)."""

    def __init__(self) -> None:
        self.tensors = Interner()
        self.names = Interner()
        self.backends = Interner()
        self.dtypes = Interner()


class Columns:
    """Rows parsed so far from one file, as numpy chunks plus the rows of the current block."""

    def __init__(self) -> None:
        self.slice_chunks: list[dict[str, np.ndarray]] = []
        self.mark_chunks: list[dict[str, np.ndarray]] = []
        self.rows = 0  # slice rows in the chunks
        self.samples: list[AutotuneSample] = []
        self.params: list[ParamsChange] = []
        self.counters: dict[str, list[tuple[int, float, float]]] = {}

    def slices(self) -> dict[str, np.ndarray]:
        return _concat(self.slice_chunks, SLICE_COLUMNS)

    def marks(self) -> dict[str, np.ndarray]:
        return _concat(self.mark_chunks, MARK_COLUMNS)


def _concat(chunks: list[dict[str, np.ndarray]], spec: dict[str, Any]) -> dict[str, np.ndarray]:
    if not chunks:
        return {k: np.zeros(0, dt) for k, dt in spec.items()}
    if len(chunks) == 1:
        return dict(chunks[0])
    return {k: np.concatenate([c[k] for c in chunks]) for k in spec}


class HvdprofFileParser:
    """State of one ``rank.<r>.json`` being read, block by block."""

    def __init__(self, path: str, rank: int, tables: Tables) -> None:
        self.path = path
        self.rank = rank
        self.t = tables
        self.cols = Columns()
        self.problems: list[Problem] = []
        self.events = 0
        self.started = False  # the opening '[' was seen
        self.closed = False  # the closing ']' was seen
        self.host: str | None = None
        self.trace_end: dict[str, Any] | None = None
        self._lane_tensor: dict[int, int] = {}
        self._ctx: dict[int, tuple[int, ...]] = {}  # tid -> context of its open op
        self._occ: dict[int, int] = {}  # tensor code -> occurrences seen
        self._after_negotiate: dict[int, bool] = {}  # tid -> the next op continues it
        self._name_info: dict[str, tuple[int, int, int]] = {}
        self._reset_block()

    # --- block handling -------------------------------------------------------------------

    def _reset_block(self) -> None:
        self._s: dict[str, list[Any]] = {k: [] for k in SLICE_COLUMNS}
        self._m: dict[str, list[Any]] = {k: [] for k in MARK_COLUMNS}

    def _flush_block(self) -> None:
        s = self._s
        n = len(s["rank"])
        if n:
            self.cols.slice_chunks.append(
                {k: np.asarray(v, dtype=SLICE_COLUMNS[k]) for k, v in s.items()}
            )
            self.cols.rows += n
        if self._m["tensor"]:
            self.cols.mark_chunks.append(
                {k: np.asarray(v, dtype=MARK_COLUMNS[k]) for k, v in self._m.items()}
            )
        self._reset_block()

    def feed(self, data: bytes, first_line: int) -> None:
        """Parse ``data``: whole lines of the file starting at 1-based line ``first_line``."""
        body = data.strip()
        line = first_line + data[: len(data) - len(data.lstrip())].count(b"\n")
        if not self.started:
            if body.startswith(b"["):
                self.started = True
                body = body[1:].lstrip()
                line += 1
            elif body:
                self.problems.append(
                    Problem(self.path, "line 1", "not a JSON array: not an hvdprof timeline")
                )
                self.closed = True  # nothing more will be read from this file
                return
        if not body:
            return
        if self.closed:
            self.problems.append(
                Problem(self.path, f"line {first_line}", "data after the closing ']' ignored")
            )
            return
        closing = False
        if body.endswith(b"]"):
            body = body[:-1].rstrip()
            closing = True
        body = body.rstrip(b",")
        try:
            events = orjson.loads(b"[" + body + b"]") if body else []
        except orjson.JSONDecodeError:
            events = None
        if events is not None:
            self._events(events, line)
        else:
            self._lines(body, line)
        self._flush_block()
        if closing:
            self.closed = True

    def _lines(self, body: bytes, line: int) -> None:
        """Slow path for a block with a bad line: parse each line alone."""
        for offset, raw in enumerate(body.split(b"\n")):
            text = raw.strip().rstrip(b",")
            if not text:
                continue
            try:
                event = orjson.loads(text)
            except orjson.JSONDecodeError as exc:
                self.problems.append(
                    Problem(self.path, f"line {line + offset}", f"invalid JSON ({exc}); skipped")
                )
                continue
            self._events([event], line + offset)

    # --- events ---------------------------------------------------------------------------

    def _info(self, name: str) -> tuple[int, int, int]:
        info = self._name_info.get(name)
        if info is None:
            phase, op = classify(name)
            info = self._name_info[name] = (phase, op, self.t.names.code(name))
        return info

    def _events(self, events: list[Any], line: int) -> None:
        s = self._s
        rank = self.rank
        info_of = self._name_info
        ctx_of = self._ctx
        for i, e in enumerate(events):
            try:
                ph = e["ph"]
                if ph == "X":
                    name = e["name"]
                    info = info_of.get(name) or self._info(name)
                    phase = info[0]
                    tid = e.get("tid", 0)
                    start = float(e["ts"])
                    dur = float(e.get("dur", 0.0))
                    if phase in (PHASE_OP, PHASE_NEGOTIATE):
                        ctx = self._op_slice(e, tid, phase, info[1], start)
                    elif phase == PHASE_CYCLE:
                        ctx = _NO_CTX
                    else:
                        ctx = ctx_of.get(tid) or self._lane_ctx(tid)
                    s["rank"].append(rank)
                    s["tensor"].append(ctx[0])
                    s["name"].append(info[2])
                    s["phase"].append(phase)
                    s["op"].append(info[1] if info[1] >= 0 else ctx[1])
                    s["start_us"].append(start)
                    s["dur_us"].append(dur)
                    s["bytes"].append(ctx[2])
                    s["group"].append(ctx[3])
                    s["group_tensors"].append(ctx[4])
                    s["group_bytes"].append(ctx[5])
                    s["buffer_bytes"].append(ctx[6])
                    s["backend"].append(ctx[7])
                    s["dtype"].append(ctx[8])
                    s["cached"].append(ctx[9])
                    s["occurrence"].append(self._occ.get(ctx[0], 0) - 1 if ctx[0] >= 0 else -1)
                elif ph == "C":
                    args = e.get("args") or {}
                    value = args.get("value")
                    if value is None and args:
                        value = next(iter(args.values()))
                    self.cols.counters.setdefault(e["name"], []).append(
                        (rank, float(e["ts"]), float(value))
                    )
                elif ph == "i" or ph == "I":
                    self._instant(e)
                elif ph == "M":
                    self._meta(e)
                elif not isinstance(ph, str):
                    raise TypeError("'ph' is not a string")
                self.events += 1
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                what = (
                    "not a JSON object" if not isinstance(e, dict) else f"unusable event ({exc!r})"
                )
                self.problems.append(Problem(self.path, f"line {line + i}", what))

    def _lane_ctx(self, tid: int) -> tuple[int, ...]:
        tensor = self._lane_tensor.get(tid, -1)
        return (tensor, -1, -1, -1, 0, -1, -1, -1, -1, -1)

    def _op_slice(self, e: dict[str, Any], tid: int, phase: int, op: int, start: float) -> tuple:
        args = e.get("args") or {}
        tname = args.get("tensor")
        tensor = (
            self.t.tensors.code(tname) if isinstance(tname, str) else self._lane_tensor.get(tid, -1)
        )
        cached = args.get("cached")
        cached_code = -1 if cached is None else int(bool(cached))
        if phase == PHASE_NEGOTIATE:
            self._occ[tensor] = self._occ.get(tensor, 0) + 1
            self._after_negotiate[tid] = True
            ready = args.get("ready_us")
            if isinstance(ready, dict):
                row = self.cols.rows + len(self._s["rank"])
                m = self._m
                for r, ts in ready.items():
                    m["observer"].append(self.rank)
                    m["tensor"].append(tensor)
                    m["ts_us"].append(float(ts))
                    m["ready_rank"].append(int(r))
                    m["slice"].append(row)
            prev = self._ctx.get(tid)
            # negotiation rows carry the tensor's last known size for hover
            if prev is not None and prev[0] == tensor:
                return (tensor, op, prev[2], -1, 0, -1, -1, -1, prev[8], cached_code)
            return (tensor, op, -1, -1, 0, -1, -1, -1, -1, cached_code)
        if not self._after_negotiate.pop(tid, False):
            self._occ[tensor] = self._occ.get(tensor, 0) + 1
        backend = args.get("backend")
        dtype = args.get("dtype")
        ctx = (
            tensor,
            op,
            int(args.get("bytes", -1)),
            int(args.get("group", -1)),
            int(args.get("group_tensors", 0)),
            int(args.get("group_bytes", -1)),
            int(args.get("group_buffer_bytes", -1)),
            self.t.backends.code(backend) if isinstance(backend, str) else -1,
            self.t.dtypes.code(dtype) if isinstance(dtype, str) else -1,
            cached_code,
        )
        self._ctx[tid] = ctx
        return ctx

    def _instant(self, e: dict[str, Any]) -> None:
        name = e.get("name")
        args = e.get("args") or {}
        if name == act.AUTOTUNE_SAMPLE:
            self.cols.samples.append(
                AutotuneSample(
                    ts_us=float(e["ts"]),
                    fusion_threshold_bytes=int(args["fusion_threshold_bytes"]),
                    cycle_time_ms=float(args["cycle_time_ms"]),
                    cache_enabled=bool(args["cache_enabled"]),
                    score_bytes_per_s=float(args["score"]),
                    first_step=int(args.get("first_step", -1)),
                    last_step=int(args.get("last_step", -1)),
                    is_best=bool(args.get("is_best", False)),
                    phase=str(args.get("phase", "")),
                    rank=self.rank,
                )
            )
        elif name == act.AUTOTUNE_PARAMS:
            self.cols.params.append(
                ParamsChange(
                    ts_us=float(e["ts"]),
                    fusion_threshold_bytes=int(args["fusion_threshold_bytes"]),
                    cycle_time_ms=float(args["cycle_time_ms"]),
                    cache_enabled=bool(args["cache_enabled"]),
                    rank=self.rank,
                )
            )
        # READY instants repeat the negotiate slice's ready_us args (clamped): not needed

    def _meta(self, e: dict[str, Any]) -> None:
        name = e.get("name")
        args = e.get("args") or {}
        if name == "thread_name":
            tid = int(e.get("tid", 0))
            if tid >= act.FIRST_TENSOR_LANE and isinstance(args.get("name"), str):
                lane = args["name"]
                if not lane.startswith("shared lane "):
                    self._lane_tensor[tid] = self.t.tensors.code(lane)
        elif name == "process_name" and isinstance(args.get("name"), str):
            text = args["name"]
            if "(" in text and text.endswith(")"):
                self.host = text[text.index("(") + 1 : -1]
        elif name == act.TRACE_END:
            self.trace_end = dict(args)
