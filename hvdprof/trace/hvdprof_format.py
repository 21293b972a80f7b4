"""Streaming parser of hvdprof's own per-rank timeline files into columns.

hvdprof's writer emits one event per line, so a file is read in blocks of whole lines:
each block is parsed by orjson as one array (a corrupt block falls back to line by line,
so one bad line costs one line), and each event is appended to plain Python lists of
column values, never kept as a dict. The parser keeps its state (lanes, open ops, the
occurrence count of every tensor) between blocks, which is what lets
:meth:`hvdprof.analysis.Run.refresh` read only the bytes appended since the last read.
"""

from __future__ import annotations

import itertools
import operator
import re
from typing import Any

import msgspec
import numpy as np
import orjson

from hvdprof.common import activities as act
from hvdprof.trace.columns import Columns, Interner, Tables
from hvdprof.trace.model import (
    MARK_COLUMNS,
    NOTICE_NAMES,
    PHASE_CYCLE,
    PHASE_NEGOTIATE,
    PHASE_OP,
    PHASE_OTHER,
    SLICE_COLUMNS,
    AutotuneSample,
    Notice,
    ParamsChange,
    Problem,
    classify,
    stall_record,
)

_NO_CTX = (-1, -1, -1, -1, 0, -1, -1, -1, -1, -1)
_READY_LINE = b'{"name":"' + act.READY_PREFIX.encode()
#: a whole READY instant line as hvdprof's renderer writes it (no args)
_READY_RE = re.compile(
    rb'\{"name":"' + re.escape(act.READY_PREFIX.encode()) + rb'\d+","ph":"i"[^\n]*\n'
)


class _OpArgs(msgspec.Struct):
    """The args of an ``<OP>``/``NEGOTIATE_*`` slice that the columns keep (others ignored)."""

    tensor: str | None = None
    bytes: int = -1
    group: int = -1
    group_tensors: int = 0
    group_bytes: int = -1
    group_buffer_bytes: int = -1
    backend: str | None = None
    dtype: str | None = None
    cached: bool | None = None
    ready_us: dict[str, float] | None = None
    process_set: int = 0


class _X(msgspec.Struct, tag_field="ph", tag="X"):
    name: str
    ts: float
    dur: float = 0.0
    tid: int = 0
    args: _OpArgs | None = None


class _Instant(msgspec.Struct, tag_field="ph", tag="i"):
    name: str
    ts: float
    tid: int = 0
    args: dict[str, Any] | None = None


class _InstantUpper(_Instant, tag="I"):
    pass


class _Counter(msgspec.Struct, tag_field="ph", tag="C"):
    name: str
    ts: float
    args: dict[str, Any] | None = None


class _Meta(msgspec.Struct, tag_field="ph", tag="M"):
    name: str
    tid: int = 0
    args: dict[str, Any] | None = None


#: Decodes a block of hvdprof's events straight into typed structs (no dict per event,
#: unknown keys skipped in C): about twice as fast as orjson into dicts, and the columns
#: are then read with ``attrgetter``. Anything it does not expect (another ``ph``, a string
#: where a number belongs) fails the block, which is then read line by line.
_DECODER = msgspec.json.Decoder(list[_X | _Instant | _InstantUpper | _Counter | _Meta])
_PH = {_Instant: "i", _InstantUpper: "I", _Counter: "C", _Meta: "M"}
_NO_ARGS = _OpArgs()
_NO_READY: dict[str, float] = {}
_READY_NAME = act.READY_PREFIX
_NAME = operator.attrgetter("name")
_TID = operator.attrgetter("tid")
_TS = operator.attrgetter("ts")
_DUR = operator.attrgetter("dur")
_TENSOR = operator.attrgetter("tensor")
_PROCESS_SET = operator.attrgetter("process_set")


def set_tensor(name: str | None, process_set: Any) -> str | None:
    """A tensor's name as the analysis keys it: an op of a process set other than the
    global one is its own tensor (``grad@set1``), since each set names its ops apart and
    its waits are read among its members only."""
    if name is None or not process_set:
        return name
    return f"{name}@set{int(process_set)}"


_CACHED_ARG = operator.attrgetter("cached")
_MINUS_ONES = itertools.repeat(-1)
_CACHED = {True: 1, False: 0, None: -1}


def _is_ready(e: Any) -> bool:
    """A READY instant: it repeats the negotiate slice's ``ready_us`` args (not needed)."""
    return type(e) is _Instant and e.name.startswith(_READY_NAME) and not e.args


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
        self._lane_occ: dict[int, int] = {}  # tid -> occurrence of its last op
        self._after_negotiate: dict[int, bool] = {}  # tid -> the next op continues it
        self._name_info: dict[str, tuple[int, int, int]] = {}
        self._reset_block()

    # --- state, for continuing elsewhere -----------------------------------------------------

    def export_state(self) -> dict[str, Any]:
        """Where this parser stands (lanes, open ops, occurrence counts), JSON-safe and by
        name rather than code, so a cache file or another process can continue the file
        from where this one stopped (:meth:`import_state`)."""
        t = self.t

        def name(table: Interner, code: int) -> str | None:
            return table.items[code] if code >= 0 else None

        return {
            "started": self.started,
            "closed": self.closed,
            "host": self.host,
            "trace_end": self.trace_end,
            "events": self.events,
            "lane_tensor": [[tid, name(t.tensors, c)] for tid, c in self._lane_tensor.items()],
            "ctx": [
                [
                    tid,
                    name(t.tensors, c[0]),
                    *c[1:7],
                    name(t.backends, c[7]),
                    name(t.dtypes, c[8]),
                    c[9],
                ]
                for tid, c in self._ctx.items()
            ],
            "occ": [[name(t.tensors, c), n] for c, n in self._occ.items()],
            "lane_occ": [[tid, n] for tid, n in self._lane_occ.items()],
            "after_negotiate": [[tid, v] for tid, v in self._after_negotiate.items()],
        }

    def import_state(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`export_state`'s description, codes re-made in our tables."""
        t = self.t

        def code(table: Interner, name: str | None) -> int:
            return -1 if name is None else table.code(name)

        self.started = bool(state["started"])
        self.closed = bool(state["closed"])
        self.host = state["host"]
        self.trace_end = state["trace_end"]
        self.events = int(state["events"])
        self._lane_tensor = {int(tid): code(t.tensors, n) for tid, n in state["lane_tensor"]}
        self._ctx = {
            int(c[0]): (
                code(t.tensors, c[1]),
                *map(int, c[2:8]),
                code(t.backends, c[8]),
                code(t.dtypes, c[9]),
                int(c[10]),
            )
            for c in state["ctx"]
        }
        self._occ = {code(t.tensors, n): int(k) for n, k in state["occ"]}
        self._lane_occ = {int(tid): int(n) for tid, n in state["lane_occ"]}
        self._after_negotiate = {int(tid): bool(v) for tid, v in state["after_negotiate"]}

    # --- block handling -------------------------------------------------------------------

    def _reset_block(self) -> None:
        self._s: dict[str, list[Any]] = {k: [] for k in SLICE_COLUMNS}
        self._m: dict[str, list[Any]] = {k: [] for k in MARK_COLUMNS}

    def _flush_block(self) -> None:
        s = self._s
        n = len(s["rank"])
        if n:
            self.cols.slice_chunks.append(self._arrays(s, SLICE_COLUMNS, "slices"))
            self.cols.rows += n
        if self._m["tensor"]:
            marks = self._arrays(self._m, MARK_COLUMNS, "readiness times")
            if len(marks["tensor"]):
                self.cols.mark_chunks.append(marks)
        self._reset_block()

    def _arrays(
        self, rows: dict[str, list[Any]], spec: dict[str, Any], what: str
    ) -> dict[str, np.ndarray]:
        """The block's columns; a row holding a number its column cannot (a size of 2**70,
        a rank of 2**40) is left out with a problem, never an overflow."""
        try:
            return {k: np.asarray(v, dtype=spec[k]) for k, v in rows.items()}
        except (OverflowError, ValueError, TypeError):
            pass
        n = len(next(iter(rows.values())))
        ok = np.ones(n, bool)
        for k, values in rows.items():
            dt = np.dtype(spec[k])
            if dt.kind in "iu":
                info = np.iinfo(dt)
                fits = [
                    isinstance(v, int | np.integer) and info.min <= v <= info.max for v in values
                ]
            else:
                fits = [_finite(v) for v in values]
            ok &= np.array(fits, bool)
        keep = np.flatnonzero(ok).tolist()
        self.problems.append(
            Problem(self.path, "", f"{n - len(keep)} {what} with out-of-range numbers left out")
        )
        if what == "slices":  # marks point at slice rows of this block: keep them aligned
            row0 = self.cols.rows
            new_row = np.full(n, -1, np.int64)
            new_row[keep] = np.arange(len(keep))
            m = self._m
            m["slice"] = [
                int(new_row[r - row0]) + row0
                if 0 <= r - row0 < n and new_row[r - row0] >= 0
                else -1
                for r in m["slice"]
            ]
        return {k: np.asarray([v[i] for i in keep], dtype=spec[k]) for k, v in rows.items()}

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
                reason = (
                    "a JSON object, not hvdprof's per-rank array (a merged or torch.profiler "
                    "trace?): analyse the timeline directory instead"
                    if body.startswith(b"{")
                    else "not a JSON array: not an hvdprof timeline"
                )
                self.problems.append(Problem(self.path, "line 1", reason))
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
        # READY instants repeat the negotiate slice's ready_us args: drop them unparsed
        ready_lines = body.count(_READY_LINE)
        lean = _READY_RE.sub(b"", body + b"\n") if ready_lines else body
        try:
            events = _DECODER.decode(b"[" + lean.rstrip().rstrip(b",") + b"]") if lean else []
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            events = None  # (nested too deep for msgspec: orjson, line by line, says so)
        if events is not None and self._events_fast(events):
            self.events += len(events) + ready_lines
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
            self._events_slow([event], line + offset)

    # --- events ---------------------------------------------------------------------------

    def _info(self, name: str) -> tuple[int, int, int]:
        info = self._name_info.get(name)
        if info is None:
            phase, op = classify(name)
            info = self._name_info[name] = (phase, op, self.t.names.code(name))
        return info

    def _events_fast(self, events: list[Any]) -> bool:
        """Columns of a whole block at once; False (nothing changed) if anything is odd.

        ``events`` are the typed structs of :data:`_DECODER`. Only ``<OP>`` and
        ``NEGOTIATE_*`` slices are looked at one by one (for their args); the phases inside
        an op take the op's tensor, sizes and group from the last op slice on their lane,
        filled forward with numpy.
        """
        rest = [e for e in events if type(e) is not _X and not _is_ready(e)]
        if rest and not self._others(rest):
            return False
        try:
            xs = [e for e in events if type(e) is _X]
            n = len(xs)
            names = list(map(_NAME, xs))
            for name in set(names):
                if name not in self._name_info:
                    self._info(name)
            info = self._name_info
            code_of = {k: v[2] for k, v in info.items()}
            name_code = np.fromiter(map(code_of.__getitem__, names), np.int32, n)
            tid = np.fromiter(map(_TID, xs), np.int64, n)
            start = np.fromiter(map(_TS, xs), np.float64, n)
            dur = np.fromiter(map(_DUR, xs), np.float64, n)
            phase_tab = np.full(len(self.t.names.items), PHASE_OTHER, np.int8)
            op_tab = np.full(len(self.t.names.items), -1, np.int8)
            for ph_, op_, code_ in info.values():
                phase_tab[code_] = ph_
                op_tab[code_] = op_
            phase = phase_tab[name_code]
            op = op_tab[name_code]
            heads = np.flatnonzero((phase == PHASE_OP) | (phase == PHASE_NEGOTIATE))
            args = [xs[i].args or _NO_ARGS for i in heads.tolist()]
            tnames = list(map(_TENSOR, args))
            if any(map(_PROCESS_SET, args)):
                tnames = [set_tensor(t, a.process_set) for t, a in zip(tnames, args, strict=True)]
            tensors = self.t.tensors
            for t in set(tnames):
                if t is not None:
                    tensors.code(t)
            head_tensor = np.fromiter(
                map(tensors.index.get, tnames, _MINUS_ONES), np.int64, len(tnames)
            )
            if (head_tensor < 0).any():  # no "tensor" arg: the lane's name
                lane_tensor = self._lane_tensor
                for j in np.flatnonzero(head_tensor < 0).tolist():
                    head_tensor[j] = lane_tensor.get(int(tid[heads[j]]), -1)
            is_op = phase[heads] == PHASE_OP
            op_j = np.flatnonzero(is_op)
            neg_j = np.flatnonzero(~is_op)
            op_args = [args[j] for j in op_j.tolist()]
            neg_args = [args[j] for j in neg_j.tolist()]
            m = len(heads)
            k = len(op_args)

            def field(name: str, default: int) -> np.ndarray:
                out = np.full(m, default, np.int64)
                out[op_j] = np.fromiter(map(operator.attrgetter(name), op_args), np.int64, k)
                return out

            def coded(name: str, table: Interner) -> np.ndarray:
                values = list(map(operator.attrgetter(name), op_args))
                for v in set(values):
                    if v is not None:
                        table.code(v)
                out = np.full(m, -1, np.int64)
                out[op_j] = np.fromiter(map(table.index.get, values, _MINUS_ONES), np.int64, k)
                return out

            h_bytes = field("bytes", -1)
            h_group = field("group", -1)
            h_gt = field("group_tensors", 0)
            h_gb = field("group_bytes", -1)
            h_bb = field("group_buffer_bytes", -1)
            h_backend = coded("backend", self.t.backends)
            h_dtype = coded("dtype", self.t.dtypes)
            h_cached = np.fromiter(map(_CACHED.__getitem__, map(_CACHED_ARG, args)), np.int64, m)
            ready = [a.ready_us or _NO_READY for a in neg_args]
            lens = np.fromiter(map(len, ready), np.int64, len(ready))
            total = int(lens.sum())
            marks = (
                np.repeat(neg_j, lens),
                np.fromiter(map(int, itertools.chain.from_iterable(ready)), np.int32, total),
                np.fromiter(
                    itertools.chain.from_iterable(map(dict.values, ready)), np.float64, total
                ),
            )
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError):
            return False
        self._commit_fast(
            tid,
            name_code,
            phase,
            op,
            start,
            dur,
            heads,
            head_tensor,
            (h_bytes, h_group, h_gt, h_gb, h_bb, h_backend, h_dtype, h_cached),
            marks,
        )
        return True

    def _others(self, events: list[Any]) -> bool:
        """Counters, instants and metadata of a block (few); all or nothing."""
        cols = self.cols
        saved = (
            len(cols.samples),
            len(cols.params),
            len(cols.stalls),
            {k: len(v) for k, v in cols.counters.items()},
            len(cols.notices),
            dict(self._lane_tensor),
            self.host,
            self.trace_end,
        )
        try:
            for e in events:
                self._other(msgspec.structs.asdict(e) | {"ph": _PH[type(e)]})
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError):
            del cols.samples[saved[0] :]
            del cols.params[saved[1] :]
            del cols.stalls[saved[2] :]
            del cols.notices[saved[4] :]
            for key in list(cols.counters):
                if key in saved[3]:
                    del cols.counters[key][saved[3][key] :]
                else:
                    del cols.counters[key]
            self._lane_tensor, self.host, self.trace_end = saved[5], saved[6], saved[7]
            return False
        return True

    def _other(self, e: dict[str, Any]) -> None:
        """A counter, instant or metadata event (not a slice)."""
        ph = e["ph"]
        if ph == "C":
            a = e.get("args") or {}
            value = a.get("value")
            if value is None and a:
                value = next(iter(a.values()))
            self.cols.counters.setdefault(e["name"], []).append(
                (self.rank, float(e["ts"]), float(value))
            )
        elif ph == "i" or ph == "I":
            self._instant(e)
        elif ph == "M":
            self._meta(e)
        elif not isinstance(ph, str):
            raise TypeError("'ph' is not a string")

    def _commit_fast(
        self,
        tid: np.ndarray,
        name_code: np.ndarray,
        phase: np.ndarray,
        op: np.ndarray,
        start: np.ndarray,
        dur: np.ndarray,
        heads: np.ndarray,
        head_tensor: np.ndarray,
        head_cols: tuple[np.ndarray, ...],
        marks: tuple[np.ndarray, np.ndarray, np.ndarray],
    ) -> None:
        """One block's rows: each head row's context (tensor, op, sizes, fusion group,
        occurrence), every other row its lane's last head's, then the columns."""
        n = len(tid)
        if n == 0:
            return
        # context columns: tensor, op, bytes, group, gt, gb, bb, backend, dtype, cached, occ
        ctx = np.full((n, 11), -1, dtype=np.int64)
        ctx[:, 4] = 0
        ctx[heads] = self._head_context(tid, phase, op, heads, head_tensor, head_cols)
        self._fill_context(ctx, tid, phase, heads)
        op_col = np.where(op >= 0, op, ctx[:, 1])
        row0 = self.cols.rows
        self.cols.slice_chunks.append(
            {
                "rank": np.full(n, self.rank, np.int32),
                "tensor": ctx[:, 0].astype(np.int32),
                "name": name_code,
                "phase": phase,
                "op": op_col.astype(np.int8),
                "start_us": start,
                "dur_us": dur,
                "bytes": ctx[:, 2],
                "group": ctx[:, 3],
                "group_tensors": ctx[:, 4].astype(np.int32),
                "group_bytes": ctx[:, 5],
                "buffer_bytes": ctx[:, 6],
                "backend": ctx[:, 7].astype(np.int16),
                "dtype": ctx[:, 8].astype(np.int16),
                "cached": ctx[:, 9].astype(np.int8),
                "occurrence": ctx[:, 10].astype(np.int32),
            }
        )
        self.cols.rows += n
        j, ready_rank, ready_ts = marks
        if len(j):
            self.cols.mark_chunks.append(
                {
                    "observer": np.full(len(j), self.rank, np.int32),
                    "tensor": head_tensor[j].astype(np.int32),
                    "ts_us": ready_ts,
                    "ready_rank": ready_rank,
                    "slice": heads[j] + row0,
                }
            )

    def _head_context(
        self,
        tid: np.ndarray,
        phase: np.ndarray,
        op: np.ndarray,
        heads: np.ndarray,
        head_tensor: np.ndarray,
        head_cols: tuple[np.ndarray, ...],
    ) -> np.ndarray:
        """The context columns of the head rows (see :meth:`_commit_fast`)."""
        is_neg = phase[heads] == PHASE_NEGOTIATE
        hc = np.empty((len(heads), 11), dtype=np.int64)
        hc[:, 0] = head_tensor
        hc[:, 1] = op[heads]
        for j, col in enumerate(head_cols):
            hc[:, 2 + j] = col
        # negotiation rows carry no sizes; occurrence is counted per tensor below
        hc[is_neg, 2:9] = np.array([-1, -1, 0, -1, -1, -1, -1])
        hc[:, 10] = self._head_occurrences(tid, heads, head_tensor, is_neg)
        return hc

    def _head_occurrences(
        self, tid: np.ndarray, heads: np.ndarray, head_tensor: np.ndarray, is_neg: np.ndarray
    ) -> np.ndarray:
        """Each head's occurrence of its tensor (the n-th negotiation), counted on from
        the previous blocks: an op starts a new occurrence unless it directly follows its
        negotiation, whose occurrence it takes."""
        prev_neg = np.zeros(len(heads), dtype=bool)
        order_h = np.lexsort((heads, tid[heads]))
        same_tid = tid[heads][order_h][1:] == tid[heads][order_h][:-1]
        follows = np.zeros(len(heads), dtype=bool)
        follows[1:] = same_tid & is_neg[order_h][:-1]
        prev_neg[order_h] = follows
        for lane, was_neg in self._after_negotiate.items():  # carried from the last block
            if was_neg:
                first = np.flatnonzero(tid[heads] == lane)
                if len(first) and not is_neg[first[0]]:
                    prev_neg[first[0]] = True
        starts_occ = is_neg | ~prev_neg
        occ = np.full(len(heads), -1, dtype=np.int64)
        carried = np.flatnonzero(prev_neg & ~follows[np.argsort(order_h)])
        for i in carried.tolist():  # an op whose negotiation was in the previous block
            occ[i] = self._occ.get(int(head_tensor[i]), 0) - 1
        st = np.flatnonzero(starts_occ)
        if len(st):
            t_of = head_tensor[st]
            order = np.lexsort((heads[st], t_of))
            t_sorted = t_of[order]
            new_group = np.ones(len(st), dtype=bool)
            new_group[1:] = t_sorted[1:] != t_sorted[:-1]
            group_start = np.flatnonzero(new_group)
            counts = np.arange(len(st)) - np.repeat(
                group_start, np.diff(np.append(group_start, len(st)))
            )
            group_len = np.diff(np.append(group_start, len(st)))
            seen = self._occ
            carry = np.repeat(
                np.array([seen.get(t, 0) for t in t_sorted[group_start].tolist()], np.int64),
                group_len,
            )
            occ_sorted = carry + counts
            occ[st[order]] = occ_sorted
            last = np.append(new_group[1:], True)
            for t, value in zip(t_sorted[last].tolist(), occ_sorted[last].tolist(), strict=True):
                self._occ[int(t)] = int(value) + 1
        chained = np.flatnonzero(follows)  # an op takes its negotiation's occurrence
        occ[order_h[chained]] = occ[order_h[chained - 1]]
        return occ

    def _fill_context(
        self, ctx: np.ndarray, tid: np.ndarray, phase: np.ndarray, heads: np.ndarray
    ) -> None:
        """Forward fill per lane: each row takes the context of the last head on its lane
        (rows before any head: the previous block's); remembers each lane's last one."""
        n = len(tid)
        src = np.full(n, -1, dtype=np.int64)
        src[heads] = heads
        order = np.lexsort((np.arange(n), tid))
        t_sorted = tid[order]
        s_sorted = src[order]
        new_lane = np.ones(n, dtype=bool)
        new_lane[1:] = t_sorted[1:] != t_sorted[:-1]
        lane_id = np.cumsum(new_lane) - 1
        shifted = np.where(s_sorted >= 0, s_sorted, -1) + lane_id * (n + 1) + 1
        shifted = np.maximum.accumulate(np.where(s_sorted >= 0, shifted, lane_id * (n + 1)))
        filled = shifted - lane_id * (n + 1) - 1  # -1: no head yet in this block
        src[order] = filled
        rows = np.flatnonzero((src >= 0) & (src != np.arange(n)))
        ctx[rows] = ctx[src[rows]]
        # rows before any head on their lane: carry from the previous block
        orphans = np.flatnonzero(src < 0)
        cycle = phase == PHASE_CYCLE
        for i in orphans.tolist():
            if cycle[i]:
                continue
            lane = int(tid[i])
            carried = self._ctx.get(lane)
            if carried is not None:
                ctx[i, :10] = carried
                ctx[i, 10] = self._lane_occ.get(lane, -1)
            else:
                ctx[i, 0] = self._lane_tensor.get(lane, -1)
        ctx[cycle] = np.array([-1, -1, -1, -1, 0, -1, -1, -1, -1, -1, -1])
        # remember the last op context per lane for the next block
        last_rows = order[np.append(new_lane[1:], True)]
        for i in last_rows.tolist():
            if src[i] >= 0 and not cycle[i]:
                self._ctx[int(tid[i])] = tuple(int(x) for x in ctx[i, :10])
                self._lane_occ[int(tid[i])] = int(ctx[i, 10])
            self._after_negotiate[int(tid[i])] = bool(phase[i] == PHASE_NEGOTIATE)

    def _events_slow(self, events: list[Any], line: int) -> None:
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
                else:
                    self._other(e)
                self.events += 1
            except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
                what = (
                    "not a JSON object"
                    if not isinstance(e, dict)
                    else f"unusable event ({type(exc).__name__}: {str(exc)[:120]})"
                )
                self.problems.append(Problem(self.path, f"line {line + i}", what))

    def _lane_ctx(self, tid: int) -> tuple[int, ...]:
        tensor = self._lane_tensor.get(tid, -1)
        return (tensor, -1, -1, -1, 0, -1, -1, -1, -1, -1)

    def _op_slice(self, e: dict[str, Any], tid: int, phase: int, op: int, start: float) -> tuple:
        args = e.get("args") or {}
        tname = args.get("tensor")
        if isinstance(tname, str) and args.get("process_set"):
            tname = set_tensor(tname, args.get("process_set"))
        tensor = (
            self.t.tensors.code(tname) if isinstance(tname, str) else self._lane_tensor.get(tid, -1)
        )
        cached = args.get("cached")
        cached_code = -1 if cached is None else int(bool(cached))
        if phase == PHASE_NEGOTIATE:
            self._occ[tensor] = self._occ.get(tensor, 0) + 1
            self._lane_occ[tid] = self._occ[tensor] - 1
            self._after_negotiate[tid] = True
            ready = args.get("ready_us")
            if isinstance(ready, dict):
                row = self.cols.rows + len(self._s["rank"])
                m = self._m
                for r, ts in ready.items():
                    # both parsed before any column grows: a bad rank must not leave the
                    # columns of different lengths
                    t_us, ready_rank = float(ts), int(r)
                    m["observer"].append(self.rank)
                    m["tensor"].append(tensor)
                    m["ts_us"].append(t_us)
                    m["ready_rank"].append(ready_rank)
                    m["slice"].append(row)
            return (tensor, op, -1, -1, 0, -1, -1, -1, -1, cached_code)
        if not self._after_negotiate.pop(tid, False):
            self._occ[tensor] = self._occ.get(tensor, 0) + 1
        self._lane_occ[tid] = self._occ.get(tensor, 0) - 1
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
                    role=str(args.get("role", "")),
                    ratio_to_default=_number(args.get("ratio_to_default")),
                    incumbent=_mapping(args.get("incumbent")),
                    recommendation=_mapping(args.get("recommendation")),
                    comparison_noise=_number(args.get("comparison_noise")),
                    decision=args["decision"] if isinstance(args.get("decision"), str) else None,
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
        elif name in NOTICE_NAMES:
            self.cols.notices.append(
                Notice(name=str(name), ts_us=float(e["ts"]), rank=self.rank, args=dict(args))
            )
        elif name == act.STALL:
            self.cols.stalls.append(stall_record(float(e["ts"]), args, self.rank))
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


def _finite(value: Any) -> bool:
    """A number a float column holds (not 1e400 as an int)."""
    try:
        return isinstance(value, int | float | np.number) and abs(float(value)) < float("inf")
    except OverflowError:
        return False


def _number(value: Any) -> float | None:
    """A finite number from an event's args, else None (absent, a string, NaN)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if value == value and abs(value) != float("inf") else None


def _mapping(value: Any) -> dict[str, Any] | None:
    return dict(value) if isinstance(value, dict) else None
